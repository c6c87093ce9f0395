"""A reward function for TRL's grpo.py / rloo.py, loaded by them from its dotted path
(``--reward_funcs trl_script_rewards.shorter``) in tests/agents/test_first_contact_trl_scripts.py."""

from __future__ import annotations

from typing import Any


def _text(completion: Any) -> str:
    # Conversational prompts give completions as [{"role": "assistant", "content": ...}].
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return str(completion)


def shorter(completions: list[Any], **kwargs: Any) -> list[float]:
    """Shorter answers score higher: a reward that varies within a group, so the policy moves."""
    return [-len(_text(c)) / 10.0 for c in completions]
