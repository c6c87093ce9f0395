"""Structured width pruning of MLP channels under one threshold (``mlp_channel_threshold``): the
importance, the masks, grow-back, the sliced export, and a PID moving it in a real Trainer.
Tiny random models only (hidden 32, intermediate 64: a channel owns 32 + 32 + 32 parameters)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from actuator.agents.compression import ChannelThresholdKnob, channel_masks, export_pretrained, factorize
from actuator.agents.knobs import KnobNotSupported, KnobSetter
from actuator.agents.models import tiny_llama

from test_compression_threshold import _reload_elsewhere, pid_trainer

MLPS = ("model.layers.0.mlp", "model.layers.1.mlp")
PER_CHANNEL = 32 + 32 + 32


def _calibration(seed: int = 0, n: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 128, (4, 16), generator=g) for _ in range(n)]


def _knob(min_channels: int = 4, seed: int = 0) -> tuple[nn.Module, ChannelThresholdKnob, list[torch.Tensor]]:
    model = tiny_llama(seed=seed).eval()
    calib = _calibration(seed)
    return model, ChannelThresholdKnob(model, calib, min_channels=min_channels), calib


def _down_inputs(model: nn.Module, name: str, batches: list[torch.Tensor]) -> torch.Tensor:
    seen: list[torch.Tensor] = []
    handle = model.get_submodule(name).down_proj.register_forward_pre_hook(
        lambda m, args: seen.append(args[0].detach().reshape(-1, args[0].shape[-1])))
    with torch.no_grad():
        for b in batches:
            model(b)
    handle.remove()
    return torch.cat(seen)


def test_importance_is_what_masking_a_channel_costs_the_layers_output() -> None:
    model, knob, calib = _knob()
    name = MLPS[1]  # the last MLP: masking it does not change its own inputs
    h = _down_inputs(model, name, calib).double()
    w = model.get_submodule(name).down_proj.weight.detach().double()
    expected = h.norm(dim=0) * w.norm(dim=0)
    assert torch.allclose(knob.scores[name], expected, rtol=1e-5)
    outputs: list[torch.Tensor] = []
    handle = model.get_submodule(name).register_forward_hook(lambda m, a, out: outputs.append(out.detach().double()))
    with torch.no_grad():
        for b in calib:
            model(b)
    full = torch.cat([o.reshape(-1, 32) for o in outputs])
    for j in (0, 17, 63):
        keep = torch.ones(64, dtype=torch.bool)
        keep[j] = False
        knob._masks[name].set(keep)
        outputs.clear()
        with torch.no_grad():
            for b in calib:
                model(b)
        cut = torch.cat([o.reshape(-1, 32) for o in outputs])
        # Dropping channel j removes h_j · W[:, j] from every token's output: ‖Δ‖_F = ‖h_j‖·‖W[:, j]‖.
        assert (full - cut).norm().item() == pytest.approx(knob.scores[name][j].item(), rel=1e-4)
    handle.remove()


def test_threshold_sets_each_layers_width_and_the_parameter_count() -> None:
    model, knob, _ = _knob(min_channels=4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    param_ids = [id(p) for g in opt.param_groups for p in g["params"]]
    dense = sum(p.numel() for p in tiny_llama().parameters())
    assert isinstance(knob, KnobSetter) and knob.name == "mlp_channel_threshold"
    # Constructed at the lower bound: every channel in, the model as it was.
    assert knob.read() == knob.bounds[0] and knob.widths == {n: 64 for n in MLPS}
    assert knob.summary()["compression.params"] == dense
    scores = knob.scores
    tau = float(torch.sort(scores[MLPS[0]], descending=True).values[9])  # layer 0 keeps 10 channels
    knob.apply(tau)
    w1 = max(4, int((scores[MLPS[1]] >= tau).sum()))
    assert knob.widths == {MLPS[0]: 10, MLPS[1]: w1}
    expected = dense - (64 - 10) * PER_CHANNEL - (64 - w1) * PER_CHANNEL
    summary = knob.summary()
    assert summary["compression.params"] == expected == knob.params_at(tau)
    assert summary["compression.width.0.mlp"] == 10 and summary["compression.width_min"] == min(10, w1)
    assert summary["compression.pruned_channels"] == 128 - 10 - w1
    # The kept channels are the 10 most important ones, and the forward is the masked MLP's.
    keep = channel_masks(model)[MLPS[0]]
    assert set(torch.nonzero(keep).flatten().tolist()) == set(torch.topk(scores[MLPS[0]], 10).indices.tolist())
    mlp = model.get_submodule(MLPS[0])
    x = torch.randn(3, 32)
    with torch.no_grad():
        manual = (torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x) * keep) @ mlp.down_proj.weight.T
        assert torch.allclose(mlp(x), manual, atol=1e-6)
    # Above every score each layer keeps its min_channels most important channels.
    assert knob.widths_for(knob.bounds[1] * 2) == {n: 4 for n in MLPS}
    assert [id(p) for g in opt.param_groups for p in g["params"]] == param_ids


def test_masked_channels_get_no_gradient_and_grow_back_to_identical_logits() -> None:
    model, knob, _ = _knob(min_channels=4)
    ids = torch.randint(3, 128, (2, 9))
    with torch.no_grad():
        dense_logits = model(ids).logits.clone()
    knob.apply(knob.bounds[1])
    assert knob.widths == {n: 4 for n in MLPS}
    model.train()
    model(ids, labels=ids).loss.backward()
    for name in MLPS:
        mlp, keep = model.get_submodule(name), channel_masks(model)[name]
        for grad in (mlp.gate_proj.weight.grad[~keep], mlp.up_proj.weight.grad[~keep],
                     mlp.down_proj.weight.grad[:, ~keep]):
            assert torch.count_nonzero(grad) == 0
        assert torch.count_nonzero(mlp.gate_proj.weight.grad[keep]) > 0
    model.eval()
    with torch.no_grad():
        assert (model(ids).logits - dense_logits).abs().max().item() > 1e-3
        knob.apply(knob.bounds[0])
        assert knob.widths == {n: 64 for n in MLPS}
        assert torch.equal(model(ids).logits, dense_logits)


def test_the_sliced_export_has_the_masked_models_logits_without_actuator(tmp_path) -> None:
    model, knob, _ = _knob(min_channels=4)
    ordered = torch.sort(knob.scores[MLPS[0]], descending=True).values
    tau = next(float(t) for t in ordered[8:40] if len(set(knob.widths_for(float(t)).values())) == 2)
    knob.apply(tau)
    widths = knob.widths
    assert len(set(widths.values())) == 2  # one width per layer: needs the modeling file
    ids = torch.randint(3, 128, (2, 10))
    with torch.no_grad():
        before = model(ids).logits
    rep = export_pretrained(model, tmp_path / "width")
    assert rep["custom_code"] and rep["pruned_mlps"] == 2 and rep["factored_layers"] == 0
    assert rep["params"] == knob.summary()["compression.params"]
    assert knob.widths == widths and channel_masks(model)  # the live model keeps its masks
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)  # and still runs masked
    config = json.loads((tmp_path / "width" / "config.json").read_text())
    assert config["resized_layers"]["model.layers.0.mlp.up_proj"]["out_features"] == widths[MLPS[0]]
    assert config["resized_layers"]["model.layers.1.mlp.down_proj"]["in_features"] == widths[MLPS[1]]
    reloaded = _reload_elsewhere(str(tmp_path / "width"), ids)
    assert not reloaded["actuator_loaded"] and reloaded["class"] == "ActuatorPrunedLlamaForCausalLM"
    assert reloaded["params"] == rep["params"]
    assert (torch.tensor(reloaded["logits"]) - before).abs().max().item() < 1e-5
    assert reloaded["generated"] == 9


def test_equal_widths_export_as_a_plain_config(tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    model, knob, _ = _knob(min_channels=20)
    knob.apply(knob.bounds[1])
    assert knob.widths == {n: 20 for n in MLPS}
    ids = torch.randint(3, 128, (1, 7))
    with torch.no_grad():
        before = model(ids).logits
    rep = export_pretrained(model, tmp_path / "plain")
    assert not rep["custom_code"] and not (tmp_path / "plain" / "modeling_actuator_lowrank.py").exists()
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "plain").eval()  # no trust_remote_code
    assert type(plain).__name__ == "LlamaForCausalLM" and plain.config.intermediate_size == 20
    assert sum(p.numel() for p in plain.parameters()) == rep["params"] == knob.summary()["compression.params"]
    with torch.no_grad():
        assert (plain(ids).logits - before).abs().max().item() < 1e-5


def test_threshold_for_params_is_the_budget_view() -> None:
    _, knob, _ = _knob()
    target = knob.dense_params - 50 * PER_CHANNEL - 5
    tau = knob.threshold_for_params(target)
    assert knob.params_at(tau) <= target < knob.params_at(tau * 0.999)
    assert knob.params_at(tau) == knob.dense_params - 51 * PER_CHANNEL  # whole channels: one more than 50
    assert knob.read() == knob.bounds[0]  # asking changed nothing
    with pytest.raises(ValueError, match="params"):
        knob.threshold_for_params(10)


def test_bad_input_names_the_field() -> None:
    calib = _calibration()
    factored = tiny_llama()
    factorize(factored, calibration=calib)
    with pytest.raises(KnobNotSupported, match="gate_proj"):
        ChannelThresholdKnob(factored, calib)
    with pytest.raises(ValueError, match="calibration"):
        ChannelThresholdKnob(tiny_llama(), [])
    for bad in (0, 65, 2.5, True):
        with pytest.raises(ValueError, match="min_channels"):
            ChannelThresholdKnob(tiny_llama(), calib, min_channels=bad)  # type: ignore[arg-type]
    model, knob, _ = _knob()
    with pytest.raises(ValueError, match="already masked"):
        ChannelThresholdKnob(model, calib)
    for value in (0.0, -1.0, float("nan"), float("inf"), "x"):
        with pytest.raises(ValueError, match="mlp_channel_threshold"):
            knob.apply(value)  # type: ignore[arg-type]
    knob.remove()
    assert not channel_masks(model)
    ChannelThresholdKnob(model, calib)  # the masks are gone: a new knob may take the model


def test_pid_moves_the_channel_threshold_in_a_real_trainer(tmp_path, char_tokenizer, sqlite_service):
    import httpx
    from transformers import TrainerCallback

    from agent_helpers import SlowSteps

    model, knob, _ = _knob(min_channels=4)
    start = knob.read()
    dense = knob.dense_params
    trainer, cb = pid_trainer(tmp_path, char_tokenizer, sqlite_service.url, model, knob)
    in_forward: list[dict[str, int]] = []

    class Widths(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
            in_forward.append({n: int(m.keep.sum()) for n, m in knob._masks.items()})

    trainer.add_callback(SlowSteps(0.2))
    trainer.add_callback(Widths())
    trainer.train()

    assert cb.session.applied, "a perplexity far below its setpoint must raise the threshold"
    assert knob.read() > start and cb.session.applied[-1]["applied"] == pytest.approx(knob.read())
    assert knob.widths == knob.widths_for(knob.read())
    assert in_forward[0] == {n: 64 for n in MLPS} and in_forward[-1] != in_forward[0]
    assert cb.session.applied[-1]["summary"]["compression.params"] < dense
    seen = [h["metrics"] for h in cb.session.history if "compression.params" in h["metrics"]]
    assert seen and "compression.width.1.mlp" in seen[-1] and seen[-1]["compression.params"] < dense
    report = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}/report").json()
    assert "compression.params" in report["metrics"] and "compression.width.0.mlp" in report["metrics"]
    run = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}").json()
    assert run["knobs"]["mlp_channel_threshold"]["scale"] == "log"
    assert run["knobs"]["mlp_channel_threshold"]["min"] == pytest.approx(knob.bounds[0])
    assert run["knobs_in_effect"]["mlp_channel_threshold"] == pytest.approx(knob.read())


def test_default_rate_limit_is_fine_for_bunched_importances() -> None:
    import math

    from actuator.catalogue import default_knob_spec

    spec = default_knob_spec("mlp_channel_threshold", 2.0)
    assert spec["scale"] == "log" and spec["max_step"] == pytest.approx(math.log(1.05))
