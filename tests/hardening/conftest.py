from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # harden.py
sys.path.insert(0, str(HERE.parent / "agents"))  # agent_helpers (tiny Trainer helpers)


@pytest.fixture(scope="session")
def char_tokenizer():
    from agent_helpers import make_char_tokenizer

    return make_char_tokenizer()
