"""Draft acceptance: how well a draft (student) model would do in speculative decoding.

Speculative sampling (Leviathan et al. 2023) verifies draft tokens against the *teacher's*
distribution on the sequences the decoding actually produces, and those are distributed as the
teacher's own samples (that is the method's guarantee). So α is measured by default on
continuations **sampled from the teacher at T = 1** from the held-out prompts, not on human text
(teacher-forced text is another distribution: a draft can fit it and still disagree with the
teacher where the teacher goes). The frozen teacher's samples and its probabilities on them are
drawn once, with a seeded RNG, and kept: every later measurement costs one draft forward pass.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from ..general import PROBE_TEXTS
from ._base import DefaultEvery, Probe
from ._common import (
    check_texts,
    chunks,
    encode,
    forward_alike,
    forward_logits,
    forward_under,
    logger,
    model_device,
    observe_precision,
    pad_batch,
)
from ._errors import ProbeDataError, ProbeSetupError
from ._registry import register

__all__ = ["DraftAcceptance", "acceptance_rate", "expected_tokens_per_call", "sample_continuations"]


def acceptance_rate(teacher_logits: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """``Σ_v min(p(v), q(v))`` per position: the chance a draft token is accepted.

    In speculative sampling a token drawn from the draft ``q`` is accepted with probability
    ``min(1, p/q)``; in expectation that is ``Σ_v min(p, q) = 1 − TV(p, q)`` (Leviathan et al.,
    2023). If vocabularies differ in size (padded embeddings), the common prefix is compared.
    """
    vocab = min(teacher_logits.shape[-1], draft_logits.shape[-1])
    p = torch.softmax(teacher_logits[..., :vocab], dim=-1)
    q = torch.softmax(draft_logits[..., :vocab], dim=-1)
    return torch.minimum(p, q).sum(-1)


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
    """Expected tokens produced per verifier call with draft length ``gamma``:
    ``(1 − α^(γ+1)) / (1 − α)``, which is ``γ + 1`` at ``α = 1``."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


@torch.no_grad()
def sample_continuations(model: Any, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """``prompt`` (B, k, no padding) followed by ``new_tokens`` tokens sampled at T = 1 from
    ``model`` (ancestral sampling, no top-k / top-p; torch's global RNG). Uses the model's KV
    cache when it returns one; any module whose output has ``.logits`` works."""
    seqs = prompt
    past: Any = None
    step_input = prompt
    for _ in range(new_tokens):
        try:
            out = model(input_ids=step_input, past_key_values=past, use_cache=True)
        except TypeError:  # a module without a cache interface: recompute the whole prefix
            out = model(input_ids=seqs)
        cache = getattr(out, "past_key_values", None)
        probs = torch.softmax(out.logits[:, -1].float(), dim=-1)
        nxt = torch.multinomial(probs, 1)
        seqs = torch.cat([seqs, nxt.to(seqs.dtype)], dim=1)
        past, step_input = (cache, nxt) if cache is not None else (None, seqs)
    return seqs


@register()
class DraftAcceptance(Probe):
    """Keys ``draft.acceptance`` (α) and ``draft.tokens_per_call``.

    α = E[Σ_v min(p_teacher(v|x), q_draft(v|x))] (= 1 − TV), token-weighted, where the model
    given to ``measure`` is the draft (student) and ``teacher`` the verifier, both at T = 1.
    ``draft.tokens_per_call`` is the expected number of tokens per verifier call for draft length
    ``gamma``: (1 − α^(γ+1)) / (1 − α) (Leviathan et al. 2023, eq. 1; i.i.d. acceptance).

    ``on="teacher"`` (default): each text, cut to its first ``prompt_tokens`` tokens, is a prompt
    the teacher continues by ``new_tokens`` tokens sampled at T = 1 (``seed``: the same
    continuations in every run); α is averaged over the positions that predict those
    continuation tokens, the first one included (speculative decoding drafts it from the prompt).
    The samples and the teacher's probabilities on them are drawn at the first measurement and
    kept (the teacher is frozen), so a measurement costs one draft forward pass (two when the
    draft runs under autocast: the teacher is then run under the same autocast on the same
    samples); a teacher that changes needs a new probe. ``on="text"``: the earlier, teacher-forced measurement over every
    non-padding position of the texts themselves.
    """

    name = "draft"
    cost_rank = 2
    min_examples = 2

    @classmethod
    def for_preset(cls, tokenizer: Any, *, reference: Any = None, teacher: Any = None) -> DraftAcceptance:
        if teacher is None:
            raise ProbeSetupError("draft: draft acceptance is measured against the teacher (verifier) model, which "
                                  "this trainer does not hold (a distillation trainer's teacher_model is taken); "
                                  "pass probes=[DraftAcceptance(teacher, texts, tokenizer)]")
        return cls(teacher, PROBE_TEXTS, tokenizer)

    def __init__(
        self,
        teacher: Any,
        prompts_or_texts: list[str],
        tokenizer: Any,
        *,
        gamma: int = 4,
        every: int | None = DefaultEvery(50),
        on_evaluate: bool = True,
        max_length: int = 128,
        batch_size: int = 4,
        on: Literal["teacher", "text"] = "teacher",
        prompt_tokens: int = 32,
        new_tokens: int = 32,
        seed: int = 0,
    ) -> None:
        self._init_schedule(every, on_evaluate)
        for field, value in (("gamma", gamma), ("max_length", max_length), ("batch_size", batch_size),
                             ("prompt_tokens", prompt_tokens), ("new_tokens", new_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DraftAcceptance: {field} must be an integer >= 1, got {value!r}")
        if on not in ("teacher", "text"):
            raise ValueError(f"DraftAcceptance: on must be 'teacher' or 'text', got {on!r}")
        self.on = on
        self.prompt_tokens = prompt_tokens
        self.new_tokens = new_tokens
        self.seed = int(seed)
        # per prompt: (prompt + teacher continuation ids, prompt length, teacher probs at the
        # positions that predict the continuation)
        self._samples: list[tuple[list[int], int, torch.Tensor]] | None = None
        if teacher is None:
            raise TypeError("DraftAcceptance needs the teacher (verifier) model")
        self.teacher = teacher
        self.tokenizer = tokenizer
        self.gamma = gamma
        self.batch_size = batch_size
        ids = [seq[:max_length] for seq in encode(tokenizer, check_texts(prompts_or_texts, "prompts_or_texts"))]
        self._ids = [seq for seq in ids if seq]
        if not self._ids:
            raise ProbeDataError("no text has a token: nothing to compare")
        self._warned_vocab = False

    @property
    def num_examples(self) -> int:
        return len(self._ids)

    def aux_models(self) -> tuple[Any, ...]:
        return (self.teacher,)

    def teacher_samples(self) -> list[tuple[list[int], int, torch.Tensor]]:
        """The teacher's continuations, drawn once (seeded; the global RNG is left untouched)."""
        if self._samples is None:
            device = model_device(self.teacher)
            samples = []
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                torch.manual_seed(self.seed)
                for seq in self._ids:
                    prompt = torch.tensor([seq[: self.prompt_tokens]], device=device)
                    ids = sample_continuations(self.teacher, prompt, self.new_tokens)
                    logits = forward_logits(self.teacher, ids, torch.ones_like(ids))
                    k = prompt.shape[1]
                    probs = torch.softmax(logits[0, k - 1: ids.shape[1] - 1], dim=-1).cpu()
                    samples.append((ids[0].tolist(), k, probs))
            self._samples = samples
        return self._samples

    def _measure(self, model: Any, *, max_examples: int | None) -> dict[str, float]:
        if self.on == "teacher":
            return self._measure_teacher_samples(model, max_examples)
        device = model_device(model)
        selected = [self._ids[i] for i in self._selection(len(self._ids), max_examples)]
        total, count = 0.0, 0
        for batch in chunks(selected, self.batch_size):
            ids, mask = pad_batch(batch, 0, side="right", device=device)
            draft_logits, teacher_logits = forward_alike(model, self.teacher, ids, mask)
            if teacher_logits.shape[-1] != draft_logits.shape[-1] and not self._warned_vocab:
                logger.warning(
                    "draft acceptance: teacher has %d logits, draft %d; comparing the common %d",
                    teacher_logits.shape[-1], draft_logits.shape[-1],
                    min(teacher_logits.shape[-1], draft_logits.shape[-1]),
                )
                self._warned_vocab = True
            accept = acceptance_rate(teacher_logits, draft_logits)
            keep = mask.bool()
            total += float(accept[keep].double().sum())
            count += int(keep.sum())
        alpha = min(max(total / count, 0.0), 1.0)
        return {"draft.acceptance": alpha, "draft.tokens_per_call": expected_tokens_per_call(alpha, self.gamma)}

    def _measure_teacher_samples(self, model: Any, max_examples: int | None) -> dict[str, float]:
        samples = self.teacher_samples()
        device = model_device(model)
        selected = [samples[i] for i in self._selection(len(samples), max_examples)]
        total, count = 0.0, 0
        for batch in chunks(selected, self.batch_size):
            ids, mask = pad_batch([s[0] for s in batch], 0, side="right", device=device)
            with observe_precision(model) as seen:
                draft_logits = forward_logits(model, ids, mask)
            if seen and seen[0].enabled:
                # The draft ran under autocast (mixed-precision training): compare like with like,
                # the teacher under the same autocast on the same samples, as on="text" does.
                teacher_logits = forward_under(seen[0], self.teacher, ids, mask)
                batch = [(seq, k, torch.softmax(teacher_logits[row, k - 1: len(seq) - 1], dim=-1).cpu())
                         for row, (seq, k, _) in enumerate(batch)]
            for row, (seq, k, p) in enumerate(batch):
                q_logits = draft_logits[row, k - 1: len(seq) - 1]
                vocab = min(p.shape[-1], q_logits.shape[-1])
                if p.shape[-1] != q_logits.shape[-1] and not self._warned_vocab:
                    logger.warning("draft acceptance: teacher has %d logits, draft %d; comparing the common %d",
                                   p.shape[-1], q_logits.shape[-1], vocab)
                    self._warned_vocab = True
                q = torch.softmax(q_logits[:, :vocab].float(), dim=-1).cpu()
                total += float(torch.minimum(p[:, :vocab], q).sum(-1).double().sum())
                count += q.shape[0]
        alpha = min(max(total / count, 0.0), 1.0)
        return {"draft.acceptance": alpha, "draft.tokens_per_call": expected_tokens_per_call(alpha, self.gamma)}
