"""One module name per file, at run time: a package folder (``controllers/``, ``api/``, ...) installs
as ``actuator.<name>`` (pyproject's ``package-dir``), and when the checkout's root is on ``sys.path``
(``python -m pytest`` puts the working directory there; tests put it there for ``benchmarks``) the
folder is also importable by its bare name, as a second, distinct module: its classes are other
objects, its module state another copy. :func:`forbid_folder_names` makes such an import fail with
the name to use. The static twin is ``tests/test_layering.py`` (no file imports a folder name)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import tomllib
from pathlib import Path


class FolderNameImport(importlib.abc.MetaPathFinder):
    """Refuses ``import <folder>`` for the checkout's package folders that install under another name."""

    def __init__(self, root: Path) -> None:
        package_dir = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
        self.folders = {folder: ((root / folder).resolve(), package) for package, folder in package_dir.items()
                        if "/" not in folder and package != folder}

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname not in self.folders:
            return None  # other names, submodules included: a submodule's top level was asked for first
        folder, package = self.folders[fullname]
        spec = importlib.machinery.PathFinder.find_spec(fullname)
        if spec is not None and spec.origin and Path(spec.origin).resolve().is_relative_to(folder):
            raise ModuleNotFoundError(f"`import {fullname}` would load {fullname}/ a second time under another "
                                      f"name: import {package} instead", name=fullname)
        return None  # not the checkout's folder (a namespace portion, another package): not ours to refuse


def forbid_folder_names(root: Path) -> None:
    if not any(isinstance(finder, FolderNameImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, FolderNameImport(root))
