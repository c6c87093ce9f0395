"""Perplexity of held-out text: token-weighted, padding excluded, sliding window for long texts."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from ..general import PROBE_TEXTS
from ._base import DefaultEvery, Probe
from ._common import chunks, context_length, encode, forward_logits, logger, model_device, pad_batch
from ._errors import ProbeDataError, ProbeDataNotFoundError
from ._registry import register

__all__ = ["Perplexity", "load_texts", "sliding_windows", "DEFAULT_MAX_WINDOW"]

# A window of the full 8k context of a 49k-vocabulary model materialises gigabytes of float32
# logits per sequence on CPU; by default windows stop here (pass max_length to go further).
DEFAULT_MAX_WINDOW = 2048


def load_texts(
    texts: Any, *, text_field: str = "text", file_split: Literal["paragraph", "line"] = "paragraph"
) -> list[str]:
    """Held-out documents from a list of strings, a text file or a ``datasets.Dataset``.

    A text file is split into documents at blank lines (``file_split="paragraph"``) or at every
    line (``"line"``); empty documents are dropped.
    """
    if isinstance(texts, (str, os.PathLike)):
        path = Path(texts)
        if not path.is_file():
            raise ProbeDataNotFoundError(f"held-out text file not found: {str(path)!r}")
        content = path.read_text(encoding="utf-8")
        if file_split == "paragraph":
            parts = re.split(r"\n[ \t]*\n", content)
        elif file_split == "line":
            parts = content.splitlines()
        else:
            raise ValueError(f"file_split must be 'paragraph' or 'line', got {file_split!r}")
        docs = [p.strip() for p in parts if p.strip()]
        if not docs:
            raise ProbeDataError(f"held-out text file {str(path)!r} is empty")
        return docs
    column_names = getattr(texts, "column_names", None)
    if column_names is not None:  # a datasets.Dataset (duck-typed: no import needed)
        if text_field not in column_names:
            raise ProbeDataError(
                f"dataset has no column {text_field!r} (columns: {list(column_names)}); pass text_field="
            )
        docs = list(texts[text_field])
        source = f"dataset column {text_field!r}"
    elif isinstance(texts, Sequence):
        docs = list(texts)
        source = "texts"
    else:
        raise TypeError(
            f"texts must be a list of strings, a path or a datasets.Dataset, got {type(texts).__name__}"
        )
    for i, doc in enumerate(docs):
        if not isinstance(doc, str):
            raise ProbeDataError(f"{source}[{i}] is {type(doc).__name__}, expected str")
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise ProbeDataError(f"{source} is empty: perplexity needs at least one non-empty text")
    return docs


def sliding_windows(n_tokens: int, max_length: int, stride: int) -> list[tuple[int, int, int]]:
    """``(start, end, first_target)`` windows covering a ``n_tokens`` document.

    The window feeds tokens ``[start, end)`` and scores the predictions of tokens
    ``[first_target, end)``; every token but the first is scored exactly once. The first window
    is ``[0, max_length)``; each next one scores the following ``stride`` tokens with the
    ``max_length - stride`` tokens before them as context (``stride < max_length``).
    """
    if n_tokens < 2:
        return []
    if n_tokens <= max_length:
        return [(0, n_tokens, 1)]
    windows = [(0, max_length, 1)]
    scored_end = max_length
    while scored_end < n_tokens:
        end = min(scored_end + stride, n_tokens)
        windows.append((end - max_length, end, scored_end))
        scored_end = end
    return windows


@register()
class Perplexity(Probe):
    """``exp(mean token NLL)`` over held-out text; key ``"perplexity"``. Cost: one forward pass.

    Token-weighted over all documents (a long document counts for its tokens), padding never
    scored, documents longer than the window scored with a sliding window. One example is one
    document (the unit ``max_examples`` subsamples).

    ``max_length`` is the window: by default the model's context, capped at
    ``DEFAULT_MAX_WINDOW`` (2048) tokens, since an 8k window with a 49k vocabulary materialises
    gigabytes of logits on CPU. ``stride`` (default half the window) is how far each next window
    advances; only its new tokens are scored, the rest is context. A text file is split into
    documents at blank lines (``file_split="line"``: one document per line).
    """

    name = "perplexity"
    cost_rank = 1
    min_examples = 2

    @classmethod
    def for_preset(cls, tokenizer: Any, *, reference: Any = None, teacher: Any = None) -> Perplexity:
        return cls(PROBE_TEXTS, tokenizer)  # 8 held-out sentences, one forward pass each

    def __init__(
        self,
        texts: list[str] | str | os.PathLike[str] | Any,
        tokenizer: Any,
        *,
        every: int | None = DefaultEvery(50),
        on_evaluate: bool = True,
        max_length: int | None = None,
        stride: int | None = None,
        batch_size: int = 4,
        text_field: str = "text",
        file_split: Literal["paragraph", "line"] = "paragraph",
    ) -> None:
        self._init_schedule(every, on_evaluate)
        if max_length is not None and max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        if stride is not None and stride < 1:
            raise ValueError(f"stride must be >= 1, got {stride}")
        if max_length is not None and stride is not None and stride >= max_length:
            raise ValueError(
                f"stride ({stride}) must be < max_length ({max_length}): every scored token needs context"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.stride = stride
        self.batch_size = batch_size
        docs = load_texts(texts, text_field=text_field, file_split=file_split)
        ids = encode(tokenizer, docs)
        self._ids = [seq for seq in ids if len(seq) >= 2]
        if not self._ids:
            raise ProbeDataError("no held-out text has two tokens: nothing to score")
        if len(self._ids) < len(ids):
            logger.debug("perplexity: %d texts shorter than two tokens ignored", len(ids) - len(self._ids))

    @property
    def num_examples(self) -> int:
        return len(self._ids)

    def _window(self, model: Any) -> tuple[int, int]:
        max_length = self.max_length or min(context_length(model, self.tokenizer), DEFAULT_MAX_WINDOW)
        stride = self.stride or max(max_length // 2, 1)
        return max_length, min(stride, max_length - 1)

    def nll(self, model: Any, *, max_examples: int | None = None) -> tuple[float, int]:
        """Summed token NLL and number of scored tokens (call inside ``probe_mode``)."""
        max_length, stride = self._window(model)
        items = [
            (doc, start, end, first)
            for doc in self._selection(len(self._ids), max_examples)
            for start, end, first in sliding_windows(len(self._ids[doc]), max_length, stride)
        ]
        items.sort(key=lambda item: item[2] - item[1], reverse=True)  # similar lengths share a batch
        device = model_device(model)
        total, count = 0.0, 0
        for batch in chunks(items, self.batch_size):
            seqs = [self._ids[doc][start:end] for doc, start, end, _ in batch]
            ids, mask = pad_batch(seqs, 0, side="right", device=device)
            logits = forward_logits(model, ids, mask)
            # Position j predicts token j + 1; score only targets inside [first, end) of each window.
            targets = ids[:, 1:]
            positions = torch.arange(1, ids.shape[1], device=device)
            score = torch.zeros_like(targets, dtype=torch.bool)
            for row, (_, start, end, first) in enumerate(batch):
                score[row] = (positions >= first - start) & (positions < end - start)
            nll = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none"
            ).view_as(targets)
            total += float(nll[score].double().sum())
            count += int(score.sum())
        return total, count

    def _measure(self, model: Any, *, max_examples: int | None) -> dict[str, float]:
        total, count = self.nll(model, max_examples=max_examples)
        return {"perplexity": math.exp(total / count)}
