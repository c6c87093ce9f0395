"""Issue 36: a training node installs `actuator` and brings its own torch and transformers (README,
"Install"). A module that needs them and does not find them says which is missing and what to
install, not a bare `No module named 'torch'` nor the `actuator[train]` extra. Each import runs
in a child process where the missing package is blocked (``sys.modules[name] = None`` makes its
import fail as if it were not installed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import sys
sys.modules[{blocked!r}] = None
try:
    {statement}
except ImportError as exc:
    print(exc)
else:
    print("imported")
"""


def _import_without(blocked: str, statement: str) -> str:
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(blocked=blocked, statement=statement)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize(("blocked", "statement"), [
    ("torch", "import actuator.agents.probes"),
    ("torch", "from actuator.agents.probes import KLDrift"),
    ("torch", "import actuator.agents.anchor"),
    ("torch", "import actuator.agents.distill"),
    ("torch", "from actuator.agents.models import load_smollm2; load_smollm2()"),
    ("transformers", "import actuator.agents.callback"),
    ("transformers", "import actuator.agents.anchor"),
    ("transformers", "import actuator.agents.distill"),
])
def test_a_missing_training_package_is_named_with_the_install(blocked, statement):
    message = _import_without(blocked, statement)
    assert message != "imported"
    assert f"missing: {blocked}" in message, message
    assert "pip install torch transformers accelerate" in message, message
    assert "actuator[train]" not in message, message


def test_the_core_agent_modules_import_without_torch():
    assert _import_without("torch", "import actuator.agents, actuator.client, actuator.schemas") == "imported"
