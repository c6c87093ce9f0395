"""Draft acceptance: how well a draft (student) model would do in speculative decoding."""

from __future__ import annotations

from typing import Any

import torch

from ._base import Probe
from ._common import check_texts, chunks, encode, forward_alike, logger, model_device, pad_batch
from ._errors import ProbeDataError

__all__ = ["DraftAcceptance", "acceptance_rate", "expected_tokens_per_call"]


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


class DraftAcceptance(Probe):
    """Keys ``draft.acceptance`` (α) and ``draft.tokens_per_call``. Cost: two forward passes.

    α = E[Σ_v min(p_teacher(v|x), q_draft(v|x))] over the non-padding positions of held-out
    texts (teacher-forced, token-weighted); the model given to ``measure`` is the draft
    (student) and ``teacher`` the verifier. ``draft.tokens_per_call`` is the expected number of
    tokens per verifier call for draft length ``gamma``.
    """

    name = "draft"
    cost_rank = 2
    min_examples = 2

    def __init__(
        self,
        teacher: Any,
        prompts_or_texts: list[str],
        tokenizer: Any,
        *,
        gamma: int = 4,
        every: int | None = 50,
        on_evaluate: bool = True,
        max_length: int = 128,
        batch_size: int = 4,
    ) -> None:
        self._init_schedule(every, on_evaluate)
        if gamma < 1 or max_length < 1 or batch_size < 1:
            raise ValueError("gamma, max_length and batch_size must be >= 1")
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

    def _measure(self, model: Any, *, max_examples: int | None) -> dict[str, float]:
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
