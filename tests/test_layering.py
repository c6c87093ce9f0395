"""DESIGN.md's dependency rule: controllers <- actuator <- api, and actuator (schemas, client) <- agents.
Agents never import SQLAlchemy or FastAPI; controllers import nothing of ours (stdlib only)."""

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
