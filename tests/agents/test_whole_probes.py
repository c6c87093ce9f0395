"""A probe a guardrail or a relative setpoint compares with a whole reading runs whole or is skipped:
a subset of its examples is another measure (benchmarks/probes/subsets.py: the perplexity of 4 of
the 8 held-out sentences read +24% over all 8 on the same SmolLM2 weights, past a '+20%' ceiling with
nothing trained). The run's policy decides which probes; a controller's input on an absolute
setpoint may still be subsampled."""

from __future__ import annotations

from actuator.agents.callback import ActuatorCallback, Reporting
from actuator.agents.default_probes import compared_probes
from actuator.agents.probes import KLDrift, Perplexity
from actuator.policy import load_policy, load_preset
from agent_helpers import HELD_OUT, make_trainer


def test_the_policy_names_the_probes_compared_with_a_whole_reading():
    assert compared_probes(load_preset("sft-capability")) == {"hotpotqa", "perplexity"}  # kl_drift: absolute setpoint
    assert compared_probes(load_preset("compress-width")) == {"perplexity"}  # '+7%' setpoint, '+10%' guardrail
    assert compared_probes(load_policy({"name": "x", "controllers": [
        {"name": "c", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.1, "kp": 1.0}]})) == set()


def test_the_run_keeps_guarded_probes_whole(tmp_path, char_tokenizer, sqlite_service):
    trainer = make_trainer(tmp_path, char_tokenizer, steps=4, scheduler="constant")
    policy = {"name": "whole", "probes": [{"name": "perplexity", "every": 2}, {"name": "kl_drift", "every": 2}],
              "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.5,
                               "kp": 1.0, "direction": "direct"}],
              "guardrails": [{"name": "ppl", "probe": "perplexity", "bound": "upper", "threshold": "+20%",
                              "action": "alert"}]}
    cb = ActuatorCallback(policy, connection=sqlite_service.url,
                          probes=[Perplexity(HELD_OUT, char_tokenizer, every=2), KLDrift(HELD_OUT, char_tokenizer)],
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    trainer.train()
    suite = cb.session.suite
    assert suite.whole == {"perplexity"} and suite.priority == {"kl_drift"}
