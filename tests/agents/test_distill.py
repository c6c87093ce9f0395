"""Distillation loss and the distill_lambda / gkd_beta knobs, on tiny random models."""

from __future__ import annotations


import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from actuator.agents.distill import (
    ACCEPTANCE_FLOOR,
    DistillationTrainer,
    DistillLambdaKnob,
    GKDBetaKnob,
    distillation_loss,
    mix_weights,
    token_filter_mask,
)
from actuator.agents.knobs import KnobNotSupported, KnobSetter
from actuator.agents.models import tiny_llama

T = 2.0


def _args(tmp_path, **kw) -> TrainingArguments:
    base = dict(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=2, learning_rate=1e-3,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
    )
    base.update(kw)
    return TrainingArguments(**base)


def _examples(n: int = 8, length: int = 10, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(3, 128, (length,), generator=g)
        labels = ids.clone()
        labels[:3] = -100  # prompt
        if i % 2:
            labels[-2:] = -100  # padding
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    return out


def _batch(examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([e[k] for e in examples]) for k in examples[0]}


def _trainer(tmp_path, lam: float = 0.5, cls: type = DistillationTrainer, **kw) -> DistillationTrainer:
    return cls(
        model=tiny_llama(seed=0), teacher_model=tiny_llama(seed=1), args=_args(tmp_path, **kw),
        train_dataset=_examples(), distill_lambda=lam, temperature=T,
    )


def _hand_loss(student, teacher, batch, lam: float) -> tuple[float, float, float]:  # noqa: ANN001
    """Loop over valid (b, i) pairs: logits at i predict labels[i + 1]."""
    with torch.no_grad():
        s = student(input_ids=batch["input_ids"]).logits
        t = teacher(input_ids=batch["input_ids"]).logits
    kls, ces = [], []
    labels = batch["labels"]
    for b in range(labels.shape[0]):
        for i in range(labels.shape[1] - 1):
            y = labels[b, i + 1].item()
            if y == -100:
                continue
            p_t = torch.softmax(t[b, i] / T, -1)
            kls.append((p_t * (torch.log_softmax(t[b, i] / T, -1) - torch.log_softmax(s[b, i] / T, -1))).sum())
            ces.append(-torch.log_softmax(s[b, i], -1)[y])
    kl, ce = torch.stack(kls).mean().item(), torch.stack(ces).mean().item()
    return lam * T * T * kl + (1 - lam) * ce, kl, ce


def test_loss_equals_hand_computed(tmp_path) -> None:
    trainer = _trainer(tmp_path, lam=0.3)
    batch = _batch(_examples(4))
    expected, kl, ce = _hand_loss(trainer.model, trainer.teacher_model, batch, 0.3)
    loss = trainer.compute_loss(trainer.model, dict(batch))
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    n_valid = int((batch["labels"][:, 1:] != -100).sum())
    loss_n = trainer.compute_loss(trainer.model, dict(batch), num_items_in_batch=torch.tensor(n_valid))
    assert loss_n.item() == pytest.approx(expected, rel=1e-5)


def test_lambda_one_is_pure_kl_and_zero_is_pure_ce(tmp_path) -> None:
    trainer = _trainer(tmp_path, lam=1.0)
    batch = _batch(_examples(4))
    _, kl, ce = _hand_loss(trainer.model, trainer.teacher_model, batch, 1.0)
    assert trainer.compute_loss(trainer.model, dict(batch)).item() == pytest.approx(T * T * kl, rel=1e-5)
    trainer.distill_lambda = 0.0
    loss = trainer.compute_loss(trainer.model, dict(batch))
    assert loss.item() == pytest.approx(ce, rel=1e-5)
    # independent check of the causal shift and masking: HF's own causal-LM loss
    with torch.no_grad():
        hf = trainer.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
    assert loss.item() == pytest.approx(hf.item(), rel=1e-5)
    # λ = 0: the teacher does not reach the gradient
    loss.backward()
    assert all(p.grad is None for p in trainer.teacher_model.parameters())


def test_knob_change_mid_run_is_used_by_next_step(tmp_path) -> None:
    used: list[tuple[int, float]] = []

    class Recording(DistillationTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # noqa: ANN001
            used.append((self.state.global_step, self.distill_lambda))
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    trainer = _trainer(tmp_path, lam=0.5, cls=Recording)
    knob = DistillLambdaKnob(trainer)
    applied = {}

    class Change(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            if state.global_step == 2:
                applied["value"] = knob.apply(0.9)

    trainer.add_callback(Change())
    trainer.train()
    assert applied["value"] == 0.9 and knob.read() == 0.9
    assert used == [(0, 0.5), (1, 0.5), (2, 0.9), (3, 0.9)]
    logs = [h for h in trainer.state.log_history if "distill_lambda" in h]
    assert [h["distill_lambda"] for h in logs] == [0.5, 0.5, 0.9, 0.9]
    for h in logs:  # the loss the trainer backpropagated was built from the logged components
        lam = h["distill_lambda"]
        assert h["loss"] == pytest.approx(lam * T * T * h["distill_kl"] + (1 - lam) * h["distill_ce"], rel=1e-4)


def test_distill_lambda_knob_bounds_and_refusals(tmp_path) -> None:
    trainer = _trainer(tmp_path)
    knob = DistillLambdaKnob(trainer)
    assert isinstance(knob, KnobSetter) and knob.name == "distill_lambda" and knob.read() == 0.5
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError):
            knob.apply(bad)
    assert trainer.distill_lambda == 0.5
    assert knob.apply(0) == 0.0
    plain = Trainer(model=tiny_llama(), args=_args(tmp_path))
    with pytest.raises(KnobNotSupported):
        DistillLambdaKnob(plain)
    with pytest.raises(KnobNotSupported):
        GKDBetaKnob(trainer)
    with pytest.raises(ValueError):
        _trainer(tmp_path, lam=1.2)


def make_gkd(tmp_path, monkeypatch, trainer_cls=None, *, steps: int = 3, callbacks=None):
    """A TRL GKDTrainer (lmbda 0, beta 0.5) on tiny random models, word-level data."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    pytest.importorskip("trl")
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(125)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")

    def collate(examples):  # noqa: ANN001
        ids = torch.tensor([e["input_ids"] for e in examples])
        labels = ids.clone()
        labels[:, :4] = -100
        return {
            "input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels,
            "prompts": ids[:, :4], "prompt_attention_mask": torch.ones_like(ids[:, :4]),
        }

    g = torch.Generator().manual_seed(0)
    data = Dataset.from_list([{"input_ids": torch.randint(3, 128, (10,), generator=g).tolist()} for _ in range(8)])
    args = GKDConfig(
        output_dir=str(tmp_path), max_steps=steps, per_device_train_batch_size=2, lmbda=0.0, beta=0.5,
        max_new_tokens=3, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
    )
    return (trainer_cls or GKDTrainer)(
        model=tiny_llama(seed=0), teacher_model=tiny_llama(seed=1), args=args, train_dataset=data,
        processing_class=tokenizer, data_collator=collate, callbacks=callbacks,
    )


def test_gkd_knobs_set_what_trl_reads_each_step(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    pytest.importorskip("trl")
    from trl.experimental.gkd import GKDTrainer

    betas: list[tuple[int, float]] = []
    on_policy: list[int] = []

    class Recording(GKDTrainer):
        def generalized_jsd_loss(self, *args, **kw):  # noqa: ANN002, ANN003
            betas.append((self.state.global_step, kw["beta"]))
            return GKDTrainer.generalized_jsd_loss(*args, **kw)

        def generate_on_policy_outputs(self, model, inputs, generation_config):  # noqa: ANN001
            on_policy.append(self.state.global_step)
            return GKDTrainer.generate_on_policy_outputs(model, inputs, generation_config)

    trainer = make_gkd(tmp_path, monkeypatch, Recording)
    args = trainer.args
    lam_knob, beta_knob = DistillLambdaKnob(trainer), GKDBetaKnob(trainer)
    assert lam_knob.attr == "lmbda" and lam_knob.read() == 0.0 and beta_knob.read() == 0.5

    class Change(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            if state.global_step == 1:
                lam_knob.apply(1.0)  # every later step trains on student generations
                beta_knob.apply(0.1)

    trainer.add_callback(Change())
    trainer.train()
    assert betas == [(0, 0.5), (1, 0.1), (2, 0.1)]
    assert on_policy == [1, 2]
    assert args.lmbda == 0.0 and args.beta == 0.5  # args are not what the loss reads
    with pytest.raises(ValueError):
        beta_knob.apply(2.0)


def test_a_gkd_trainer_brings_its_knobs_to_the_callback(tmp_path, monkeypatch, sqlite_service) -> None:
    """A policy on distill_lambda and gkd_beta: the callback finds both setters on a GKDTrainer."""
    from actuator.agents.callback import ActuatorCallback, Reporting

    policy = {"name": "gkd-knobs", "controllers": [
        {"name": "lam", "probe": "train.loss", "knob": "distill_lambda", "setpoint": 0.0, "kp": 0.01},
        {"name": "jsd", "probe": "train.loss", "knob": "gkd_beta", "setpoint": 0.0, "kp": 0.01}]}
    cb = ActuatorCallback(policy, connection=sqlite_service.url, reporting=Reporting(report_every=1))
    trainer = make_gkd(tmp_path, monkeypatch, steps=2, callbacks=[cb])
    trainer.train()
    assert isinstance(cb.session.setters["distill_lambda"], DistillLambdaKnob) and cb.session.setters["distill_lambda"].attr == "lmbda"
    assert isinstance(cb.session.setters["gkd_beta"], GKDBetaKnob)
    import httpx

    knobs = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}").json()["knobs"]
    # the starting values (train.loss reaches the controllers at every logged step, so a first tiny trim may be in)
    assert knobs["distill_lambda"]["value"] == 0.0 and knobs["gkd_beta"]["value"] == pytest.approx(0.5, abs=1e-3)


# -- the LK losses (issue 41) on toy distributions, numbers by hand ---------------------------------
# Teacher p and student q at one position (T = 1, λ = 1: the divergence alone), a second position
# where they agree (every divergence 0 there), so the per-token mean halves the first's value:
#   α = Σ min(p, q) = 0.2 + 0.3 + 0.2 = 0.7;  TV = ½ Σ|p − q| = ½ (0.3 + 0 + 0.3) = 0.3 = 1 − α
#   KL(p‖q) = 0.5 ln(0.5/0.2) + 0.3 ln 1 + 0.2 ln(0.2/0.5) = 0.3 ln 2.5 = 0.274887...
#   −ln α = −ln 0.7 = 0.356675...
P = torch.tensor([[[0.5, 0.3, 0.2], [0.25, 0.25, 0.5]]])
Q = torch.tensor([[[0.2, 0.3, 0.5], [0.25, 0.25, 0.5]]])
LABELS = torch.tensor([[0, 1]])
KL_HAND = 0.3 * 0.9162907318741551  # 0.3 ln 2.5
NLA_HAND = 0.35667494393873245  # -ln 0.7


def _lk(divergence, student=Q.log(), normalise=True) -> torch.Tensor:  # noqa: ANN001
    return distillation_loss(student, P.log(), LABELS, 1.0, 1.0, shifted=True, divergence=divergence,
                             normalise=normalise)[0]


def test_neg_log_acceptance_is_minus_log_alpha_per_position() -> None:
    assert _lk("neg_log_acceptance").item() == pytest.approx(NLA_HAND / 2, rel=1e-6)
    assert _lk("tv").item() == pytest.approx(0.3 / 2, rel=1e-6)
    assert _lk("forward").item() == pytest.approx(KL_HAND / 2, rel=1e-6)


def test_the_lk_hybrid_is_kl_plus_lambda_tv() -> None:
    for lam in (0.0, 0.4, 1.0):
        weights = mix_weights(lam, form="hybrid")
        assert weights == {"forward": 1.0, "reverse": 0.0, "tv": lam, "neg_log_acceptance": 0.0}
        assert _lk(weights, normalise=False).item() == pytest.approx((KL_HAND + lam * 0.3) / 2, rel=1e-6)
    # the blend form of the same mix: (1 − m)·KL + m·TV
    assert _lk(mix_weights(0.4)).item() == pytest.approx((0.6 * KL_HAND + 0.4 * 0.3) / 2, rel=1e-6)


def test_acceptance_is_clamped_away_from_zero() -> None:
    # disjoint supports: α underflows to 0; the loss is −ln(floor) per position, finite, gradient too
    teacher = torch.tensor([[[0.0, -200.0, -200.0]]])
    student = torch.tensor([[[-200.0, 0.0, -200.0]]], requires_grad=True)
    loss = distillation_loss(student, teacher, torch.tensor([[0]]), 1.0, 1.0, shifted=True,
                             divergence="neg_log_acceptance")[0]
    assert loss.item() == pytest.approx(-torch.log(torch.tensor(ACCEPTANCE_FLOOR)).item(), rel=1e-6)
    loss.backward()
    assert torch.isfinite(student.grad).all()


@pytest.mark.parametrize("divergence, normalise", [("neg_log_acceptance", True),
                                                   (mix_weights(0.5, form="hybrid"), False)])
def test_a_gradient_step_of_each_lk_loss_raises_acceptance(divergence, normalise) -> None:
    logits = Q.log().clone().requires_grad_(True)
    _lk(divergence, logits, normalise).backward()
    with torch.no_grad():
        stepped = logits - 0.5 * logits.grad
    alpha = lambda x: torch.minimum(torch.softmax(x[0, 0], -1), P[0, 0]).sum().item()  # noqa: E731
    assert alpha(Q.log()) == pytest.approx(0.7, rel=1e-6)
    assert alpha(stepped) > 0.7 + 1e-3


def test_neg_log_acceptance_scales_tvs_gradient_by_one_over_alpha() -> None:
    # d(−ln α)/dq = −(1/α)·dα/dq = (1/α)·dTV/dq: the same direction, 1/0.7 as large
    grads = []
    for divergence in ("neg_log_acceptance", "tv"):
        logits = Q.log().clone().requires_grad_(True)
        _lk(divergence, logits).backward()
        grads.append(logits.grad[0, 0])
    assert torch.allclose(grads[0], grads[1] / 0.7, atol=1e-6)


# -- the AdaSPEC token filter (issue 41) on toy distributions, numbers by hand ------------------------
# Teacher p = [½, ½] at four positions; student q and reference r (a draft-sized model distilled
# from the teacher) per position, T = 1, λ = 1:
#   pos 0: q [.5 .5] KL_q 0;           r [.5 .5] KL_r 0;           gap 0
#   pos 1: q [.8 .2] KL_q ½ ln 1.5625; r [.5 .5] KL_r 0;           gap +0.2231
#   pos 2: q [.2 .8] KL_q ½ ln 1.5625; r [.1 .9] KL_r ½ ln(25/9);   gap −0.2877 (the reference fits it worse)
#   pos 3: q [.9 .1] KL_q ½ ln(25/9);  r [.8 .2] KL_r ½ ln 1.5625;  gap +0.2877
# KL([½ ½] ‖ [a, 1−a]) = ½ ln(1 / (4a(1−a))): a = .8 → ½ ln 1.5625, a = .9 → ½ ln(25/9).
# Smallest gaps first: pos 2, pos 0, pos 1, pos 3.
KL8 = 0.5 * 0.44628710262841953  # ½ ln 1.5625
KL9 = 0.5 * 1.0216512475319814  # ½ ln(25/9)
FP = torch.tensor([[[0.5, 0.5]] * 4]).log()
FQ = torch.tensor([[[0.5, 0.5], [0.8, 0.2], [0.2, 0.8], [0.9, 0.1]]]).log()
FR = torch.tensor([[[0.5, 0.5], [0.5, 0.5], [0.1, 0.9], [0.8, 0.2]]]).log()
FLABELS = torch.tensor([[0, 1, 0, 1]])


def _filtered(fraction: float, lam: float = 1.0, divergence: str = "forward") -> float:
    return distillation_loss(FQ, FP, FLABELS, lam, 1.0, shifted=True, divergence=divergence, token_filter=fraction,
                             reference_logits=FR)[0].item()


@pytest.mark.parametrize("fraction, kept", [(0.0, 0 + KL8 + KL8 + KL9), (0.25, 0 + KL8 + KL9), (0.3, 0 + KL8 + KL9),
                                            (0.5, KL8 + KL9), (0.75, KL9)])
def test_the_token_filter_drops_the_smallest_reference_gaps_from_the_divergence(fraction, kept) -> None:
    # ⌊x·4⌋ positions leave the divergence sum; the per-token mean still divides by all 4
    assert _filtered(fraction) == pytest.approx(kept / 4, rel=1e-6)


def test_the_token_filter_mask_and_what_it_leaves_alone() -> None:
    gap_q = torch.tensor([0.0, KL8, KL8, KL9])
    gap_r = torch.tensor([0.0, 0.0, KL9, KL8])
    assert token_filter_mask(gap_q, gap_r, 0.5).tolist() == [False, True, False, True]
    assert token_filter_mask(gap_q, gap_r, 0.0).all()
    # TV is filtered by the same (KL) gaps: pos 2 (TV 0.3) leaves, pos 1 (0.3) and pos 3 (0.4) stay
    assert _filtered(0.25, divergence="tv") == pytest.approx((0.3 + 0.4) / 4, rel=1e-6)
    # the cross-entropy term keeps every position: only the divergence half moves
    ce = torch.nn.functional.cross_entropy(FQ[0], FLABELS[0]).item()
    assert _filtered(0.25, lam=0.5) == pytest.approx(0.5 * (KL8 + KL9) / 4 + 0.5 * ce, rel=1e-6)
    with pytest.raises(ValueError, match="reference_logits"):
        distillation_loss(FQ, FP, FLABELS, 1.0, 1.0, shifted=True, token_filter=0.25)
    with pytest.raises(ValueError, match=r"token_filter must be in \[0, 1\)"):
        token_filter_mask(gap_q, gap_r, 1.0)


def test_the_token_filter_knob_is_read_every_step_and_needs_a_reference_model(tmp_path) -> None:
    from actuator.agents.distill import TokenFilterKnob

    reference = tiny_llama(seed=2)
    calls = []
    reference.register_forward_hook(lambda *a: calls.append(1))
    trainer = DistillationTrainer(model=tiny_llama(seed=0), teacher_model=tiny_llama(seed=1), args=_args(tmp_path),
                                  train_dataset=_examples(), distill_lambda=1.0, temperature=T,
                                  reference_model=reference)
    knob = TokenFilterKnob(trainer)
    assert isinstance(knob, KnobSetter) and knob.name == "distill_token_filter" and knob.read() == 0.0
    assert knob.bounds == (0.0, 0.9)  # the range the agent gives the controller: never the refused 1
    batch = _batch(_examples(4))
    unfiltered = trainer.compute_loss(trainer.model, dict(batch)).item()
    assert calls == []  # at 0 the reference never runs
    assert knob.apply(0.5) == 0.5
    filtered = trainer.compute_loss(trainer.model, dict(batch)).item()
    assert len(calls) == 1
    with torch.no_grad():
        s, t, r = (m(input_ids=batch["input_ids"]).logits for m in (trainer.model, trainer.teacher_model, reference))
    expected = distillation_loss(s, t, batch["labels"], 1.0, T, token_filter=0.5, reference_logits=r)[0].item()
    assert filtered == pytest.approx(expected, rel=1e-5) and filtered < unfiltered
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        knob.apply(1.0)
    with pytest.raises(KnobNotSupported, match="reference_model"):
        TokenFilterKnob(_trainer(tmp_path))
    with pytest.raises(ValueError, match="needs a reference_model"):
        DistillationTrainer(model=tiny_llama(seed=0), teacher_model=tiny_llama(seed=1), args=_args(tmp_path),
                            train_dataset=_examples(), token_filter=0.2)
