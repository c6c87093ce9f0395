"""LearningRateKnob under every HF scheduler type, in a plain PyTorch loop: the next optimizer
step uses the value applied, and the schedule's shape afterwards is the untouched schedule's."""

from __future__ import annotations

import pytest
import torch
from transformers import SchedulerType, get_scheduler

from actuator.agents.knobs import LearningRateKnob

METRIC_DRIVEN = ("reduce_lr_on_plateau", "greedy")  # step(metric), not LambdaLR
NAMES = [s.value for s in SchedulerType if s.value not in METRIC_DRIVEN]


def make(name: str):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW([{"params": [model.weight], "lr": 1e-3}, {"params": [model.bias], "lr": 1e-3}], lr=1e-3)
    kwargs = {"scheduler_specific_kwargs": {"num_decay_steps": 10}} if name == "warmup_stable_decay" else {}
    if name in ("cosine_with_min_lr", "cosine_warmup_with_min_lr"):
        kwargs = {"scheduler_specific_kwargs": {"min_lr": 1e-5}}
    sched = get_scheduler(name, opt, num_warmup_steps=3, num_training_steps=40, **kwargs)
    return model, opt, sched


def run(opt, sched, model, steps: int, used: list[float]) -> None:
    for _ in range(steps):
        used.append(opt.param_groups[0]["lr"])
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        sched.step()
        opt.zero_grad()


@pytest.mark.parametrize("name", NAMES)
def test_applied_peak_scales_the_schedule_from_the_next_step_on(name):
    model, opt, sched = make(name)
    twin_model, twin_opt, twin_sched = make(name)
    used: list[float] = []
    twin: list[float] = []
    run(opt, sched, model, 12, used)
    run(twin_opt, twin_sched, twin_model, 12, twin)
    knob = LearningRateKnob(opt, sched)
    assert knob.read() == pytest.approx(1e-3, rel=1e-12)  # the peak the user configured, mid-schedule
    assert knob.nominal() == knob.read()
    assert knob.apply(2.5e-4) == pytest.approx(2.5e-4, rel=1e-12)
    run(opt, sched, model, 10, used)
    run(twin_opt, twin_sched, twin_model, 10, twin)
    assert used[:12] == twin[:12]
    assert opt.param_groups[1]["lr"] == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12)  # groups keep ratio
    # from the very next step on, the lr is the untouched schedule scaled by the same factor:
    # warm-up and decay keep their shape, and nothing is undone at the next decision
    for k in range(12, 22):
        if "min_lr" in name and twin[k] <= 1e-5 * (1 + 1e-9):
            continue  # an absolute floor is not scaled
        assert used[k] == pytest.approx(twin[k] * 0.25, rel=1e-9, abs=1e-15), (name, k)


@pytest.mark.parametrize("name", ["linear", "cosine", "constant_with_warmup"])
def test_a_decision_at_the_same_peak_changes_nothing(name):
    """Holding the knob must not fight the schedule: re-applying the value read is a no-op."""
    model, opt, sched = make(name)
    twin_model, twin_opt, twin_sched = make(name)
    knob = LearningRateKnob(opt, sched)
    used: list[float] = []
    twin: list[float] = []
    for _ in range(6):
        run(opt, sched, model, 4, used)
        knob.apply(knob.read())
    run(twin_opt, twin_sched, twin_model, 24, twin)
    assert used == pytest.approx(twin, rel=1e-12)


def test_warm_up_from_zero_registers_and_applies_the_peak():
    model, opt, sched = make("linear")
    knob = LearningRateKnob(opt, sched)
    assert knob.current() == 0.0 and knob.read() == 1e-3  # first warm-up step runs at lr 0
    knob.apply(5e-4)
    used: list[float] = []
    run(opt, sched, model, 4, used)
    assert used == pytest.approx([0.0, 5e-4 / 3, 2 * 5e-4 / 3, 5e-4 * 37 / 37], rel=1e-9)


@pytest.mark.parametrize("name", METRIC_DRIVEN)
def test_metric_driven_schedulers_keep_the_applied_value(name):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    sched = get_scheduler(name, opt)
    knob = LearningRateKnob(opt, sched)
    assert knob.apply(3e-3) == pytest.approx(3e-3)
    sched.step(1.0)  # one epoch's metric: no plateau yet
    assert opt.param_groups[0]["lr"] == pytest.approx(3e-3)


def test_plain_optimizer_without_scheduler():
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    knob = LearningRateKnob(opt)
    assert knob.nominal() == 1e-2
    assert knob.apply(5e-3) == 5e-3 and opt.param_groups[0]["lr"] == 5e-3
