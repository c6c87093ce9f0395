"""Issue 36, agent side, on real Trainer.train() runs of tiny models against the real service:
presets fit the run they are attached to (a probe's own every= wins; the preset's intervals shrink
with max_steps; the probes it names are built when none are passed, or train() start says what is
missing), the one-line DPO attach puts the KL anchor on the trainer's own pairs, the run says where
to find it at WARNING, a 404 at registration says to check the URL, and rl-kl states one beta."""

from __future__ import annotations

import copy
import logging
import re
import sys
from pathlib import Path

import httpx
import pytest
from transformers import Trainer, TrainerCallback, TrainingArguments

from actuator import ConfigError
from actuator.agents.callback import ActuatorCallback, Connection, Reporting
from actuator.agents.knobs import KnobNotSupported
from actuator.agents.models import tiny_llama
from actuator.agents.probes import KLDrift
from actuator.agents.trl_knobs import KLBetaKnob
from actuator.policy import load_preset

from agent_helpers import HELD_OUT, NARROW_TASK, SlowSteps, lm_dataset

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

ROOT = Path(__file__).resolve().parents[2]


def sft_trainer(tmp_path, tokenizer, steps: int, *, with_tokenizer: bool = True) -> Trainer:
    """A plain Trainer on a narrow task (the trainer's tokenizer: what the callback builds probes with)."""
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=4,
                             learning_rate=5e-3, lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
                             report_to=[], use_cpu=True, seed=0, dataloader_num_workers=0, disable_tqdm=True)
    return Trainer(model=tiny_llama(seed=0), args=args, train_dataset=lm_dataset(tokenizer, NARROW_TASK),
                   processing_class=tokenizer if with_tokenizer else None)


def readings(cb: ActuatorCallback, key: str) -> list[int]:
    return [h["step"] for h in cb.session.history if key in h["probes"]]


def test_a_probes_own_every_wins_over_the_presets(tmp_path, char_tokenizer, sqlite_service):
    """preset:sft-capability probes KL drift every 10 steps; KLDrift(every=3) is the user's word."""
    trainer = sft_trainer(tmp_path, char_tokenizer, 12)
    probe = KLDrift(HELD_OUT, char_tokenizer, every=3, max_length=32)
    cb = ActuatorCallback("preset:sft-capability", connection=sqlite_service.url, probes=[probe],
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    trainer.train()
    assert probe.every == 3
    assert readings(cb, "kl_drift") == [0, 3, 6, 9, 12]


def test_a_presets_probe_intervals_shrink_with_max_steps(tmp_path, char_tokenizer, sqlite_service):
    """A 12-step run under preset:sft-capability (KL drift every 10, HotpotQA and perplexity every
    50) with a KLDrift of its class default every: one factor brings the most frequent probe to
    every max_steps // 6 = 2 steps, so the controller reads KL drift 6 times after the baseline and
    acts within the run; the guardrails' probes stay 5 times rarer, as the preset made them."""
    trainer = sft_trainer(tmp_path, char_tokenizer, 12)
    trainer.add_callback(SlowSteps())
    probe = KLDrift(HELD_OUT, char_tokenizer, max_length=32)
    cb = ActuatorCallback("preset:sft-capability", connection=sqlite_service.url, probes=[probe],
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    trainer.train()
    every = {p.name: p.every for p in cb.session.suite.probes}
    preset = {spec.name: spec.every for spec in load_preset("sft-capability").probes}
    assert every["kl_drift"] == 2 and every["hotpotqa"] == every["perplexity"] == 2 * preset["hotpotqa"] // preset[
        "kl_drift"]
    assert readings(cb, "kl_drift") == list(range(0, 13, 2))
    assert readings(cb, "perplexity") == [0, 10]
    assert any(e["step"] < 12 for e in cb.session.applied), cb.session.applied  # controlled within the run
    # A run long enough for the preset keeps its intervals.
    from actuator.agents.default_probes import fitted_intervals

    assert fitted_intervals(load_preset("sft-capability"), 100 * preset["hotpotqa"]) == preset


def test_a_preset_given_no_probes_builds_them_from_shipped_data(tmp_path, char_tokenizer, sqlite_service):
    trainer = sft_trainer(tmp_path, char_tokenizer, 4)
    cb = ActuatorCallback("preset:sft-capability", connection=sqlite_service.url,
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    trainer.train()
    baseline = cb.session.history[0]["probes"]
    assert {"kl_drift", "perplexity", "hotpotqa.gold_logprob"} <= set(baseline), baseline
    # what the service stored is what the built probes measured
    report = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}/report").json()
    assert report["probes"]["hotpotqa.gold_logprob"][0] == [0.0, pytest.approx(baseline["hotpotqa.gold_logprob"])]


def test_a_probe_a_controller_reads_that_cannot_be_built_stops_train_start(tmp_path, char_tokenizer,
                                                                          sqlite_service):
    """No tokenizer on the trainer: KL drift (the controller's probe) cannot be built. Before this,
    the run trained with a warning and a controller that never acted."""
    trainer = sft_trainer(tmp_path, char_tokenizer, 4, with_tokenizer=False)
    ActuatorCallback("preset:sft-capability", connection=sqlite_service.url).attach(trainer)
    with pytest.raises(ConfigError, match=r"probes\.kl_drift: controller drift-lr .*processing_class.*probes=\["):
        trainer.train()
    assert trainer.state.global_step == 0
    assert httpx.get(f"{sqlite_service.url}/v1/runs").json() == []  # nothing registered


def test_draft_acceptance_without_a_teacher_is_named_at_train_start(tmp_path, char_tokenizer, sqlite_service):
    policy = {"name": "draft-lr", "probes": [{"name": "draft", "every": 2}],
              "controllers": [{"name": "accept-lr", "probe": "draft.acceptance", "knob": "learning_rate",
                               "setpoint": 0.7, "kp": 1.0}]}
    trainer = sft_trainer(tmp_path, char_tokenizer, 4)
    ActuatorCallback(policy, connection=sqlite_service.url).attach(trainer)
    with pytest.raises(ConfigError, match=r"probes\.draft: controller accept-lr .*teacher.*DraftAcceptance\("):
        trainer.train()
    assert trainer.state.global_step == 0


def test_a_guardrails_probe_that_cannot_be_built_is_warned_and_training_runs(tmp_path, char_tokenizer,
                                                                             sqlite_service, caplog):
    trainer = sft_trainer(tmp_path, char_tokenizer, 4, with_tokenizer=False)
    cb = ActuatorCallback("preset:sft-capability", connection=sqlite_service.url, reporting=Reporting(budget_share=1.0),
                          probes=[KLDrift(HELD_OUT, char_tokenizer, max_length=32)]).attach(trainer)
    with caplog.at_level(logging.WARNING, logger="actuator.agents"):
        trainer.train()
    assert trainer.state.global_step == 4 and cb.session.run_id is not None
    never = [r.getMessage() for r in caplog.records if "can never fire" in r.getMessage()]
    rails = {g.name: g.probe for g in load_preset("sft-capability").guardrails}
    assert len(never) == len(rails), never
    for name in rails:
        assert any(f"guardrail {name} " in m for m in never), never


class OverrideAt(TrainerCallback):
    """An operator sets a knob through the REST API at a step boundary (a decision like any other)."""

    def __init__(self, cb: ActuatorCallback, url: str, *, step: int, knob: str, value: float) -> None:
        self.cb, self.url, self.step, self.knob, self.value = cb, url, step, knob, value

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            r = httpx.post(f"{self.url}/v1/runs/{self.cb.session.run_id}/knobs/{self.knob}/override",
                           json={"value": self.value, "note": "test"})
            assert r.status_code == 200, r.text


def conversational_pairs(n: int = 12):
    def msg(role: str, text: str) -> list[dict]:
        return [{"role": role, "content": text}]

    return datasets.Dataset.from_list([{"prompt": msg("user", f"{a}+1="), "chosen": msg("assistant", str(a + 1)),
                                        "rejected": msg("assistant", str(a + 2))} for a in range(n)])


@pytest.mark.parametrize("added", ["callbacks", "add_callback"])
def test_dpo_preset_alone_puts_the_kl_anchor_on_the_trainers_own_pairs(added, tmp_path, char_tokenizer,
                                                                       sqlite_service):
    """``DPOTrainer(..., callbacks=[ActuatorCallback("preset:dpo-kl")])``, conversational pairs,
    nothing else: the anchor is built from the pairs the trainer tokenized (prompt + chosen), its
    weight is a knob of the run (an operator's override at step 3 is a decision the agent applies),
    and the DPO loss runs the anchor term from then on. Attached inside train() (``add_callback``)
    too."""
    from trl import DPOConfig, DPOTrainer

    from actuator.agents.anchor import KLAnchorKnob

    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    pairs = conversational_pairs()
    args = DPOConfig(output_dir=str(tmp_path / "dpo"), max_steps=14, per_device_train_batch_size=2,
                     learning_rate=3e-2, lr_scheduler_type="constant", max_length=32, use_cpu=True, report_to=[],
                     logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0,
                     bf16=False)
    model = tiny_llama(seed=0)
    cb = ActuatorCallback("preset:dpo-kl", connection=sqlite_service.url, reporting=Reporting(budget_share=1.0))
    trainer = DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, train_dataset=pairs,
                         processing_class=tok, callbacks=[cb] if added == "callbacks" else None)
    if added == "add_callback":
        trainer.add_callback(cb)
    trainer.add_callback(OverrideAt(cb, sqlite_service.url, step=3, knob="kl_weight", value=0.25))
    trainer.add_callback(SlowSteps())
    trainer.train()

    anchor = trainer.kl_anchor
    assert isinstance(cb.session.setters["kl_weight"], KLAnchorKnob) and cb.session.setters["kl_weight"].anchor is anchor
    data = trainer.train_dataset  # as DPOTrainer tokenized it: the chat template applied
    assert anchor.token_ids == [(row["prompt_ids"] + row["chosen_ids"])[:anchor.max_length] for row in data]
    raised = [e for e in cb.session.applied if e["knob"] == "kl_weight" and e["applied"] > 0]
    assert raised and raised[0]["step"] < args.max_steps, cb.session.applied
    assert anchor.forwards > 0  # the loss ran the anchor term once its weight was above 0


def test_the_run_says_where_to_find_it_at_warning(tmp_path, char_tokenizer, sqlite_service, caplog):
    trainer = sft_trainer(tmp_path, char_tokenizer, 2)
    cb = ActuatorCallback({"name": "plain", "controllers": []}, connection=sqlite_service.url).attach(trainer)
    with caplog.at_level(logging.WARNING, logger="actuator.agents"):
        trainer.train()
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "registered" in r.getMessage()]
    assert lines == [f"actuator: run {cb.session.run_id} registered (policy plain v1); console: "
                     f"{sqlite_service.url}/ui/runs/{cb.session.run_id}"]
    assert httpx.get(f"{sqlite_service.url}/ui/runs/{cb.session.run_id}").status_code == 200


def test_a_404_at_registration_says_to_check_the_url(tmp_path, char_tokenizer, sqlite_service):
    """A base URL with a path the service does not serve: POST <url>/v1/runs answers 404. Before,
    the message said to fix the policy or knobs."""
    trainer = sft_trainer(tmp_path, char_tokenizer, 2)
    url = f"{sqlite_service.url}/actuator"
    ActuatorCallback({"name": "plain", "controllers": []}, connection=url).attach(trainer)
    with pytest.raises(ConfigError, match=r"404.*Check url / ACTUATOR_URL") as err:
        trainer.train()
    assert url in str(err.value) and "policy or knobs" not in str(err.value)
    assert trainer.state.global_step == 0


def test_a_404_from_something_else_at_the_url_says_to_check_it_and_training_runs(tmp_path, char_tokenizer, caplog):
    """A web server that is not the service answers 404 without the service's error envelope: an
    outage (training starts uncontrolled, registration is retried), now with the URL to check."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse

    sys.path.insert(0, str(ROOT / "tests" / "hardening"))
    from harden import ServedApp

    app = Starlette()
    app.add_route("/{path:path}", lambda request: PlainTextResponse("Not Found", status_code=404), methods=["GET", "POST"])
    trainer = sft_trainer(tmp_path, char_tokenizer, 2)
    with ServedApp(app) as served:
        ActuatorCallback({"name": "plain", "controllers": []},
                         connection=Connection(served.url, flush_timeout=0.5)).attach(trainer)
        with caplog.at_level(logging.WARNING, logger="actuator.agents"):
            trainer.train()
    assert trainer.state.global_step == 2
    off = [r.getMessage() for r in caplog.records if "control is OFF" in r.getMessage()]
    assert len(off) == 1 and "404" in off[0] and f"check url / ACTUATOR_URL ({served.url})" in off[0], off


def test_rl_kl_states_one_beta_start(tmp_path, char_tokenizer):
    """The error that refuses beta 0, the preset and the README's TRL commands name the same start."""
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=str(tmp_path / "grpo"), max_steps=1, per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=4, beta=0.0, use_cpu=True, report_to=[], save_strategy="no", bf16=False)
    trainer = GRPOTrainer(model=tiny_llama(seed=0), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=args, train_dataset=datasets.Dataset.from_dict({"prompt": ["1+1=", "2+2="]}),
                          processing_class=char_tokenizer)
    with pytest.raises(KnobNotSupported) as err:
        KLBetaKnob(trainer)
    start = re.search(r"Start it at beta=([0-9.]+)", str(err.value)).group(1)
    assert f"--beta {start}" in str(err.value)
    preset = (ROOT / "actuator" / "presets" / "rl-kl.yaml").read_text()
    assert re.findall(r"Start beta at ([0-9.]+)", preset) == [start]
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## With TRL's scripts"):]
    commands = [ln for ln in section.splitlines() if ln.startswith(("python grpo.py", "python rloo.py"))]
    assert commands and all(f"--beta {start} " in ln for ln in commands), commands
    assert f"GRPOConfig(beta={start})" in readme


def test_pair_token_ids_reads_pairs_as_a_trainer_would(char_tokenizer):
    """Untokenized pairs (a trainer that keeps only prompt / chosen): plain strings concatenated,
    message lists through the chat template; a dataset without pairs gives nothing to anchor on."""
    from actuator.agents.anchor import pair_token_ids

    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    plain = datasets.Dataset.from_dict({"prompt": ["1+1=", "2+2="], "chosen": ["2", "4"], "rejected": ["3", "5"]})
    assert pair_token_ids(plain, tok) == [tok("1+1=2")["input_ids"], tok("2+2=4")["input_ids"]]
    chats = conversational_pairs(3)
    text = tok.apply_chat_template(chats[1]["prompt"] + chats[1]["chosen"], tokenize=False)
    assert pair_token_ids(chats, tok)[1] == tok(text, add_special_tokens=False)["input_ids"]
    assert len(pair_token_ids(conversational_pairs(100), tok, limit=64)) == 64
    assert pair_token_ids(datasets.Dataset.from_dict({"text": ["a b"]}), tok) == []
