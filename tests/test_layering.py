"""The dependency rule (docs/explanation/architecture.md): controllers <- actuator <- api, and
actuator (schemas, client, policy) <- agents. Agents never import SQLAlchemy or FastAPI; controllers
import nothing of ours (stdlib only). And the repository stands alone: no file points outside it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imports(folder: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in (ROOT / folder).rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
        out[str(path.relative_to(ROOT))] = names
    return out


def test_controllers_are_stdlib_only():
    for path, names in imports("controllers").items():
        bad = {n for n in names if n.split(".")[0] not in sys.stdlib_module_names}
        assert not bad, f"{path} imports {bad}"
        assert not {n for n in names if n.split(".")[0] in {"logging", "time", "socket"}}, path


def test_agents_never_import_store_or_web_framework():
    for path, names in imports("agents").items():
        bad = {n for n in names if n.split(".")[0] in {"sqlalchemy", "fastapi", "starlette", "alembic", "uvicorn"}
               or n.startswith(("actuator.store", "actuator.models", "actuator.api", "actuator.migrate"))}
        assert not bad, f"{path} imports {bad}"


def test_core_does_not_import_api_or_agents():
    for path, names in imports("actuator").items():
        if path.endswith("cli.py"):
            continue  # the CLI starts the service
        bad = {n for n in names if n.startswith(("actuator.api", "actuator.agents", "fastapi", "torch"))}
        assert not bad, f"{path} imports {bad}"


def test_no_file_refers_to_a_document_outside_the_repository():
    # The design notes once lived beside the repository; a clone does not have them. Any relative
    # reference to a document must resolve to a file inside the checkout.
    import re
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    reference = re.compile(r"(?<![\w.])(?:\.\./)+[\w./-]*\.md\b")
    offenders = []
    for rel in tracked.split():
        path = ROOT / rel
        if path.suffix not in {".py", ".md", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".txt", ".js"} \
                or not path.is_file():
            continue
        for ref in reference.findall(path.read_text(errors="replace")):
            target = (path.parent / ref).resolve()
            if not target.is_relative_to(ROOT) or not target.exists():
                offenders.append(f"{rel}: {ref}")
    assert offenders == [], f"references to documents outside the repository: {offenders}"
