from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agents"))  # agent_helpers, test_trl_knobs

from agent_helpers import make_char_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def char_tokenizer():
    return make_char_tokenizer()
