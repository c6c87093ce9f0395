"""The dependency rule (docs/explanation/architecture.md, "Where the code lives"), checked on every
import, absolute and relative, against the module names the files install as.

The top-level folders install as packages of ``actuator`` (pyproject's ``package-dir``): ``agents/``
is ``actuator.agents``, ``api/`` is ``actuator.api`` and so on. Each file's relative imports are
resolved against its package as installed, so ``from .api import x`` in ``actuator/engine.py`` is
an import of ``actuator.api``. Then each layer may import only what :data:`MAY_IMPORT` names:

* ``controllers``: nothing of ours (and the standard library only, without clock, logging or I/O);
* the core (``actuator``): itself and ``controllers`` (``actuator.cli`` also ``api``: it starts the
  service);
* ``api``: the core and ``controllers``;
* ``agents``: ``controllers`` and the core's wire side (:data:`WIRE_SIDE`), which itself needs only
  the core install; never the store, the service or their packages;
* ``migrations``: the core.

A folder's own name (``controllers``, ``api.views``) is never an import anywhere in the repository:
it would load the same file a second time as a different module.
No import cycle among the packages' modules: :func:`import_cycles` reads every import, at module
level and inside functions alike (a deferred import still ties the two modules together).
And the repository stands alone: no file points outside it."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CORE = "core"
SUBPACKAGES = {  # layer -> the package it installs as; every other actuator.* module is the core
    "controllers": "actuator.controllers",
    "agents": "actuator.agents",
    "api": "actuator.api",
    "migrations": "actuator.migrations",
}
WIRE = "wire side"
# The core modules the agents may import: the wire schemas, the client, policy documents, the
# knob and probe catalogue and the exceptions. They import only the standard library, the
# controllers, each other and WIRE_PACKAGES, so a training node with the core install runs them.
WIRE_SIDE = {"actuator", "actuator._exceptions", "actuator.catalogue", "actuator.client", "actuator.policy",
             "actuator.schemas"}
WIRE_PACKAGES = {"pydantic", "pydantic_core", "httpx", "yaml"}
MAY_IMPORT = {
    "controllers": {"controllers"},
    CORE: {CORE, "controllers"},
    "api": {"api", CORE, "controllers"},
    "agents": {"agents", WIRE, "controllers"},
    "migrations": {"migrations", CORE},
}
ALSO_MAY_IMPORT = {
    "actuator.cli": {"api"},  # `actuator serve` starts the service
    "actuator.migrate": {"migrations"},  # finds the Alembic scripts' folder from the package
}
# Core modules a user imports into their own test process (actuator.testing: real servers on
# loopback): at import they load only the standard library and these packages, never a module of
# ours but the package itself; what a helper needs beyond that (psycopg) it imports when called.
IMPORT_LIGHT = {"actuator.testing": {"httpx"}}
SERVER_PACKAGES = {"sqlalchemy", "fastapi", "starlette", "alembic", "uvicorn", "psycopg", "redis",
                   "prometheus_client", "pydantic_settings"}
NEVER_IN = {  # third-party packages a layer never imports
    "agents": SERVER_PACKAGES,
    CORE: {"torch", "transformers", "fastapi", "starlette"},
}


# -- reading the tree ------------------------------------------------------------------------------

def package_dirs(root: Path) -> dict[Path, str]:
    """Folder -> the package it installs as, from ``root/pyproject.toml``'s ``package-dir``."""
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {(root / folder).resolve(): package for package, folder in config["package-dir"].items()}


def module_of(path: Path, dirs: dict[Path, str]) -> tuple[str, bool]:
    """The module ``path`` installs as, and whether it is a package (``__init__.py``)."""
    path = path.resolve()
    folder = max((d for d in dirs if path.is_relative_to(d)), key=lambda d: len(d.parts))
    parts = list(path.relative_to(folder).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join([dirs[folder], *parts]), is_package


def package_modules(dirs: dict[Path, str]) -> dict[str, tuple[Path, bool]]:
    """Every module of the installed packages: name -> (file, is a package)."""
    found: dict[str, tuple[Path, bool]] = {}
    for folder in dirs:
        for path in folder.rglob("*.py"):
            name, is_package = module_of(path, dirs)
            found[name] = (path, is_package)
    return found


def imported(source: str, module: str = "", is_package: bool = False, *, with_names: bool = True) -> set[str]:
    """The modules ``source`` imports, relative imports resolved against ``module``'s package
    (without ``module``: the absolute imports only).

    ``from X import name`` counts as ``X`` and, ``with_names``, ``X.name`` (``name`` may be a
    submodule: ``from actuator import api``)."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level and not module:
                continue  # a file outside the installed packages: only its absolute imports are read
            if node.level:
                parts = package.split(".")
                if not package or node.level - 1 >= len(parts):
                    raise ValueError(f"{module}: `from {'.' * node.level}{node.module or ''} import` "
                                     "reaches above the top-level package")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            names.add(target)
            if with_names:
                names.update(f"{target}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def module_level(source: str) -> str:
    """``source`` without its function bodies: the statements that run when the module is imported."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.body = [ast.Pass()]
    return ast.unparse(tree)


def layer_of(module: str) -> str | None:
    """The layer of one of our modules (None: the standard library or a third-party package)."""
    for layer, package in SUBPACKAGES.items():
        if module == package or module.startswith(package + "."):
            return layer
    return CORE if module.split(".")[0] == "actuator" else None


def _known(target: str, modules: Iterable[str]) -> str:
    """The module of the tree ``target`` names (``actuator.schemas.Decision`` -> ``actuator.schemas``),
    or ``target`` itself when no module of the tree is a prefix of it."""
    prefixes = [m for m in modules if target == m or target.startswith(m + ".")]
    return max(prefixes, key=len) if prefixes else target


def _may_import(importer: str, target: str) -> bool:
    allowed = MAY_IMPORT[layer_of(importer) or CORE] | ALSO_MAY_IMPORT.get(importer, set())
    layer = layer_of(target)
    return layer in allowed or (WIRE in allowed and layer == CORE and target in WIRE_SIDE)


def violations(root: Path) -> list[str]:
    """Every import in ``root``'s packages that breaks the rule, as ``module: imports target``."""
    dirs = package_dirs(root)
    modules = package_modules(dirs)
    out = []
    for module, (path, is_package) in sorted(modules.items()):
        layer = layer_of(module) or CORE
        targets = {_known(t, modules) for t in imported(path.read_text(), module, is_package)}
        for target in sorted(targets):
            top = target.split(".")[0]
            if layer_of(target) is not None:
                if not _may_import(module, target):
                    out.append(f"{module}: imports {target} ({layer} may import {sorted(MAY_IMPORT[layer])})")
                elif module in WIRE_SIDE and layer_of(target) == CORE and target not in WIRE_SIDE:
                    out.append(f"{module}: imports {target} (the wire side imports only {sorted(WIRE_SIDE)})")
            elif top in NEVER_IN.get(layer, set()):
                out.append(f"{module}: imports {target} ({layer} never imports {top})")
            elif layer == "controllers" and (top not in sys.stdlib_module_names
                                             or top in {"logging", "time", "socket"}):
                out.append(f"{module}: imports {target} (controllers: standard library only, no clock, "
                           "logging or I/O)")
            elif module in WIRE_SIDE and top not in sys.stdlib_module_names | WIRE_PACKAGES:
                out.append(f"{module}: imports {target} (the wire side needs only {sorted(WIRE_PACKAGES)})")
        if module in IMPORT_LIGHT:
            light = sys.stdlib_module_names | IMPORT_LIGHT[module]
            for target in sorted(imported(module_level(path.read_text()), module, is_package, with_names=False)):
                if target.split(".")[0] not in light:
                    out.append(f"{module}: imports {target} at module level (only the standard library and "
                               f"{sorted(IMPORT_LIGHT[module])})")
    return out


def unresolved(root: Path) -> list[str]:
    """Relative imports in ``root``'s packages that name no module of the tree."""
    dirs = package_dirs(root)
    modules = package_modules(dirs)
    out = []
    for module, (path, is_package) in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                targets = imported(ast.unparse(node), module, is_package)
                if not targets & modules.keys():
                    out.append(f"{module}: {ast.unparse(node)}")
    return out


def bare_imports(root: Path, files: Iterable[Path]) -> list[str]:
    """Absolute imports of a package folder by its folder name (``import controllers``) where the
    folder installs under another name (``actuator.controllers``)."""
    folders = {folder.name for folder, package in package_dirs(root).items()
               if folder.parent == root.resolve() and package != folder.name}
    out = []
    for path in files:
        for target in sorted(imported(path.read_text(), with_names=False)):
            if target.split(".")[0] in folders:
                out.append(f"{path.relative_to(root)}: {target}")
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of ``root``'s packages it imports, module level and function level
    alike. A module's own enclosing packages are left out (``from . import x`` names the package
    as well as ``x``): Python initialises them before the module whatever it imports."""
    dirs = package_dirs(root)
    modules = package_modules(dirs)
    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in modules.items():
        targets = {_known(t, modules) for t in imported(path.read_text(), module, is_package)}
        graph[module] = {t for t in targets if t in modules and t != module and not module.startswith(t + ".")}
    return graph


def import_cycles(root: Path) -> list[str]:
    """Each group of modules that import each other in a cycle (a strongly connected component of
    :func:`import_graph`), as one cycle through it: ``a -> b -> c -> a``, from its first module."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for start in sorted(graph):  # Tarjan's algorithm, iteratively
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    out = []
    for group in sorted(groups):
        members, first = set(group), group[0]
        paths = {first: [first]}
        queue = [first]
        while queue:  # the shortest way back to the first module, inside the group
            node = queue.pop(0)
            for nxt in sorted(graph[node] & members):
                if nxt == first:
                    out.append(" -> ".join([*paths[node], first]))
                    queue = []
                    break
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    queue.append(nxt)
    return out


def python_files(root: Path) -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
                            cwd=root, capture_output=True, text=True, check=True).stdout.split()
    return [root / rel for rel in listed if (root / rel).is_file()]


# -- the repository --------------------------------------------------------------------------------

def test_every_import_follows_the_layering_rule():
    assert violations(ROOT) == []


def test_every_relative_import_resolves_to_a_module_of_the_tree():
    assert unresolved(ROOT) == []
    # The resolver is what the rule reads: it places this package's relative imports where Python does.
    assert imported("from .. import schemas\nfrom .sender import S", "actuator.agents.callback") == {
        "actuator", "actuator.schemas", "actuator.agents.sender", "actuator.agents.sender.S"}


def test_the_agents_import_the_core_only_through_its_wire_side():
    dirs = package_dirs(ROOT)
    modules = package_modules(dirs)
    used = {_known(t, modules) for m, (p, pkg) in modules.items() if layer_of(m) == "agents"
            for t in imported(p.read_text(), m, pkg) if layer_of(t) == CORE}
    assert used and used <= WIRE_SIDE


def test_no_file_imports_a_package_folder_by_its_folder_name():
    assert bare_imports(ROOT, python_files(ROOT)) == []


def test_no_import_cycle():
    assert import_cycles(ROOT) == []
    # what the check reads: the engine receives gains auto's tuner, it does not import it
    graph = import_graph(ROOT)
    assert "actuator.warmup" in graph["actuator.engine"] and "actuator.tune" not in graph["actuator.engine"]


# -- the checker fails on planted defects ----------------------------------------------------------

def _synthetic_tree(root: Path, planted: dict[str, str]) -> Path:
    """A small tree laid out like the repository (same package-dir idea), plus ``planted`` files."""
    (root / "pyproject.toml").write_text(
        '[tool.setuptools]\npackage-dir = { "actuator" = "actuator", "actuator.api" = "api", '
        '"actuator.agents" = "agents", "actuator.controllers" = "controllers", '
        '"actuator.api.routers" = "api/routers" }\n')
    files = {
        "actuator/__init__.py": "from ._exceptions import ActuatorError\n",
        "actuator/_exceptions.py": "class ActuatorError(Exception): ...\n",
        "actuator/schemas.py": "import pydantic\n",
        "actuator/store.py": "import sqlalchemy\nfrom .schemas import x\nfrom .controllers import PID\n",
        "actuator/cli.py": "from .api import create_app\n",
        "actuator/testing.py": "import json\nimport httpx\n\ndef start():\n    import psycopg\n",
        "controllers/__init__.py": "import math\n",
        "api/__init__.py": "from .. import store\n",
        "api/routers/__init__.py": "",
        "api/routers/runs.py": "from ...schemas import x\nfrom ..deps import y\n",
        "api/deps.py": "import fastapi\n",
        "agents/__init__.py": "",
        "agents/callback.py": "from ..schemas import x\nfrom .. import controllers\nimport torch\n",
        "tests/test_x.py": "from actuator.controllers import PID\n",
        **planted,
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_synthetic_tree_is_clean(tmp_path):
    root = _synthetic_tree(tmp_path, {})
    assert violations(root) == [] and unresolved(root) == []
    assert bare_imports(root, root.rglob("*.py")) == []
    assert import_cycles(root) == []  # api/__init__.py's `from .. import store`: a package, not a cycle


@pytest.mark.parametrize(("planted", "found"), [
    # the cycle issue 52 opened, through an import inside a function
    ({"actuator/engine.py": "def calibrate():\n    from .tune import tune_controller\n",
      "actuator/tune.py": "from .simulate import simulate_model\n",
      "actuator/simulate.py": "from .engine import Engine\n"},
     ["actuator.engine -> actuator.tune -> actuator.simulate -> actuator.engine"]),
    ({"actuator/engine.py": "from . import policy\n", "actuator/policy.py": "from .engine import Engine\n"},
     ["actuator.engine -> actuator.policy -> actuator.engine"]),
    ({"api/deps.py": "from .routers import runs\n"},  # runs imports ..deps: across packages
     ["actuator.api.deps -> actuator.api.routers.runs -> actuator.api.deps"]),
])
def test_a_planted_import_cycle_is_found(tmp_path, planted, found):
    root = _synthetic_tree(tmp_path, planted)
    assert import_cycles(root) == found


@pytest.mark.parametrize(("rel", "text", "found"), [
    ("actuator/engine.py", "from .api import create_app\n", "actuator.engine: imports actuator.api"),
    ("actuator/engine.py", "from . import api\n", "actuator.engine: imports actuator.api"),
    ("actuator/engine.py", "from .agents.callback import ActuatorCallback\n", "imports actuator.agents.callback"),
    ("actuator/engine.py", "import torch\n", "core never imports torch"),
    ("api/routers/runs.py", "from ...agents import x\n", "actuator.api.routers.runs: imports actuator.agents"),
    ("agents/callback.py", "from ..store import Store\n", "actuator.agents.callback: imports actuator.store"),
    ("agents/callback.py", "from ..api.deps import y\n", "imports actuator.api.deps"),
    ("agents/callback.py", "import sqlalchemy\n", "agents never imports sqlalchemy"),
    ("controllers/__init__.py", "from ..schemas import x\n", "actuator.controllers: imports actuator.schemas"),
    ("controllers/__init__.py", "import time\n", "standard library only"),
    ("actuator/schemas.py", "import sqlalchemy\n", "the wire side needs only"),
    ("actuator/schemas.py", "from .store import x\n", "actuator.schemas: imports actuator.store"),
    ("actuator/testing.py", "import psycopg\n", "actuator.testing: imports psycopg at module level"),
    ("actuator/testing.py", "from . import schemas\n", "actuator.testing: imports actuator at module level"),
    ("actuator/testing.py", "def f():\n    from .api import app\n", "actuator.testing: imports actuator.api ("),
    ("actuator/testing.py", "def f():\n    from .agents import x\n", "actuator.testing: imports actuator.agents"),
])
def test_a_planted_import_against_the_rule_is_found(tmp_path, rel, text, found):
    root = _synthetic_tree(tmp_path, {rel: text})
    assert any(found in v for v in violations(root)), violations(root)


@pytest.mark.parametrize("text", ["import controllers\n", "from api.views import decision_public\n",
                                  "from agents import callback\n", "import api.views as v\n"])
def test_a_planted_import_by_folder_name_is_found(tmp_path, text):
    root = _synthetic_tree(tmp_path, {"tests/test_x.py": text})
    assert bare_imports(root, root.rglob("*.py")) == [f"tests/test_x.py: {text.split()[1]}"]


def test_a_relative_import_that_resolves_to_nothing_is_found(tmp_path):
    root = _synthetic_tree(tmp_path, {"api/routers/runs.py": "from ..nothing import x\n"})
    assert unresolved(root) == ["actuator.api.routers.runs: from ..nothing import x"]


# -- the repository stands alone -------------------------------------------------------------------

def test_no_file_refers_to_a_document_outside_the_repository():
    # The design notes once lived beside the repository; a clone does not have them. Any relative
    # reference to a document must resolve to a file inside the checkout.
    import re

    import importlib.util

    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    reference = re.compile(r"(?<![\w.])(?:\.\./)+[\w./-]*\.md\b")
    # The docs build writes some pages from the code (scripts/docs_reference.py, an mkdocs hook):
    # they exist in the site, not in the checkout, and the hook's own links are relative to them.
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "scripts" / "docs_reference.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    generated = {(ROOT / "docs" / uri).resolve() for uri in hook.PAGES}
    offenders = []
    for rel in tracked.split():
        path = ROOT / rel
        if path.suffix not in {".py", ".md", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".txt", ".js"} \
                or not path.is_file():
            continue
        base = (ROOT / "docs" / next(iter(hook.PAGES))).parent if rel == "scripts/docs_reference.py" else path.parent
        for ref in reference.findall(path.read_text(errors="replace")):
            target = (base / ref).resolve()
            if not target.is_relative_to(ROOT) or not (target.exists() or target in generated):
                offenders.append(f"{rel}: {ref}")
    assert offenders == [], f"references to documents outside the repository: {offenders}"


# -- at run time -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["controllers", "api", "api.views", "agents", "agents.callback", "migrations"])
def test_a_package_folder_is_not_importable_by_its_folder_name_in_a_test_run(name, monkeypatch):
    # The checkout's root on sys.path (python -m pytest puts the working directory there) would
    # make the folder importable as a second module; tests/conftest.py refuses it.
    monkeypatch.syspath_prepend(str(ROOT))
    for loaded in [m for m in sys.modules if m.split(".")[0] == name.split(".")[0]]:
        monkeypatch.delitem(sys.modules, loaded)
    package = f"actuator.{name}"
    with pytest.raises(ModuleNotFoundError, match=f"import actuator.{name.split('.')[0]} instead"):
        __import__(name)
    assert __import__(package, fromlist=["_"]).__name__ == package


def test_the_architecture_page_says_what_this_test_enforces():
    """docs/explanation/architecture.md: its folder table names each top-level folder's installed
    package as pyproject does, and its layer table names the agents' wire side as WIRE_SIDE."""
    import re

    page = (ROOT / "docs" / "explanation" / "architecture.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)/` \| `([\w.]+)` \|", page, flags=re.M))
    top_level = {folder.name: package for folder, package in package_dirs(ROOT).items() if folder.parent == ROOT}
    assert rows == top_level
    agents_row = next(line for line in page.splitlines() if line.startswith("| `actuator.agents` |"))
    assert set(re.findall(r"`(actuator(?:\.\w+)?)`", agents_row.split("**wire side**")[1])) == WIRE_SIDE
