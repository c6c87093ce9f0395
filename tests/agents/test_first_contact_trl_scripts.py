"""Issue 36's first contact, as a user makes it: TRL's own example scripts, read from the installed
``trl`` package at test time, with the one line README.md's "With TRL's scripts" section says to
add (and its command lines), run as subprocesses for 10 steps on a tiny model saved as an HF
directory, under their presets with no probes passed, against the real controller service. Each
run prints its id and console URL at WARNING, and the audit trail shows decisions the agent
acknowledged as applied before the last step."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from actuator.testing import make_service

from agent_helpers import make_char_tokenizer

from benchmarks.overhead.stock_scripts import readme_command, readme_line  # noqa: E402 - one reading of the README

import trl  # noqa: E402,F401 - the [train] extra, installed by make setup: a missing TRL fails here

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SCRIPTS = ("sft", "dpo", "grpo", "rloo")
MAX_STEPS = 10
REGISTERED = re.compile(r"actuator: run (?P<id>\S+) registered \(policy (?P<policy>\S+) v(?P<version>\d+)\); "
                        r"console: (?P<base>\S+)/ui/runs/(?P<id2>\S+)")
# A tiny run's sizes and what a test needs on top of the README's command (later flags win).
SPEED = {
    "sft": ["--per_device_train_batch_size", "2", "--max_length", "64"],
    "dpo": ["--per_device_train_batch_size", "2", "--max_length", "64"],
    "grpo": ["--per_device_train_batch_size", "4", "--num_generations", "2", "--max_completion_length", "8"],
    "rloo": ["--per_device_train_batch_size", "4", "--num_generations", "2", "--max_completion_length", "8"],
}
# A learning rate at which the tiny model drifts past the presets' setpoints within 10 steps, and
# four micro-batches a step: a tiny model's step is a few milliseconds, far shorter next to a probe
# than a real model's, and the probe budget is a share of wall time.
COMMON = ["--learning_rate", "1e-2", "--gradient_accumulation_steps", "4", "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "True",
          "--dataloader_num_workers", "0", "--seed", "0"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def with_the_line(script: str, dest: Path) -> Path:
    """TRL's installed ``script`` with the README's line added before ``trainer.train(``."""
    source = Path(importlib.util.find_spec(f"trl.scripts.{script}").origin).read_text()
    calls = list(re.finditer(r"^( *)trainer\.train\(", source, re.M))
    assert len(calls) == 1, f"trl/scripts/{script}.py: expected one trainer.train( call"
    call = calls[0]
    patched = source[:call.start()] + call.group(1) + readme_line(script) + "\n" + source[call.start():]
    assert len(patched.splitlines()) == len(source.splitlines()) + 1
    path = dest / f"{script}.py"
    path.write_text(patched)
    return path


def tiny_model_dir(dest: Path) -> Path:
    """A tiny random Llama and a character tokenizer with a chat template, as an HF directory."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192, pad_token_id=0,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    tokenizer = make_char_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    path = dest / "tiny"
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.mkdir(parents=True)
    (path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def datasets(dest: Path) -> dict[str, Path]:
    """Local datasets in the layout each script loads (``load_dataset(dir)``: its train.jsonl)."""
    def user(text: str) -> list[dict]:
        return [{"role": "user", "content": text}]

    def assistant(text: str) -> list[dict]:
        return [{"role": "assistant", "content": text}]

    sft = write_jsonl(dest / "sft", [{"messages": user(f"{a} plus {b}?") + assistant(f"{a + b}.")}
                                     for a in range(12) for b in range(4)])
    pairs = write_jsonl(dest / "pairs", [{"prompt": user(f"{a} plus 1?"), "chosen": assistant(f"{a + 1}."),
                                          "rejected": assistant("Great question! I hope this helps.")}
                                         for a in range(24)])
    prompts = write_jsonl(dest / "prompts", [{"prompt": user(f"Count to {a}.")} for a in range(16)])
    return {"sft": sft, "dpo": pairs, "grpo": prompts, "rloo": prompts}


def command(script: str, path: Path, model: Path, data: Path, out: Path) -> list[str]:
    """The README's command line for ``script``, with this test's model, data and output."""
    args = readme_command(script)
    for flag, value in (("--model_name_or_path", str(model)), ("--dataset_name", str(data)),
                        ("--output_dir", str(out)), ("--reward_funcs", "trl_script_rewards.shorter")):
        if flag in args:
            args[args.index(flag) + 1] = value
    assert "--use_cpu" in args and "--max_steps" in args, args
    args[args.index("--max_steps") + 1] = str(MAX_STEPS)
    return [sys.executable, str(path), *args, *SPEED[script], *COMMON]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The four scripts, run side by side against one controller service."""
    tmp = tmp_path_factory.mktemp("first-contact")
    service = make_service(f"sqlite:///{tmp / 'actuator.db'}", log_dir=str(tmp)).start()
    model, data = tiny_model_dir(tmp), datasets(tmp / "data")
    env = {**os.environ, "ACTUATOR_URL": service.url, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)]),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    procs = {}
    try:
        for script in SCRIPTS:
            work = tmp / script
            work.mkdir()
            argv = command(script, with_the_line(script, work), model, data[script], work / "out")
            procs[script] = subprocess.Popen(argv, cwd=work, env={**env, "HF_DATASETS_CACHE": str(work / "cache")},
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        outputs = {script: proc.communicate(timeout=240)[0] for script, proc in procs.items()}
        yield service, {script: (procs[script].returncode, outputs[script]) for script in SCRIPTS}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
        service.stop()


@pytest.mark.parametrize("script", SCRIPTS)
def test_trl_script_with_the_readme_line_is_controlled_from_its_first_steps(script, runs):
    service, results = runs
    code, output = results[script]
    assert code == 0, output[-4000:]
    registered = [m for m in REGISTERED.finditer(output)]
    assert len(registered) == 1, output[-4000:]
    line = registered[0]
    run_id = line["id"]
    preset = re.search(r'"preset:([\w-]+)"', readme_line(script)).group(1)
    assert line["id2"] == run_id and line["base"] == service.url and line["policy"] == preset
    assert httpx.get(f"{service.url}/ui/runs/{run_id}").status_code == 200  # the console URL printed opens

    run = httpx.get(f"{service.url}/v1/runs/{run_id}").json()
    assert run["state"] == "finished"
    decisions = httpx.get(f"{service.url}/v1/runs/{run_id}/decisions", params={"limit": 1000}).json()["items"]
    applied = [d for d in decisions if d["applied_step"] is not None and d["applied_value"] is not None]
    # Controlled during training: a decision the agent says it applied at a step boundary before the last step.
    assert any(d["applied_step"] < MAX_STEPS for d in applied), (decisions, output[-3000:])
    assert {d["knob"] for d in applied} <= set(run["knobs"])
