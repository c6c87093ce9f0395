"""Issue 35, "a package face": ``from actuator.agents import ActuatorCallback`` works, every name the
package exports is the object of its home module, and importing the package stays light (PEP 562)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import actuator.agents as agents
import pytest


def test_the_callback_the_anchor_helpers_and_the_probes_are_exported():
    from actuator.agents import ActuatorCallback, KLAnchor, Perplexity, install_anchor
    from actuator.agents.anchor import install_anchor as home_install_anchor
    from actuator.agents.callback import ActuatorCallback as home_callback

    assert ActuatorCallback is home_callback and install_anchor is home_install_anchor
    assert KLAnchor.__module__ == "actuator.agents.anchor"
    assert Perplexity.__module__.startswith("actuator.agents.probes")
    assert {"ActuatorCallback", "install_anchor", "anchor_trainer", "KLAnchor", "ProbeSuite", "Perplexity",
            "KLDrift", "HotpotQA", "DraftAcceptance"} <= set(agents.__all__)


@pytest.mark.parametrize("name", agents.__all__)
def test_each_exported_name_is_the_object_at_its_home_module(name):
    value = getattr(agents, name)
    home = importlib.import_module(value.__module__)
    assert home.__name__.startswith("actuator.agents."), home.__name__
    assert getattr(home, name) is value
    assert name in dir(agents)


def test_star_import_gives_exactly_all_and_unknown_names_fail():
    namespace: dict[str, object] = {}
    exec("from actuator.agents import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(agents.__all__)
    assert len(set(agents.__all__)) == len(agents.__all__)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        agents.NoSuchThing  # noqa: B018
    with pytest.raises(ImportError):
        exec("from actuator.agents import NoSuchThing", {})


def test_importing_the_package_imports_neither_torch_nor_transformers():
    # A fresh interpreter: this one has torch loaded already.
    code = ("import json, sys, actuator.agents as a, actuator.agents.sender; dir(a); "
            "print(json.dumps(sorted(m for m in ('torch', 'transformers') if m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(done.stdout) == []
