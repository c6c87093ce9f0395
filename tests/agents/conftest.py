from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # agent_helpers

from agent_helpers import make_char_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def char_tokenizer():
    return make_char_tokenizer()


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, char_tokenizer):
    """The seed tiny Llama saved with its tokenizer: GRPO/RLOO build their reference model from the
    policy's path (no ref_model argument)."""
    from actuator.agents.models import tiny_llama

    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama(seed=0).save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    return str(path)
