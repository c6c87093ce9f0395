from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/folder_names.py

from folder_names import forbid_folder_names  # noqa: E402
# The session fails if a process it started is still running at its end (tests/no_orphans.py).
from no_orphans import (  # noqa: E402, F401
    pytest_sessionfinish,
    pytest_sessionstart,
    pytest_terminal_summary,
    pytest_testnodedown,
)
from actuator.testing import Postgres, Redis, Service, make_service, start_postgres, start_redis  # noqa: E402

forbid_folder_names(Path(__file__).resolve().parents[1])  # `import controllers` fails: actuator.controllers

# pytest-xdist starts its workers with COLUMNS=80 (and LINES): a rich Console created at import
# (actuator.cli's) would fix its width to 80 there, and the CLI tests' COLUMNS=200 would not apply.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Tiny models gain nothing from intra-op threads, and on 2 shared cores two torch threads
# contending with the service processes slow a tiny Trainer step down by orders of magnitude.
try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover - the training extra is always installed for tests
    pass


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    pg = start_postgres()
    yield pg
    pg.remove()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Redis]:
    r = start_redis()
    yield r
    r.stop()


_db_counter = iter(range(10_000))


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database of each kind."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'actuator.db'}"
    pg: Postgres = request.getfixturevalue("postgres")
    return pg.create_database(f"t{os.getpid()}_{next(_db_counter)}")


@pytest.fixture
def service(database_url: str, tmp_path: Path) -> Iterator[Service]:
    """The real service under uvicorn on loopback, on SQLite and on Postgres."""
    svc = make_service(database_url, log_dir=str(tmp_path)).start()
    yield svc
    svc.stop()


@pytest.fixture
def sqlite_service(tmp_path: Path) -> Iterator[Service]:
    svc = make_service(f"sqlite:///{tmp_path / 'actuator.db'}", log_dir=str(tmp_path)).start()
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def module_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One real service on SQLite for a whole module (each test registers its own runs)."""
    tmp = tmp_path_factory.mktemp("module-service")
    svc = make_service(f"sqlite:///{tmp / 'actuator.db'}", log_dir=str(tmp)).start()
    yield svc
    svc.stop()
