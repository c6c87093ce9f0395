"""Actuator in a plain PyTorch training loop: no Trainer, a ControlSession at each step boundary.

    knob = LearningRateKnob(optimizer, scheduler)                 # scales base_lrs: the schedule survives
    session = ControlSession(policy, setters=[knob], knobs={"learning_rate": {...bounds...}},
                             probes=ProbeSuite([KLDrift(...)]), connection=Connection(url))
    session.begin(model, max_steps=steps)     # register the run, set the probes up, read the baseline
    for step ...:
        loss.backward(); optimizer.step(); scheduler.step(); optimizer.zero_grad()
        # step boundary: decisions that came back are guarded (the knob's bounds and rate limit),
        # applied and acknowledged; due probes run and the observation goes to the background
        # sender (training never waits on HTTP)
        if session.step(step, model, metrics={"loss": loss}).halt: break
    session.finish()                          # deliver what is buffered, mark the run finished

By default a tiny random Llama learns a narrow character-level task (seconds); ``--smollm2``
fine-tunes the real SmolLM2-135M-Instruct on a narrow chat task instead (minutes).

    python examples/own_loop.py                       # tiny model, 200 steps (~1 minute)
    python examples/own_loop.py --smollm2 --steps 20  # the real model (~4 minutes on 2 idle CPU cores)
    python examples/own_loop.py --url http://127.0.0.1:8000

Without ``--url`` the controller service runs in this process (SQLite in a temp dir), started
exactly as examples/demo.py does.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import string
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/demo.py: start_service

import torch  # noqa: E402

from actuator.agents.knobs import LearningRateKnob  # noqa: E402
from actuator.agents.probes import KLDrift, ProbeSuite  # noqa: E402
from actuator.agents.session import Connection, ControlSession, RunInfo  # noqa: E402
from actuator.client import ActuatorClient  # noqa: E402

WORDS = ("apple river candle mountain window garden silver rocket planet forest violin marble tiger lemon "
         "castle harbor pencil meadow thunder island copper velvet falcon lantern orchid glacier compass").split()
GENERAL = ["The quick brown fox jumps over the lazy dog.", "Rain falls on the green hills in spring.",
           "A small boat drifted across the quiet lake.", "She wrote a letter to her old friend.",
           "What is the capital of France?", "Name three primary colors."]


def char_tokenizer():
    """A character-level tokenizer built in-process (no download) for the tiny model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for c in string.ascii_letters + string.digits + string.punctuation + " \n":
        vocab.setdefault(c, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def load(args: argparse.Namespace):
    """(model, tokenizer, training texts, drift prompts)."""
    rng = random.Random(args.seed)
    pairs = [(w, "-".join(str(ord(c) - 96) for c in w)) for w in (rng.choice(WORDS) for _ in range(400))]
    if args.smollm2:
        from actuator.agents.models import load_smollm2

        model, tok = load_smollm2()

        def chat(user: str, answer: str | None = None) -> str:
            msgs = [{"role": "user", "content": user}] + ([{"role": "assistant", "content": answer}] if answer else [])
            return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=answer is None)

        texts = [chat(f"Letter positions of: {w}", a) for w, a in pairs]
        return model, tok, texts, [chat(p) for p in GENERAL]
    from actuator.agents.models import tiny_llama

    return tiny_llama(seed=args.seed), char_tokenizer(), [f"{w} = {a}." for w, a in pairs], GENERAL


def batches(tok, texts: list[str], batch_size: int, max_length: int, seed: int):
    """Endless shuffled batches of causal-LM examples (padding masked out of the labels)."""
    rng = random.Random(seed)
    while True:
        order = list(range(len(texts)))
        rng.shuffle(order)
        for i in range(0, len(order) - batch_size + 1, batch_size):
            enc = tok([texts[j] for j in order[i: i + batch_size]], truncation=True, max_length=max_length,
                      padding=True, return_tensors="pt")
            labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
            yield enc["input_ids"], enc["attention_mask"], labels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smollm2", action="store_true", help="the real SmolLM2-135M-Instruct instead of a tiny model")
    ap.add_argument("--steps", type=int, default=None, help="default: 200 (tiny), 20 (--smollm2)")
    ap.add_argument("--url", default=None, help="controller service URL (default: start one in-process)")
    ap.add_argument("--lr", type=float, default=None, help="default: 3e-3 (tiny), 1e-4 (--smollm2)")
    ap.add_argument("--setpoint", type=float, default=None, help="KL drift to hold; default 0.1 (tiny), 0.05")
    ap.add_argument("--probe-every", type=int, default=None, help="default: 10 (tiny), 3 (--smollm2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget-share", type=float, default=0.5,
                    help="the share of wall time probes may take (past it, due probes are skipped)")
    args = ap.parse_args()
    tiny = not args.smollm2
    steps = args.steps or (200 if tiny else 20)
    lr = args.lr or (3e-3 if tiny else 1e-4)
    setpoint = args.setpoint or (0.1 if tiny else 0.05)
    every = args.probe_every or (10 if tiny else 3)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    torch.manual_seed(args.seed)
    t_start = time.time()

    url = args.url
    if url is None:
        from demo import start_service

        url = start_service(Path(tempfile.mkdtemp(prefix="actuator-loop-")) / "actuator.db")
    print(f"controller: {url}")
    model, tok, texts, prompts = load(args)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    # A linear decay LambdaLR (transformers' get_linear_schedule_with_warmup without warm-up): the
    # knob scales its base lr, so decisions move the whole remaining schedule.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, (steps - s) / steps))
    knob = LearningRateKnob(optimizer, scheduler)
    suite = ProbeSuite([KLDrift(prompts, tok, every=every, max_length=48, batch_size=3)],
                       budget_share=args.budget_share)

    policy = {
        "name": "own-loop-drift-lr",
        "description": "Hold KL drift at a setpoint by moving the learning rate.",
        "controllers": [{"name": "drift-lr", "probe": "kl_drift", "knob": "learning_rate", "setpoint": setpoint,
                         "kp": 0.4 / setpoint, "ki": 0.04 / setpoint, "direction": "direct",
                         "filter": {"kind": "ema", "alpha": 0.6}}],
    }
    session = ControlSession(
        policy, setters=[knob], probes=suite, connection=Connection(url),
        knobs={"learning_rate": {"min": lr / 100, "max": lr * 3, "scale": "log", "max_step": 0.7}},
        run=RunInfo("own-loop-smollm2" if args.smollm2 else "own-loop-tiny"))
    session.begin(model, max_steps=steps)  # registers the run, sets the probes up (the drift reference), baseline
    print(f"run {session.run_id} registered; {'SmolLM2-135M-Instruct' if args.smollm2 else 'tiny Llama'} loaded "
          f"({time.time() - t_start:.0f} s)")

    def show(step: int) -> None:
        """The observation sent at ``step``, if one was."""
        if not session.history or session.history[-1]["step"] != step:
            return
        probes = session.history[-1]["probes"]
        if not probes:  # every due probe was skipped for budget (the suite says why in a warning)
            print(f"step {step:>4}  probes skipped")
            return
        loss = f"{metrics['loss']:.4f}" if "loss" in metrics else "-"
        print(f"step {step:>4}  loss {loss}  lr {knob.read():.2e}  "
              f"kl_drift {probes.get('kl_drift', float('nan')):.4f}  ({time.time() - t_start:.0f} s)", flush=True)

    metrics: dict[str, float] = {}
    applied: list[dict] = []
    show(0)  # the baseline
    data = batches(tok, texts, 4, 64, args.seed)
    t_train = time.time()
    for step in range(1, steps + 1):
        input_ids, attention_mask, labels = next(data)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        metrics = {"loss": float(loss.detach())}
        # Step boundary: decisions that came back apply from the next optimizer step (guarded and
        # acknowledged), then due probes run and the observation is handed to the sender.
        outcome = session.step(step, model, metrics=metrics)
        applied += outcome.applied
        show(step)
        if outcome.halt:
            print(f"the controller halted the run at step {step}")
            break
    train_s = time.time() - t_train

    delivered = session.finish()  # delivers what is buffered, acknowledgements too; the run is finished
    client = ActuatorClient(url)
    decisions = client.list_decisions(session.run_id, limit=1000).items
    client.close()
    print(f"\ntrained {step} steps in {train_s:.0f} s; {len(applied)} decisions applied "
          f"(all observations delivered: {delivered}); lr in effect now {knob.read():.2e}")
    print(f"\nwhat the controller changed ({len(decisions)} decisions):")
    print(f"{'#':>3} {'from step':>9} {'applied after':>13} {'old':>9} {'new':>9} {'applied':>9}  why")
    for d in decisions:
        value = "-" if d.applied_value is None else f"{d.applied_value:.2e}"
        print(f"{d.number:>3} {d.step:>9} {d.applied_step if d.applied_step is not None else '-'!s:>13} "
              f"{d.old_value:>9.2e} {d.new_value:>9.2e} {value:>9}  {d.reason}")
    print(f"\ntotal wall time {time.time() - t_start:.0f} s")

if __name__ == "__main__":
    main()
