"""The demo's data and options: completion-only examples count the answer only, and a budget the
demo cannot use is refused naming the flag before a model loads."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from actuator.agents.testing import char_tokenizer

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.py"
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def demo_module():
    spec = importlib.util.spec_from_file_location("actuator_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_completion_only_examples_count_the_answer_and_its_end_only() -> None:
    demo = demo_module()
    tok = char_tokenizer()
    tok.chat_template = TEMPLATE
    full = demo.build_dataset(tok, 6, 0)
    answers = demo.build_dataset(tok, 6, 0, completion_only=True)
    assert "labels" not in full.column_names  # the collator copies the inputs: every token counts
    assert answers["input_ids"] == full["input_ids"]
    for (question, answer), ids, labels in zip(demo.narrow_task(6, 0), answers["input_ids"], answers["labels"]):
        counted = [t for t, label in zip(ids, labels) if label != -100]
        assert [label for label in labels if label != -100] == counted
        assert tok.decode(counted).replace(" ", "") == (answer + "</s>").replace(" ", "")
        k = len(ids) - len(counted)  # the request is a masked prefix, the answer the counted rest
        assert labels == [-100] * k + ids[k:]
        assert tok.decode(ids[:k]).replace(" ", "") == f"<user>{question}</s><assistant>".replace(" ", "")


@pytest.mark.parametrize(("args", "message"), [
    (["--constraint", "kl_drift"], "--budget: give the KL drift budget"),
    (["--budget", "0"], "--budget must be > 0"),
    (["--anchor-reading", "-1"], "--anchor-reading must be >= 0"),
    (["--steps", "5"], "--steps must be >= 10"),  # issue 57: a step count the configuration cannot serve
])
def test_a_budget_the_demo_cannot_use_is_refused_naming_the_flag(args: list[str], message: str) -> None:
    out = subprocess.run([sys.executable, str(DEMO), *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert message in out.stderr
