"""Offline English text for training and held-out data in the examples and the benchmarks: prose
from standard-library docstrings (deterministic, always installed, nothing downloaded), cut
into fixed-length token blocks."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

__all__ = ["stdlib_text", "blocks"]

_MODULES = (
    "argparse", "asyncio", "collections", "concurrent.futures", "contextlib", "csv", "dataclasses",
    "datetime", "decimal", "email", "enum", "fractions", "functools", "heapq", "http.client",
    "inspect", "itertools", "json", "logging", "pathlib", "pickle", "random", "re", "shutil",
    "socket", "sqlite3", "statistics", "string", "subprocess", "tarfile", "textwrap", "threading",
    "typing", "unittest", "urllib.request", "uuid", "zipfile",
)


def stdlib_text() -> list[str]:
    """English prose from standard-library docstrings: deterministic, offline, always installed."""
    docs: list[str] = []
    with warnings.catch_warnings():  # some module attributes warn when touched (deprecations)
        warnings.simplefilter("ignore")
        for name in _MODULES:
            mod = importlib.import_module(name)
            for obj in [mod, *vars(mod).values()]:
                doc = getattr(obj, "__doc__", None)
                if isinstance(doc, str) and len(doc) > 200 and doc.strip() not in docs:
                    docs.append(doc.strip())
    return docs


def blocks(tok: Any, texts: list[str], seq_len: int) -> list[Any]:
    """``texts`` joined and cut into token blocks of ``seq_len`` (a torch tensor each)."""
    import torch

    ids = tok("\n\n".join(texts), add_special_tokens=False)["input_ids"]
    return [torch.tensor(ids[i: i + seq_len]) for i in range(0, len(ids) - seq_len + 1, seq_len)]
