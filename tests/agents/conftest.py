from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # agent_helpers

from agent_helpers import make_char_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def char_tokenizer():
    return make_char_tokenizer()
