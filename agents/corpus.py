"""Offline English text for training and held-out data in the examples and the benchmarks: prose
from standard-library docstrings (deterministic, always installed, nothing downloaded), cut
into fixed-length token blocks."""

from __future__ import annotations

import importlib
import types
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
            public = [obj for key, obj in vars(mod).items() if not key.startswith("_")]  # others patch privates
            for obj in [mod, *public]:
                if obj is not mod and not _defined_in(obj, name):
                    continue  # a submodule, or a name imported into it: present or not by import order
                doc = getattr(obj, "__doc__", None)
                if isinstance(doc, str) and len(doc) > 200 and doc.strip() not in docs:
                    docs.append(doc.strip())
    return docs


def _defined_in(obj: Any, name: str) -> bool:
    """Whether ``obj`` belongs to module ``name`` whatever else the process imported: not a module
    (a package's submodules appear among its attributes once something imports them), and defined
    in ``name`` or below it when it says where it was defined."""
    if isinstance(obj, types.ModuleType):
        return False
    where = getattr(obj, "__module__", None)
    return not isinstance(where, str) or where == name or where.startswith(name + ".")


def blocks(tok: Any, texts: list[str], seq_len: int) -> list[Any]:
    """``texts`` joined and cut into token blocks of ``seq_len`` (a torch tensor each)."""
    import torch

    ids = tok("\n\n".join(texts), add_special_tokens=False)["input_ids"]
    return [torch.tensor(ids[i: i + seq_len]) for i in range(0, len(ids) - seq_len + 1, seq_len)]
