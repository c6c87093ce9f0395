"""Low-rank compression: exactness, masking, mid-run rank changes under a real Trainer, export,
LoRA / AdaLoRA rank knobs. Tiny random models only."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from actuator.agents.compression import (
    AdaLoraBudgetKnob,
    LoraRankKnob,
    LowRankLinear,
    RankKnob,
    TruncatedLinear,
    active_rank,
    active_ranks,
    compression_stats,
    export_truncated,
    factorize,
    load_compressed,
    save_compressed,
    set_active_rank,
)
from actuator.agents.knobs import KnobNotSupported, KnobSetter
from actuator.agents.models import tiny_llama


def _linear(in_f: int = 24, out_f: int = 40, bias: bool = True, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(in_f, out_f, bias=bias)


def _truncated_svd_weight(weight: torch.Tensor, r: int) -> torch.Tensor:
    u, s, vh = torch.linalg.svd(weight.detach().double(), full_matrices=False)
    return (u[:, :r] @ torch.diag(s[:r]) @ vh[:r]).float()


# --- LowRankLinear -------------------------------------------------------------------------


def test_full_rank_equals_original_linear() -> None:
    lin = _linear()
    low = LowRankLinear.from_linear(lin)
    assert low.max_rank == low.active_rank == 24
    x = torch.randn(5, 7, 24)
    assert (low(x) - lin(x)).abs().max().item() < 1e-5


@pytest.mark.parametrize(("in_f", "out_f"), [(24, 40), (40, 24)])
def test_shrunk_rank_matches_hand_truncated_svd(in_f: int, out_f: int) -> None:
    lin = _linear(in_f, out_f)
    low = LowRankLinear.from_linear(lin)
    x = torch.randn(11, in_f)
    for r in (1, 5, 13):
        low.active_rank = r
        expected = x @ _truncated_svd_weight(lin.weight, r).T + lin.bias
        assert (low(x) - expected).abs().max().item() < 1e-5
    low.active_rank = 5
    assert not torch.allclose(low(x), lin(x), atol=1e-3)


def test_forward_slices_to_the_active_rank() -> None:
    low = LowRankLinear.from_linear(_linear())
    low.active_rank = 6
    seen: list[tuple[int, ...]] = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            if func is torch.nn.functional.linear:
                seen.append(tuple(args[1].shape))
            return func(*args, **(kwargs or {}))

    with Spy():
        low(torch.randn(3, 24))
    assert seen == [(6, 24), (40, 6)]  # rank-6 matmuls, not a full-rank product times a mask


def test_masked_components_get_zero_grad_and_keep_values_under_sgd() -> None:
    low = LowRankLinear.from_linear(_linear(), max_rank=16, init_rank=16)
    opt = torch.optim.SGD(low.parameters(), lr=0.1)
    low.active_rank = 4
    before = {n: p.detach().clone() for n, p in low.named_parameters()}
    low(torch.randn(8, 24)).pow(2).sum().backward()
    assert low.u.grad.shape == low.u.shape
    assert low.u.grad[:, 4:].abs().max() == 0 and low.u.grad[:, :4].abs().max() > 0
    assert low.s.grad[4:].abs().max() == 0 and low.s.grad[:4].abs().max() > 0
    assert low.vh.grad[4:].abs().max() == 0 and low.vh.grad[:4].abs().max() > 0
    opt.step()
    assert torch.equal(low.u[:, 4:], before["u"][:, 4:])
    assert torch.equal(low.vh[4:], before["vh"][4:])
    assert not torch.equal(low.vh[:4], before["vh"][:4])
    # growing back re-enables the kept (untouched) components
    low.active_rank = 16
    x = torch.randn(2, 24)
    manual = (x @ low.vh.T * low.s) @ low.u.T + low.bias
    assert torch.allclose(low(x), manual, atol=1e-6)


def test_activation_aware_truncation_beats_plain_svd_on_calibration_outputs() -> None:
    lin = _linear(bias=False)
    torch.manual_seed(1)
    x = torch.randn(256, 24) @ torch.diag(torch.logspace(0, -2, 24))  # anisotropic inputs
    gram = x.double().T @ x.double()
    plain = LowRankLinear.from_linear(lin)
    aware = LowRankLinear.from_linear(lin, input_gram=gram)
    assert (aware(x) - lin(x)).abs().max().item() < 1e-4  # full rank is still W
    for r in (4, 8, 16):
        plain.active_rank = aware.active_rank = r
        err_plain = (plain(x) - lin(x)).norm()
        err_aware = (aware(x) - lin(x)).norm()
        assert err_aware < err_plain
        # Eckart–Young in the whitened space: ‖(W − W_r)·L‖² = Σ discarded s², with L·Lᵀ = G + δI
        delta = 1e-3 * gram.diagonal().mean()
        w_err = lin.weight.double() - aware.dense_weight(r).double()
        whitened = err_aware.double() ** 2 + delta * w_err.pow(2).sum()
        u, sv, vh_w = torch.linalg.svd(lin.weight.double() @ torch.linalg.cholesky(gram + delta * torch.eye(24, dtype=torch.float64)))
        assert whitened.item() == pytest.approx(sv[r:].pow(2).sum().item(), rel=1e-3)
    # factors are balanced for the optimizer: u orthonormal, vh rows unit norm
    assert torch.allclose(aware.vh.detach().norm(dim=1), torch.ones(24), atol=1e-5)
    assert torch.allclose(aware.u.detach().T @ aware.u.detach(), torch.eye(24), atol=1e-5)


def test_factorize_with_calibration_keeps_full_rank_logits() -> None:
    model = tiny_llama().eval()
    ids = torch.randint(3, 128, (2, 9))
    ref = model(ids).logits
    calib = [{"input_ids": torch.randint(3, 128, (4, 16))} for _ in range(2)]
    factorize(model, calibration=calib)
    with torch.no_grad():
        assert (model(ids).logits - ref).abs().max().item() < 1e-4
    with pytest.raises(ValueError, match="never reached"):
        factorize(tiny_llama(), ["up_proj"], calibration=[])


def test_active_rank_survives_state_dict_round_trip() -> None:
    low = LowRankLinear.from_linear(_linear(), init_rank=7)
    fresh = LowRankLinear(24, 40, 24)
    fresh.load_state_dict(low.state_dict())
    assert fresh.active_rank == 7


def test_resolve_rank_arguments() -> None:
    lin = _linear()
    assert LowRankLinear.from_linear(lin, max_rank=0.5).max_rank == 12
    assert LowRankLinear.from_linear(lin, max_rank=100).max_rank == 24  # clipped
    assert LowRankLinear.from_linear(lin, max_rank=1).max_rank == 1  # int 1 = rank one
    assert LowRankLinear.from_linear(lin, max_rank=1.0).max_rank == 24  # float 1.0 = full
    with pytest.raises(ValueError):
        LowRankLinear.from_linear(lin, max_rank=0)
    with pytest.raises(ValueError):
        LowRankLinear.from_linear(lin, max_rank=1.5)


# --- model-level API -----------------------------------------------------------------------


def test_factorize_targets_and_errors() -> None:
    model = tiny_llama()
    names = factorize(model, ["up_proj"])
    assert names == ["model.layers.0.mlp.up_proj", "model.layers.1.mlp.up_proj"]
    assert isinstance(model.get_submodule(names[0]), LowRankLinear)
    names = factorize(model, r"model\.layers\.0\.self_attn\.(q|v)_proj", max_rank=4)
    assert names == ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj"]
    with pytest.raises(ValueError, match="no_such_proj"):
        factorize(model, ["no_such_proj"])
    with pytest.raises(ValueError, match="non-Linear"):
        factorize(model, ["mlp"])


def test_factorized_model_at_full_rank_has_same_logits() -> None:
    model = tiny_llama().eval()
    ids = torch.randint(3, 128, (2, 9))
    ref = model(ids).logits
    factorize(model)
    assert (model(ids).logits - ref).abs().max().item() < 1e-5


def test_set_active_rank_absolute_fraction_and_read_back() -> None:
    model = tiny_llama()
    factorize(model, ["up_proj", "down_proj"], max_rank=0.5)  # max rank 16 per layer (min(32,64)/2)
    factorize(model, ["gate_proj"], max_rank=8)
    set_active_rank(model, 12)
    ranks = active_ranks(model)
    assert ranks["model.layers.0.mlp.up_proj"] == 12 and ranks["model.layers.0.mlp.gate_proj"] == 8
    assert active_rank(model) == 12
    set_active_rank(model, 0.5)
    ranks = active_ranks(model)
    assert ranks["model.layers.1.mlp.down_proj"] == 8 and ranks["model.layers.1.mlp.gate_proj"] == 4


def test_compression_stats_hand_checked() -> None:
    model = tiny_llama()  # hidden 32, intermediate 64, vocab 128, 2 layers, no MLP bias
    total_dense = sum(p.numel() for p in model.parameters())
    dense_linear_flops = sum(2 * m.in_features * m.out_features for m in model.modules() if isinstance(m, nn.Linear))
    factorize(model, ["gate_proj"])
    set_active_rank(model, 8)
    stats = compression_stats(model)
    layer = stats["layers"]["model.layers.0.mlp.gate_proj"]
    # gate_proj: in 32, out 64, full rank 32, active 8
    assert layer["dense_params"] == 32 * 64 == 2048
    assert layer["params"] == 8 * (32 + 64) == 768
    assert layer["stored_params"] == 32 * (32 + 64 + 1) == 3104
    assert layer["dense_flops_per_token"] == 2 * 32 * 64 == 4096
    assert layer["flops_per_token"] == 2 * 8 * 96 == 1536
    fact = stats["factorized"]
    assert fact["params"] == 2 * 768 and fact["dense_params"] == 2 * 2048
    assert fact["param_ratio"] == pytest.approx(768 / 2048)
    whole = stats["model"]
    assert whole["dense_params"] == total_dense
    assert whole["params"] == total_dense - 2 * (2048 - 768)
    assert whole["dense_flops_per_token"] == dense_linear_flops
    assert whole["flops_per_token"] == dense_linear_flops - 2 * (4096 - 1536)


def test_export_save_load_fresh_model_same_logits_and_generate(tmp_path) -> None:
    model = tiny_llama().eval()
    factorize(model)
    set_active_rank(model, 5)
    ids = torch.randint(3, 128, (2, 10))
    with torch.no_grad():
        before = model(ids).logits
    predicted = compression_stats(model)["model"]["params"]
    export_truncated(model)
    assert not any(isinstance(m, LowRankLinear) for m in model.modules())
    pair = model.get_submodule("model.layers.0.mlp.down_proj")
    assert isinstance(pair, TruncatedLinear)
    assert pair.in_proj.weight.shape == (5, 64) and pair.out_proj.weight.shape == (32, 5)
    assert sum(p.numel() for p in model.parameters()) == predicted
    with torch.no_grad():
        assert (model(ids).logits - before).abs().max().item() < 1e-5
    save_compressed(model, tmp_path)
    del model

    fresh = load_compressed(tmp_path)  # new model object from the saved config
    assert sum(p.numel() for p in fresh.parameters()) == predicted
    with torch.no_grad():
        assert (fresh(ids).logits - before).abs().max().item() < 1e-5
    out = fresh.generate(ids[:1, :4], max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 9)


def test_save_load_live_lowrank_keeps_factors_and_rank(tmp_path) -> None:
    model = tiny_llama().eval()
    factorize(model, ["up_proj"], max_rank=20, init_rank=6)
    save_compressed(model, tmp_path)
    fresh = load_compressed(tmp_path)
    assert active_ranks(fresh) == active_ranks(model)
    ids = torch.randint(3, 128, (1, 6))
    with torch.no_grad():
        assert torch.allclose(fresh(ids).logits, model(ids).logits, atol=1e-6)


# --- knobs ---------------------------------------------------------------------------------


def test_rank_knob_protocol_bounds_and_optimizer_unchanged() -> None:
    model = tiny_llama()
    factorize(model, max_rank=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids_before = [[id(p) for p in g["params"]] for g in opt.param_groups]
    knob = RankKnob(model)
    assert isinstance(knob, KnobSetter) and knob.name == "rank" and knob.bounds == (1, 16)
    assert knob.apply(6.4) == 6.0
    assert set(active_ranks(model).values()) == {6}
    assert [[id(p) for p in g["params"]] for g in opt.param_groups] == ids_before
    with pytest.raises(ValueError):
        knob.apply(0)
    with pytest.raises(ValueError):
        knob.apply(17)
    with pytest.raises(KnobNotSupported):
        RankKnob(tiny_llama())


def test_rank_knob_mid_run_in_real_trainer(tmp_path) -> None:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    model = tiny_llama()
    factorize(model, max_rank=16)
    knob = RankKnob(model)
    probe = model.get_submodule("model.layers.0.mlp.gate_proj")
    used: list[tuple[int, int, bool]] = []  # (global_step at forward, rank, output == rank-k reference)

    def hook(module: LowRankLinear, args: tuple, output: torch.Tensor) -> None:
        k = module.active_rank
        with torch.no_grad():
            ref = torch.nn.functional.linear(args[0], module.dense_weight(k))
        used.append((trainer.state.global_step, k, torch.allclose(output, ref, atol=1e-5)))

    probe.register_forward_hook(hook)
    seen: dict[str, object] = {}

    class ChangeRank(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):  # noqa: ANN001
            seen["params_before"] = [id(p) for g in trainer.optimizer.param_groups for p in g["params"]]
            seen["optimizer_before"] = id(trainer.optimizer)

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            if state.global_step == 2:
                seen["applied"] = knob.apply(4)

        def on_train_end(self, args, state, control, **kw):  # noqa: ANN001
            seen["params_after"] = [id(p) for g in trainer.optimizer.param_groups for p in g["params"]]
            seen["optimizer"] = id(trainer.optimizer)

    torch.manual_seed(0)
    data = [{"input_ids": (ids := torch.randint(3, 128, (12,))), "labels": ids.clone()} for _ in range(8)]
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=2, learning_rate=1e-3,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[ChangeRank()])
    trainer.train()
    assert seen["applied"] == 4.0
    assert [(s, k) for s, k, _ in used] == [(0, 16), (1, 16), (2, 4), (3, 4)]  # step k+1 uses the new rank
    assert all(ok for _, _, ok in used)
    assert seen["params_before"] == seen["params_after"] and seen["optimizer"] == seen["optimizer_before"]
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))


# --- PEFT ----------------------------------------------------------------------------------


def _lora_model(**kw):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False, **kw)
    return get_peft_model(tiny_llama(), config)


def _effective_delta(layer) -> torch.Tensor:  # noqa: ANN001
    """ΔW the forward really applies: layer(I) - base(I) = ΔWᵀ."""
    eye = torch.eye(layer.in_features)
    with torch.no_grad():
        return (layer(eye) - layer.base_layer(eye)).T


def test_lora_rank_knob_truncates_adapter_delta() -> None:
    model = _lora_model()
    layer = model.get_submodule("base_model.model.model.layers.0.self_attn.q_proj")
    a, b, scale = layer.lora_A["default"].weight, layer.lora_B["default"].weight, layer.scaling["default"]
    knob = LoraRankKnob(model)
    assert knob.read() == 8.0 and knob.bounds == (1, 8)
    assert torch.allclose(_effective_delta(layer), scale * b @ a, atol=1e-5)
    assert knob.apply(3) == 3.0
    delta = _effective_delta(layer)
    assert torch.allclose(delta, scale * b[:, :3] @ a[:3], atol=1e-5)
    assert torch.linalg.matrix_rank(delta).item() <= 3
    # masked components: zero grad
    model(torch.randint(3, 128, (2, 6))).logits.sum().backward()
    assert a.grad[3:].abs().max() == 0 and a.grad[:3].abs().max() > 0
    assert b.grad[:, 3:].abs().max() == 0 and b.grad[:, :3].abs().max() > 0
    # grow back: full update again; bake makes merge reflect the mask
    knob.apply(8)
    assert torch.allclose(_effective_delta(layer), scale * b @ a, atol=1e-5)
    knob.apply(2)
    knob.bake()
    assert torch.allclose(layer.get_delta_weight("default"), _effective_delta(layer), atol=1e-5)


def test_lora_rank_knob_refuses_dora_and_adalora() -> None:
    with pytest.raises(KnobNotSupported, match="variant"):
        LoraRankKnob(_lora_model(use_dora=True))
    with pytest.raises(KnobNotSupported, match="AdaLoraBudgetKnob"):
        LoraRankKnob(_adalora_model())


def _adalora_model():
    from peft import AdaLoraConfig, get_peft_model

    torch.manual_seed(0)
    config = AdaLoraConfig(
        init_r=6, target_r=4, tinit=2, tfinal=2, deltaT=1, total_step=20, target_modules=["q_proj", "v_proj"]
    )
    return get_peft_model(tiny_llama(), config)


def test_adalora_budget_knob_steers_the_allocated_rank() -> None:
    model = _adalora_model()
    tuner = model.base_model
    n = len(tuner.rankallocator.name_set)  # 4 matrices: q, v x 2 layers
    state = type("S", (), {"global_step": 0})()
    knob = AdaLoraBudgetKnob(model, trainer=type("T", (), {"state": state})())
    assert knob.read() == 4.0 and knob.bounds == (1, 5)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(3, 128, (2, 8))

    def nonzero_e() -> int:
        return sum(int(p.count_nonzero()) for name, p in model.named_parameters() if "lora_E" in name)

    counts = {}
    for step in range(1, 10):
        state.global_step = step
        if step == 6:
            assert knob.apply(2) == 2.0
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        tuner.update_and_allocate(step)
        opt.zero_grad()
        budget, _ = tuner.rankallocator.budget_schedule(step)
        counts[step] = (nonzero_e(), budget)
    # masked down to the budget the schedule computes from the allocator's target (4 -> 2 per matrix)
    for step in (3, 5, 6, 9):
        assert counts[step][0] == counts[step][1], counts
    # step 6 follows the new target at once (20 -> 14; the old target's schedule gives 19 here)
    assert counts[6][0] == 14 and counts[5][0] == 20
    assert counts[9][1] < counts[5][1] and tuner.rankallocator.target_bgt == 2 * n
    state.global_step = 18
    with pytest.raises(KnobNotSupported, match="final phase"):
        knob.apply(3)

