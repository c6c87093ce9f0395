"""kl_weight: the KL anchor on real Trainer.train() / SFTTrainer runs, under the constraint controller."""

from __future__ import annotations

import httpx
import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from actuator._exceptions import ConfigError
from actuator.agents.anchor import KLAnchor, KLAnchorKnob, anchor_trainer, bucket_kl
from actuator.agents.callback import ActuatorCallback, Reporting
from actuator.agents.models import tiny_llama
from actuator.agents.probes import AnswerKL, KLDrift

from agent_helpers import HELD_OUT, NARROW_TASK, SlowSteps, lm_dataset

ANCHOR_TEXTS = ["The river runs to the sea.", "Birds sing at dawn in the old oak tree.",
                "A kind word can change a day.", "Snow covered the quiet village overnight.",
                "He read the map and found the road home.", "Bread is baked early in the morning."]


def args(tmp_path, steps, **kw):
    base = dict(output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=4, learning_rate=5e-3,
                lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                seed=0, dataloader_num_workers=0, disable_tqdm=True)
    base.update(kw)
    return TrainingArguments(**base)


def anchored(tmp_path, tok, steps, weight=0.0, **kw):
    anchor = KLAnchor(ANCHOR_TEXTS, tok, weight=weight, batch_size=2, max_length=32, top_k=16, seed=0)
    trainer = anchor_trainer(Trainer)(model=tiny_llama(seed=0), args=args(tmp_path, steps, **kw),
                                      train_dataset=lm_dataset(tok, NARROW_TASK), kl_anchor=anchor)
    return trainer, anchor


class WeightsUsed(TrainerCallback):
    """The w each step's loss really used (read from the anchor after the step's forward)."""

    def __init__(self, anchor):
        self.anchor, self.used = anchor, []

    def on_step_end(self, args, state, control, **kw):
        self.used.append(self.anchor.last_weight)


def test_bucket_kl_is_exact_with_the_whole_vocabulary_and_a_lower_bound_otherwise():
    torch.manual_seed(0)
    ref, cur = torch.randn(2, 3, 40) * 2, torch.randn(2, 3, 40) * 2
    lr = torch.log_softmax(ref, -1)
    full = (lr.exp() * (lr - torch.log_softmax(cur, -1))).sum(-1)
    for k, exact in ((40, True), (8, False)):
        top, idx = lr.topk(k, -1)
        tail = torch.log((-torch.expm1(torch.logsumexp(top, -1))).clamp_min(1e-30))
        got = bucket_kl(cur, idx, top, tail)
        if exact:
            assert torch.allclose(got, full, atol=1e-5)
        else:
            assert (got <= full + 1e-6).all() and (got > 0).all()


def test_weight_zero_makes_no_anchor_forward_and_changes_nothing(tmp_path, char_tokenizer):
    plain = Trainer(model=tiny_llama(seed=0), args=args(tmp_path / "p", 5),
                    train_dataset=lm_dataset(char_tokenizer, NARROW_TASK))
    plain.train()
    trainer, anchor = anchored(tmp_path / "a", char_tokenizer, 5, weight=0.0)
    trainer.train()
    assert anchor.forwards == 0  # no current-model forward on anchor batches
    assert anchor.reference_forwards == 3  # the cache, built once at train begin (6 texts / batch 2)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses == [h["loss"] for h in plain.state.log_history if "loss" in h]
    assert all(h.get("anchor/kl_weight") == 0.0 for h in trainer.state.log_history if "loss" in h)


def test_a_positive_weight_adds_the_term_and_logs_it(tmp_path, char_tokenizer):
    trainer, anchor = anchored(tmp_path, char_tokenizer, 4, weight=2.0)
    trainer.train()
    assert anchor.forwards == 4
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert all(h["anchor/kl_weight"] == 2.0 and "anchor/kl" in h for h in logs)
    assert logs[-1]["anchor/kl"] > 0  # the model moved away from its start
    # the weight is in the loss: the same run at w=0 has a different loss from step 2 on
    zero, _ = anchored(tmp_path / "z", char_tokenizer, 4, weight=0.0)
    zero.train()
    z = [h["loss"] for h in zero.state.log_history if "loss" in h]
    assert [h["loss"] for h in logs][1:] != z[1:]


def test_constraint_controller_turns_the_weight_the_loss_really_uses(tmp_path, char_tokenizer, sqlite_service):
    trainer, anchor = anchored(tmp_path, char_tokenizer, 24, weight=0.0)
    used = WeightsUsed(anchor)
    policy = {"name": "test-anchor", "controllers": [{
        "name": "drift-budget", "kind": "constraint", "probe": "kl_drift", "knob": "kl_weight", "setpoint": 0.0,
        "kp": 20.0, "ki": 10.0}]}
    cb = ActuatorCallback(policy, connection=sqlite_service.url, probes=[KLDrift(HELD_OUT, char_tokenizer, every=2,
                                                                          max_length=32)],
                          reporting=Reporting(budget_share=1.0),
                          ).attach(trainer)  # kl_weight comes with the policy: no knobs=
    trainer.add_callback(SlowSteps())
    trainer.add_callback(used)
    trainer.train()
    assert "kl_weight" in cb.session.setters and isinstance(cb.session.setters["kl_weight"], KLAnchorKnob)
    decisions = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}/decisions").json()["items"]
    mine = [d for d in decisions if d["knob"] == "kl_weight"]
    assert mine, "drift above a budget of 0 must raise the anchor weight"
    assert "constraint drift-budget active" in mine[0]["reason"]
    assert mine[0]["new_value"] > 0
    # Each step's loss used exactly the value applied at the boundary before it.
    value, applied = 0.0, {e["step"]: e["applied"] for e in cb.session.applied}
    by_number = {d["number"]: d["new_value"] for d in mine}
    for entry in cb.session.applied:
        assert entry["applied"] == pytest.approx(by_number[entry["number"]])
    for step, w in enumerate(used.used, start=1):
        assert w == pytest.approx(value), (step, w, value)
        value = applied.get(step, value)
    assert anchor.forwards == sum(1 for w in used.used if w > 0)


def test_anchor_state_survives_checkpoint_and_resume(tmp_path, char_tokenizer):
    class SetAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 1:
                KLAnchorKnob(anchor).apply(0.7)

    trainer, anchor = anchored(tmp_path, char_tokenizer, 4, save_strategy="steps", save_steps=2)
    trainer.add_callback(SetAt())
    trainer.train()
    start_cache = [tuple(t.clone() for t in entry) for entry in anchor.state_dict()["cache"]]
    resumed, anchor2 = anchored(tmp_path, char_tokenizer, 4, save_strategy="steps", save_steps=2)
    # a trained model in the new trainer: the reference must come from the checkpoint, not from it
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert anchor2.weight == 0.7
    assert anchor2.reference_forwards == 0  # not rebuilt from the checkpoint's (trained) weights
    for a, b in zip(start_cache, anchor2.state_dict()["cache"]):
        for x, y in zip(a, b):
            assert torch.equal(x, y)
    assert anchor2.forwards == anchor.forwards  # steps 3-4 ran the term again, same draws


def test_sft_trainer(tmp_path, char_tokenizer):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    def sft(weight, sub):
        anchor = KLAnchor(ANCHOR_TEXTS, char_tokenizer, weight=weight, batch_size=2, max_length=32, top_k=16)
        cfg = SFTConfig(output_dir=str(tmp_path / sub), max_steps=3, per_device_train_batch_size=4,
                        learning_rate=5e-3, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                        seed=0, disable_tqdm=True, max_length=32, bf16=False, dataset_text_field="text")
        trainer = anchor_trainer(SFTTrainer)(model=tiny_llama(seed=0), args=cfg, processing_class=char_tokenizer,
                                             train_dataset=Dataset.from_dict({"text": NARROW_TASK}), kl_anchor=anchor)
        trainer.train()
        return trainer, anchor

    t0, a0 = sft(0.0, "zero")
    t1, a1 = sft(3.0, "three")
    assert a0.forwards == 0 and a1.forwards == 3
    l0 = [h["loss"] for h in t0.state.log_history if "loss" in h]
    l1 = [h["loss"] for h in t1.state.log_history if "loss" in h]
    assert l0[1:] != l1[1:]
    assert all("anchor/kl" in h for h in t1.state.log_history if "loss" in h)


def test_plain_loop(char_tokenizer):
    model = tiny_llama(seed=0)
    anchor = KLAnchor(ANCHOR_TEXTS, char_tokenizer, top_k=8)
    anchor.setup(model)
    term = anchor.term(model)
    assert float(term) == 0.0 and anchor.forwards == 0
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    anchor.weight = 1.0
    term = anchor.term(model)
    term.backward()
    assert float(term) > 0 and anchor.forwards == 1
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_errors_name_what_to_do(tmp_path, char_tokenizer):
    with pytest.raises(ValueError, match="kl_weight"):
        KLAnchor(ANCHOR_TEXTS, char_tokenizer, weight=-1.0)
    model = tiny_llama(seed=0)
    anchor = KLAnchor(ANCHOR_TEXTS, char_tokenizer, weight=1.0)
    with pytest.raises(RuntimeError, match="setup"):
        anchor.loss(model)
    plain = Trainer(model=model, args=args(tmp_path, 1), train_dataset=lm_dataset(char_tokenizer, NARROW_TASK))
    cb = ActuatorCallback({"name": "x"}, knobs={"kl_weight": {}}, connection="http://127.0.0.1:9").attach(plain)
    with pytest.raises(ConfigError, match="anchor_trainer"):
        cb.on_train_begin(plain.args, plain.state, plain.control, model=model)
    with pytest.raises(TypeError, match="Trainer subclass"):
        anchor_trainer(dict)


@pytest.mark.parametrize("key", ["kl_drift", "answer_kl"])
def test_protect_one_liner_holds_its_budget_with_the_anchor_weight(tmp_path, char_tokenizer, sqlite_service, key):
    trainer, anchor = anchored(tmp_path, char_tokenizer, 32)
    probe = (KLDrift(HELD_OUT, char_tokenizer, every=2, max_length=32) if key == "kl_drift"
             else AnswerKL(HELD_OUT, char_tokenizer, answer_tokens=4, every=2))
    cb = ActuatorCallback(protect={key: 0.001}, connection=sqlite_service.url, reporting=Reporting(budget_share=1.0),
                          probes=[probe]).attach(trainer)
    trainer.add_callback(SlowSteps())
    trainer.train()
    assert cb.session.policy_doc.controllers[0].knob == "kl_weight" and cb.session.policy_doc.controllers[0].probe == key
    raised = [e for e in cb.session.applied if e["knob"] == "kl_weight"]
    assert raised and f"active: {key}" in raised[0]["reason"]
    assert cb.session.suite.probes[0].every == 10  # the policy's schedule: a budget needs frequent readings
    stored = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}").json()
    assert "kl_weight" in stored["knobs_in_effect"]
    assert any(e["knob"] == "kl_weight" for e in cb.session.applied) and anchor.weight > 0


def test_a_response_template_anchors_the_answer_positions_only(char_tokenizer):
    """With ``response_template`` the KL is the mean over the positions that predict the answer
    (from the template's last token on); the prompt before it is context; a text without the
    template counts whole."""
    model = tiny_llama(seed=0)
    text, plain = "Q: name a bird? A: an owl", "Snow fell."
    full = KLAnchor([text], char_tokenizer, batch_size=1, max_length=64, top_k=128)
    answers = KLAnchor([text], char_tokenizer, batch_size=1, max_length=64, top_k=128, response_template=" A:")
    whole = KLAnchor([plain], char_tokenizer, batch_size=1, max_length=64, top_k=128, response_template=" A:")
    for a in (full, answers, whole):
        a.setup(model)
    with torch.no_grad():
        ids = torch.tensor([char_tokenizer(text)["input_ids"]])
        ref = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        cur = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
    per_pos = (ref.exp() * (ref - cur)).sum(-1)[0]  # exact: top_k covers the whole vocabulary
    start = text.index(" A:") + len(" A:") - 1  # the ":" predicts the answer's first character
    for a in (full, answers, whole):
        a.weight = 1.0
    with torch.no_grad():
        assert float(answers.loss(model)) == pytest.approx(float(per_pos[start:].mean()), rel=1e-4)
        assert float(full.loss(model)) == pytest.approx(float(per_pos.mean()), rel=1e-4)
        assert float(answers.loss(model)) != pytest.approx(float(full.loss(model)), rel=1e-3)
        assert whole._starts == [0] and float(whole.loss(model)) > 0
    with pytest.raises(ValueError, match="response_template"):
        KLAnchor([text], char_tokenizer, response_template="")


def test_shipped_anchor_prompts_are_disjoint_from_the_probes():
    from actuator.agents.general import ANCHOR_PROMPTS, CONTROL_PROMPTS, PROBE_PROMPTS, topic_prompts

    prompts = topic_prompts()
    assert len(prompts) == len(set(prompts)) == 200 and not set(prompts) & set(PROBE_PROMPTS)
    # the controller's probe set shares no prompt with the judge's nor with any anchor
    assert not set(CONTROL_PROMPTS) & (set(PROBE_PROMPTS) | set(ANCHOR_PROMPTS) | set(prompts))
    assert len(set(CONTROL_PROMPTS)) == len(CONTROL_PROMPTS) == 12
    assert topic_prompts(7) == prompts[:7] and len({p.split()[0] for p in topic_prompts(5)}) > 2  # shapes mixed
    probe_topics = ("France", "sky", "spider", "colo", "thermometer", "sleep", "Spanish", "greeting")
    assert not [p for p in prompts if any(t.lower() in p.lower() for t in probe_topics)]


def test_word_prompts_act_on_quoted_words_and_stay_clear_of_every_probe_and_the_task():
    from actuator.agents.general import (
        ANCHOR_PROMPTS, CONTROL_PROMPTS, PROBE_PROMPTS, WORD_SHAPES, topic_prompts, word_prompts,
    )
    from benchmarks.control.data import WORDS

    prompts = word_prompts()
    assert len(prompts) == len(set(prompts)) == 120 and all(p.count("'") == 2 for p in prompts)
    assert not set(prompts) & (set(PROBE_PROMPTS) | set(CONTROL_PROMPTS) | set(ANCHOR_PROMPTS) | set(topic_prompts()))
    # no probe's or control prompt's word or language, no word the task reverses
    quoted = {p.split("'")[1] for p in prompts}
    held = {p.split("'")[1] for p in PROBE_PROMPTS + CONTROL_PROMPTS if p.count("'") == 2}
    assert held == {"good morning", "good night", "garden", "child", "quiet"} and not quoted & held
    assert not quoted & set(WORDS) and not [p for p in prompts if "Spanish" in p]
    # any prefix mixes the shapes: the first len(WORD_SHAPES) are one of each
    firsts = word_prompts(len(WORD_SHAPES))
    assert firsts == prompts[:len(WORD_SHAPES)] and len({p.split("'")[0] for p in firsts}) == len(WORD_SHAPES)
    assert word_prompts(0) == []
    for bad in (-1, 121):
        with pytest.raises(ValueError, match="words"):
            word_prompts(bad)


def test_self_answers_close_finished_answers_only(char_tokenizer):
    """An answer the model ended gets the template's end-of-turn; a cut-off one does not (closing it
    would teach an end where the model never ends)."""
    import copy

    from actuator.agents.general import response_template, self_answers

    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}|{% endfor %}"
                         "{% if add_generation_prompt %}a:{% endif %}")
    assert response_template(tok) == "a:"
    model = tiny_llama(seed=0)
    enc = tok(["u:hi|a:"], return_tensors="pt", add_special_tokens=False)
    first = int(model.generate(**enc, max_new_tokens=1, do_sample=False, pad_token_id=0)[0, -1])
    model.generation_config.eos_token_id = first  # the model's first answer token now ends the turn
    [ended] = self_answers(model, tok, ["hi"], max_new_tokens=6)
    assert ended == f"u:hi|a:{tok.decode([first])}|"  # (not a special token here, so kept as text), closed
    model.generation_config.eos_token_id = 3  # <unk>: never generated
    tok.eos_token = "<unk>"
    [cut] = self_answers(model, tok, ["hi"], max_new_tokens=6)
    assert cut.startswith("u:hi|a:") and not cut.endswith("|") and len(cut) > len("u:hi|a:") + 1
    [closed] = self_answers(model, tok, ["hi"], max_new_tokens=6, close_cut=True)  # the earlier behaviour
    assert closed.endswith("|") and closed.startswith(cut[:-1].rstrip())


def test_drift_sampling_returns_to_the_texts_that_drift_and_survives_a_checkpoint(char_tokenizer):
    """``sampling="drift"`` draws measured texts in proportion to their last KL: after the model
    changes on one text only, that text takes most of the draws; uniform sampling does not."""
    texts = ["aaaa aaaa aaaa", "zzzz zzzz zzzz"]
    model = tiny_llama(seed=0)
    drift = KLAnchor(texts, char_tokenizer, weight=1.0, batch_size=1, max_length=16, top_k=128, seed=0,
                     sampling="drift", priority=0.9)
    uniform = KLAnchor(texts, char_tokenizer, weight=1.0, batch_size=1, max_length=16, top_k=128, seed=0)
    for a in (drift, uniform):
        a.setup(model)
    with torch.no_grad():  # move the model on the 'a' text only: its embedding row
        model.get_input_embeddings().weight[char_tokenizer("a")["input_ids"][-1]] += 3.0
    counts = {"drift": [0, 0], "uniform": [0, 0]}
    with torch.no_grad():
        for _ in range(60):
            for name, a in (("drift", drift), ("uniform", uniform)):
                a.loss(model)
                counts[name][a.last_picks[0]] += 1
    kl = drift.state_dict()["text_kl"]
    assert kl[0] > 10 * kl[1]  # the measured per-text KL: the moved text drifts
    assert counts["drift"][0] >= 48  # ~0.9 x share of the KL + 0.1 x uniform ≈ 0.95 of 60
    assert 18 <= counts["uniform"][0] <= 42
    # the per-text KL is checkpoint state: a restored anchor draws the same texts next
    restored = KLAnchor(texts, char_tokenizer, weight=1.0, batch_size=1, max_length=16, top_k=128, seed=0,
                        sampling="drift", priority=0.9)
    restored.load_state_dict(drift.state_dict())
    with torch.no_grad():
        picks = [(drift.loss(model), drift.last_picks[0])[1] for _ in range(10)]
        again = [(restored.loss(model), restored.last_picks[0])[1] for _ in range(10)]
    assert picks == again
    with pytest.raises(ValueError, match="sampling"):
        KLAnchor(texts, char_tokenizer, sampling="kl")
    with pytest.raises(ValueError, match="priority"):
        KLAnchor(texts, char_tokenizer, sampling="drift", priority=1.5)


def test_reading_set_asks_the_probes_way_about_entities_the_probe_never_shows(char_tokenizer):
    """Reading anchor texts: the HotpotQA probe's own prompt (instruction, gold paragraphs kept,
    distractors cut first) with the model's own answer; no paragraph title of the shipped probe set."""
    import copy

    from actuator.agents.anchor import reading_set
    from actuator.agents.probes import build_prompt, generate_synthetic_hotpotqa, load_hotpotqa

    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}|{% endfor %}"
                         "{% if add_generation_prompt %}a:{% endif %}")
    model = tiny_llama(seed=0)
    model.generation_config.eos_token_id = 3  # <unk>: never generated, every answer is cut
    texts = reading_set(model, tok, n=3, max_prompt_tokens=600, max_new_tokens=5)
    records = generate_synthetic_hotpotqa(n_bridge=40, n_comparison=40, seed=1)[:3]
    shipped = {title for r in load_hotpotqa(None) for title, _ in r["context"]}
    assert len(texts) == 3
    for text, record in zip(texts, records):
        prompt = build_prompt(record, tok, max_prompt_tokens=600)
        assert text.startswith(prompt.text) and prompt.text.endswith("a:")
        assert f"Question: {record['question']}" in text and len(prompt.ids) <= 600
        gold = {t for t, _ in record["supporting_facts"]}
        assert all(f"{t}: " in prompt.text for t in gold)  # the paragraphs the question needs stay
        assert not any(f"{t}: " in text for t in shipped)
        enc = tok(prompt.text, return_tensors="pt", add_special_tokens=False)
        own = model.generate(**enc, max_new_tokens=5, do_sample=False, pad_token_id=0)[0, enc["input_ids"].shape[1]:]
        assert text[len(prompt.text):] == tok.decode(own, skip_special_tokens=True)  # cut: not closed
    first = int(model.generate(**tok(texts[0][:texts[0].rindex("a:") + 2], return_tensors="pt",
                                     add_special_tokens=False), max_new_tokens=1, do_sample=False,
                                pad_token_id=0)[0, -1])
    model.generation_config.eos_token_id = first  # the model now ends its answer at once: closed with "|"
    [ended] = reading_set(model, tok, n=1, max_prompt_tokens=600, max_new_tokens=5)
    assert ended.endswith("|") and ended.startswith(texts[0][:texts[0].rindex("a:") + 2])
    with pytest.raises(ValueError, match="n: only 1 reading records"):
        reading_set(model, tok, n=2, records=records[:1], max_prompt_tokens=600)
    with pytest.raises(ValueError, match="n must be >= 1"):
        reading_set(model, tok, n=0)


def test_a_split_range_controller_binds_both_legs_and_turns_the_values_the_step_really_uses(
        tmp_path, char_tokenizer, sqlite_service):
    """``kind: split_range`` on a real run: the policy's legs bring both knobs (no knobs=), and with
    KL above a target of ~0 the anchor weight the loss uses rises while the learning rate the
    optimizer uses falls to its leg's low end (the policy once declared the controller's own knob,
    None, and train() stopped at on_train_begin: no setter for knobs.None)."""
    peak = 5e-3
    trainer, anchor = anchored(tmp_path, char_tokenizer, 24, weight=0.0, learning_rate=peak)
    used = WeightsUsed(anchor)
    policy = {"name": "test-split", "controllers": [{
        "name": "kl", "kind": "split_range", "probe": "kl_drift", "setpoint": 1e-6, "gains": "relative",
        "kp": 0.5, "ki": 0.3, "legs": [
            {"knob": "learning_rate", "range": [0, 1], "values": [peak / 10, peak], "acts": "direct"},
            {"knob": "kl_weight", "range": [-1, 0], "values": [2.0, 0.0], "acts": "reverse"}]}]}
    cb = ActuatorCallback(policy, connection=sqlite_service.url, probes=[KLDrift(HELD_OUT, char_tokenizer, every=2,
                                                                          max_length=32)],
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    lrs = []

    class LearningRates(TrainerCallback):
        def on_step_end(self, args, state, control, optimizer=None, **kw):
            lrs.append(optimizer.param_groups[0]["lr"])

    trainer.add_callback(SlowSteps())
    trainer.add_callback(used)
    trainer.add_callback(LearningRates())
    trainer.train()
    assert set(cb.session.setters) == {"learning_rate", "kl_weight"} and isinstance(cb.session.setters["kl_weight"], KLAnchorKnob)
    decisions = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}/decisions").json()["items"]
    assert {d["knob"] for d in decisions} == {"learning_rate", "kl_weight"}
    assert all(d["reason"].startswith("split_range kl: kl_drift") for d in decisions)
    assert max(used.used) > 0 and anchor.forwards > 0  # the weight the loss used, raised by the anchor leg
    assert lrs[0] == pytest.approx(peak) and min(lrs) == pytest.approx(peak / 10)  # the rate the optimizer used
