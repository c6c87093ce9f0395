from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
import pytest
from servers import Service, make_service  # tests/servers.py, on the path from tests/conftest.py

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # harden.py, slowproxy.py
sys.path.insert(0, str(HERE.parent / "agents"))  # agent_helpers (tiny Trainer helpers)


@pytest.fixture(scope="module")
def module_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One real service on SQLite for a whole module (each test registers its own runs)."""
    tmp = tmp_path_factory.mktemp("module-service")
    svc = make_service(f"sqlite:///{tmp / 'actuator.db'}", log_dir=str(tmp)).start()
    yield svc
    svc.stop()


@pytest.fixture(scope="session")
def char_tokenizer():
    from agent_helpers import make_char_tokenizer

    return make_char_tokenizer()
