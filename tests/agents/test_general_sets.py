"""The shipped general-text sets stay pairwise disjoint, and the check says so under ``python -O`` too
(issue 35: module-level ``assert``s vanish when asserts are compiled out)."""

from __future__ import annotations

import inspect

import pytest
from actuator.agents import general

PLANTED = '    "What is the capital of France?",  # planted: a held-out probe prompt\n'


def _run_optimized(source: str) -> None:
    """Execute the module's source as ``python -O`` would: ``optimize=1`` strips every ``assert``."""
    exec(compile(source, general.__file__, "exec", optimize=1), {"__name__": "planted_general"})


def test_the_shipped_sets_import_clean_with_asserts_compiled_out():
    _run_optimized(inspect.getsource(general))


@pytest.mark.parametrize("list_name", ["ANCHOR_PROMPTS", "CONTROL_PROMPTS"])
def test_a_probe_prompt_planted_in_another_set_fails_the_import_under_python_O(list_name):
    source = inspect.getsource(general)
    opening = f"{list_name} = [\n"
    assert source.count(opening) == 1
    with pytest.raises(ValueError, match="must be disjoint.*What is the capital of France"):
        _run_optimized(source.replace(opening, opening + PLANTED))


def test_a_probe_text_planted_in_the_anchor_texts_fails_the_import_under_python_O():
    source = inspect.getsource(general)
    opening = "ANCHOR_TEXTS = [\n"
    planted = f"    {general.PROBE_TEXTS[0]!r},\n"
    with pytest.raises(ValueError, match="PROBE_TEXTS and ANCHOR_TEXTS must be disjoint"):
        _run_optimized(source.replace(opening, opening + planted))
