"""Plumbing shared by the probes: the safety wrapper, padding, forward passes, greedy decoding.

Every probe tokenises with the tokenizer it was given and pads *itself* (``pad_batch``) rather
than through the tokenizer, so it never changes the user's ``tokenizer.padding_side`` and padding
is always described by an explicit attention mask (pad id may equal eos, as in SmolLM2).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from ._errors import ProbeDataError

__all__ = [
    "logger",
    "probe_mode",
    "RNGState",
    "pad_batch",
    "check_texts",
    "chunks",
    "subsample",
    "encode",
    "pad_token_id",
    "eos_token_ids",
    "context_length",
    "model_device",
    "forward_logits",
    "Precision",
    "observe_precision",
    "precision_of",
    "forward_under",
    "forward_alike",
    "greedy_generate",
    "greedy_token_ids",
    "is_peft_model",
]

logger = logging.getLogger("actuator.agents")


class RNGState:
    """Python, NumPy and torch (CPU and initialised CUDA devices) random states, captured together."""

    def __init__(self) -> None:
        self.python = random.getstate()
        try:
            import numpy as np
        except ImportError:  # pragma: no cover - numpy ships with torch installs
            self.numpy = None
        else:
            self.numpy = np.random.get_state()
        self.torch = torch.get_rng_state()
        self.cuda = (
            torch.cuda.get_rng_state_all()
            if torch.cuda.is_available() and torch.cuda.is_initialized()
            else None
        )

    def restore(self) -> None:
        random.setstate(self.python)
        if self.numpy is not None:
            import numpy as np

            np.random.set_state(self.numpy)
        torch.set_rng_state(self.torch)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


@contextmanager
def probe_mode(*models: Any) -> Iterator[None]:
    """Run a block as a side-effect-free measurement of ``models``.

    Inside: ``torch.no_grad()`` and every module in eval mode. On exit (also on error): each
    submodule's own ``training`` flag is put back exactly (a model may deliberately keep some
    submodules in eval mode, which ``model.train()`` would undo) and the Python, NumPy and torch
    RNG states are restored, so dropout masks and data shuffling after the probe are the ones
    the run would have drawn without it. Nesting is harmless.
    """
    seen: set[int] = set()
    modes: list[tuple[Any, bool]] = []
    for model in models:
        if model is None or not hasattr(model, "modules"):
            continue
        for module in model.modules():
            if id(module) not in seen:
                seen.add(id(module))
                modes.append((module, module.training))
    rng = RNGState()
    try:
        for model in models:
            if model is not None and hasattr(model, "eval"):
                model.eval()
        with torch.no_grad():
            yield
    finally:
        for module, mode in modes:
            module.training = mode
        rng.restore()


def check_texts(prompts: Any, what: str = "prompts") -> list[str]:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(f"{what} must be a list of strings, got {type(prompts).__name__}")
    prompts = list(prompts)
    if not prompts:
        raise ProbeDataError(f"{what} is empty")
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str) or not prompt.strip():
            raise ProbeDataError(f"{what}[{i}] must be a non-empty string, got {prompt!r}")
    return prompts


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def subsample(n: int, k: int | None) -> list[int]:
    """``k`` indices out of ``range(n)``, evenly spaced and deterministic.

    Deterministic on purpose: the same subset at every probe step keeps successive values
    comparable (a controller acts on differences), and no RNG is consumed.
    """
    if k is None or k >= n:
        return list(range(n))
    return [(i * n) // k for i in range(max(k, 0))]


def encode(tokenizer: Any, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[int]]:
    if not texts:
        return []
    encoded = tokenizer(list(texts), add_special_tokens=add_special_tokens, verbose=False)
    return [list(ids) for ids in encoded["input_ids"]]


def pad_token_id(tokenizer: Any) -> int:
    for attr in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, attr, None)
        if isinstance(value, int):
            return value
    return 0


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """End-of-answer ids: the tokenizer's eos plus the model's generation config eos (chat models)."""
    ids: list[int] = []
    candidates: list[Any] = [getattr(tokenizer, "eos_token_id", None)]
    generation_config = getattr(model, "generation_config", None)
    candidates.append(getattr(generation_config, "eos_token_id", None))
    for value in candidates:
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, int) and item not in ids:
                ids.append(item)
    return ids


def pad_batch(
    sequences: Sequence[Sequence[int]], pad_id: int, *, side: str = "right", device: Any = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad token-id lists into ``(input_ids, attention_mask)`` long tensors."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if not seq:
            continue
        values = torch.tensor(list(seq), dtype=torch.long)
        if side == "right":
            ids[row, : len(seq)] = values
            mask[row, : len(seq)] = 1
        else:
            ids[row, width - len(seq) :] = values
            mask[row, width - len(seq) :] = 1
    if device is not None:
        ids, mask = ids.to(device), mask.to(device)
    return ids, mask


def _text_config(model: Any) -> Any:
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        try:
            return config.get_text_config()
        except Exception:  # pragma: no cover - exotic configs
            return config
    return config


def context_length(model: Any, tokenizer: Any = None, default: int = 2048) -> int:
    """The number of positions the model (and tokenizer) accept; ``default`` when neither says."""
    candidates: list[int] = []
    config = _text_config(model)
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            candidates.append(value)
            break
    value = getattr(tokenizer, "model_max_length", None)
    if isinstance(value, int) and 0 < value < 1_000_000:  # HF uses ~1e30 for "unknown"
        candidates.append(value)
    return min(candidates) if candidates else default


def model_device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError, TypeError):
        return torch.device("cpu")


def forward_logits(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Float32 next-token logits ``[batch, time, vocab]`` of any causal LM (or ModelOutput-like)."""
    output = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    logits = getattr(output, "logits", None)
    if logits is None:
        logits = output[0]
    return logits.float()


@dataclass(frozen=True)
class Precision:
    """The autocast state a forward pass ran under (``enabled`` False: none)."""

    device_type: str
    enabled: bool
    dtype: torch.dtype

    @classmethod
    def current(cls, device_type: str) -> Precision:
        if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4
            return cls(device_type, torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type))
        if device_type == "cpu":  # pragma: no cover - older torch
            return cls("cpu", torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype())
        return cls(device_type, torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype())  # pragma: no cover

    def context(self, device_type: str | None = None) -> Any:
        """The same autocast, entered explicitly (on ``device_type`` if the other model lives elsewhere)."""
        return torch.autocast(device_type or self.device_type, dtype=self.dtype, enabled=self.enabled)


@contextmanager
def observe_precision(model: Any) -> Iterator[list[Precision]]:
    """Inside, the first forward of ``model`` records (in the yielded list) the autocast its
    layers run under: whatever its forward enters itself (accelerate's mixed-precision wrapper
    under ``bf16=True``, a user's wrapper) and whatever surrounds the call."""
    seen: list[Precision] = []
    device_type = model_device(model).type

    def record(module: Any, args: Any) -> None:
        if not seen:
            seen.append(Precision.current(device_type))

    children = list(model.children()) if hasattr(model, "children") else []
    handles = [child.register_forward_pre_hook(record) for child in children]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()
        if not seen:  # no submodule ran (a bare function): the ambient state is all there is
            seen.append(Precision.current(device_type))


def precision_of(model: Any) -> Precision:
    """The autocast ``model``'s forward runs under, from a one-token forward (no grad)."""
    ids = torch.zeros((1, 1), dtype=torch.long, device=model_device(model))
    with torch.no_grad(), observe_precision(model) as seen:
        model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    return seen[0]


def forward_under(precision: Precision, model: Any, input_ids: torch.Tensor,
                  attention_mask: torch.Tensor) -> torch.Tensor:
    """Float32 logits of ``model`` (moved to its device and back) under ``precision``'s autocast."""
    device = model_device(model)
    with precision.context(device.type):
        logits = forward_logits(model, input_ids.to(device), attention_mask.to(device))
    return logits.to(input_ids.device)


def forward_alike(model: Any, other: Any, input_ids: torch.Tensor,
                  attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 logits of ``model`` and of ``other`` (a reference, a teacher) on the same batch,
    ``other`` under the autocast ``model``'s forward ran under: compared like with like, so
    precision alone never reads as a difference."""
    with observe_precision(model) as seen:
        logits = forward_logits(model, input_ids, attention_mask)
    return logits, forward_under(seen[0], other, input_ids, attention_mask)


def is_peft_model(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def _cut_at_eos(tokens: list[int], eos: Sequence[int]) -> list[int]:
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[:i]
    return tokens


def greedy_token_ids(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    batch_size: int,
    keep_eos: bool = False,
) -> list[list[int]]:
    """Greedy continuations of token-id prompts as token ids, cut at the first end token (kept
    with ``keep_eos``: "the answer ends here" is then a prediction like any other).

    Transformers models go through ``generate`` batched with left padding (it derives position
    ids from the attention mask). A bare module without ``generate`` gets a plain greedy loop,
    one prompt at a time so no padding is involved.
    """
    pad = pad_token_id(tokenizer)
    eos = eos_token_ids(model, tokenizer)
    device = model_device(model)

    def cut(tokens: list[int]) -> list[int]:
        kept = _cut_at_eos(tokens, eos)
        return tokens[: len(kept) + 1] if keep_eos and len(kept) < len(tokens) else kept

    answers: list[list[int]] = []
    if hasattr(model, "generate"):
        from transformers import GenerationConfig

        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            pad_token_id=pad,
            eos_token_id=eos or None,
        )
        for batch in chunks(prompts, batch_size):
            ids, mask = pad_batch(batch, pad, side="left", device=device)
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
            answers.extend(cut(row) for row in out[:, ids.shape[1] :].tolist())
        return answers
    for prompt in prompts:
        ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
        new: list[int] = []
        for _ in range(max_new_tokens):
            logits = forward_logits(model, ids, torch.ones_like(ids))
            token = int(logits[0, -1].argmax())
            new.append(token)
            if token in eos:
                break
            ids = torch.cat([ids, ids.new_tensor([[token]])], dim=1)
        answers.append(cut(new))
    return answers


def greedy_generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    batch_size: int,
) -> list[str]:
    """Greedy continuations of token-id prompts (:func:`greedy_token_ids`), decoded without
    special tokens and stripped."""
    return [
        tokenizer.decode(tokens, skip_special_tokens=True).strip()
        for tokens in greedy_token_ids(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size)
    ]
