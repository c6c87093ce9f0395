"""What the callback costs TRL's own example scripts: s/step with and without the README's line.

    python -m benchmarks.overhead.stock_scripts [--scripts sft sft-lora dpo grpo rloo]
                                                [--steps 10 200] [--rounds 1] [--model smollm2|tiny]

Each script is TRL's installed ``trl/scripts/<name>.py`` run as a subprocess with the README's
command line ("With TRL's scripts"), once as shipped and once with the README's one line added
before ``trainer.train(``, against one controller service (SQLite) in this process. ``sft-lora``
is ``sft.py --use_peft`` under the same preset. The figure is the trainer's own ``train_runtime``
divided by the steps, so it counts everything the callback adds inside ``train()``: the start-up
(probe set-up, the drift reference, the baselines), the probes, the sends. Arms rotate round by
round so drift in machine load hits both alike; one torch thread per run.

The target (issue 57): at 200 steps the callback's overhead stays within the probe budget
(``budget_share``, 10% by default) plus what the start-up costs over the run. Results: a table,
and benchmarks/results/overhead_stock_scripts.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from ..load._harness import machine, start_service, table, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {"sft": "sft", "sft-lora": "sft", "dpo": "dpo", "grpo": "grpo", "rloo": "rloo"}
# A real run's sizes on this machine (batch 4, 128 tokens; GRPO 4 completions of 16 tokens).
SIZES = {
    "sft": ["--per_device_train_batch_size", "4", "--max_length", "128"],
    "sft-lora": ["--per_device_train_batch_size", "4", "--max_length", "128", "--use_peft", "--lora_r", "16",
                 "--lora_alpha", "32"],
    "dpo": ["--per_device_train_batch_size", "4", "--max_length", "128"],
    "grpo": ["--per_device_train_batch_size", "4", "--num_generations", "4", "--max_completion_length", "16"],
    "rloo": ["--per_device_train_batch_size", "4", "--num_generations", "4", "--max_completion_length", "16"],
}
COMMON = ["--learning_rate", "2e-5", "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "True",
          "--dataloader_num_workers", "0", "--seed", "0", "--logging_steps", "1"]
REWARDS = '''def shorter(completions, **kwargs):
    """Shorter answers score higher (a reward that varies within a group)."""
    def text(c):
        return "".join(str(m.get("content", "")) for m in c) if isinstance(c, list) else str(c)
    return [-len(text(c)) / 10.0 for c in completions]
'''
RUNTIME = re.compile(r"'train_runtime': '?([0-9.]+)")
START_UP = re.compile(r"start-up before the first step: ([0-9.]+) s")


def readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## With TRL's scripts")
    return text[start:text.index("\n## ", start + 1)]


def readme_line(script: str) -> str:
    """The README's one line for ``script`` (the one whose trailing comment names it)."""
    block = re.search(r"```python\n(.*?)```", readme_section(), re.S)
    if block is None:
        raise SystemExit("README's 'With TRL's scripts' has no python block")
    lines = [ln for ln in block.group(1).splitlines() if re.search(rf"#.*\b{script}\.py\b", ln)]
    if len(lines) != 1:
        raise SystemExit(f"README: expected one line for {script}.py, found {len(lines)}")
    return lines[0]


def readme_command(script: str) -> list[str]:
    """The README's command line for ``script``, without ``python <script>.py``."""
    block = re.search(r"```bash\n(.*?)```", readme_section(), re.S)
    lines = [ln for ln in (block.group(1) if block else "").splitlines() if ln.startswith(f"python {script}.py ")]
    if len(lines) != 1:
        raise SystemExit(f"README: expected one command for {script}.py, found {len(lines)}")
    return shlex.split(lines[0])[2:]


def script_copy(script: str, dest: Path, with_line: bool) -> Path:
    """TRL's installed ``script``, with the README's line before ``trainer.train(`` if ``with_line``."""
    spec = importlib.util.find_spec(f"trl.scripts.{script}")
    if spec is None or spec.origin is None:
        raise SystemExit(f"trl.scripts.{script} is not installed (pip install -e '.[train]')")
    source = Path(spec.origin).read_text()
    if with_line:
        call = re.search(r"^( *)trainer\.train\(", source, re.M)
        if call is None:
            raise SystemExit(f"trl/scripts/{script}.py has no trainer.train( call")
        source = source[:call.start()] + call.group(1) + readme_line(script) + "\n" + source[call.start():]
    path = dest / f"{script}{'-with' if with_line else ''}.py"
    path.write_text(source)
    return path


def datasets(dest: Path, rows: int) -> dict[str, Path]:
    """Local datasets in each script's layout (``load_dataset(dir)`` reads its train.jsonl)."""
    def write(name: str, items: list[dict[str, Any]]) -> Path:
        (dest / name).mkdir(parents=True, exist_ok=True)
        (dest / name / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
        return dest / name

    def msg(role: str, text: str) -> list[dict[str, str]]:
        return [{"role": role, "content": text}]

    nums = [(a, b) for a in range(rows) for b in range(1, 5)][:rows]
    sft = write("sft", [{"messages": msg("user", f"What is {a} plus {b}? Answer in a sentence.")
                         + msg("assistant", f"{a} plus {b} is {a + b}, because adding {b} to {a} gives {a + b}.")}
                        for a, b in nums])
    pairs = write("pairs", [{"prompt": msg("user", f"What is {a} plus {b}?"), "chosen": msg("assistant", f"{a + b}."),
                             "rejected": msg("assistant", "Great question! I am not sure, but I hope this helps.")}
                            for a, b in nums])
    prompts = write("prompts", [{"prompt": msg("user", f"Count from {a} to {a + b}.")} for a, b in nums])
    return {"sft": sft, "sft-lora": sft, "dpo": pairs, "grpo": prompts, "rloo": prompts}


def model_dir(kind: str, dest: Path) -> Path:
    """SmolLM2-135M-Instruct saved as an HF directory (it ships as GGUF), or a tiny random Llama."""
    path = dest / kind
    if (path / "config.json").exists():
        return path
    if kind == "smollm2":
        from actuator.agents.models import load_smollm2

        model, tokenizer = load_smollm2()
    else:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        from actuator.agents.models import load_smollm2

        _, tokenizer = load_smollm2()
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def command(name: str, path: Path, model: Path, data: Path, out: Path, steps: int) -> list[str]:
    args = readme_command(SCRIPTS[name])
    for flag, value in (("--model_name_or_path", str(model)), ("--dataset_name", str(data)),
                        ("--output_dir", str(out)), ("--reward_funcs", "stock_rewards.shorter"),
                        ("--max_steps", str(steps))):
        if flag in args:
            args[args.index(flag) + 1] = value
    return [sys.executable, str(path), *args, *SIZES[name], *COMMON]


def run_arm(name: str, with_line: bool, steps: int, work: Path, model: Path, data: Path, url: str) -> dict[str, Any]:
    """One subprocess: its train_runtime per step, its wall time, the start-up the agent logged."""
    arm = work / f"{name}-{steps}-{'with' if with_line else 'without'}-{time.monotonic_ns()}"
    arm.mkdir(parents=True)
    (arm / "stock_rewards.py").write_text(REWARDS)
    argv = command(name, script_copy(SCRIPTS[name], arm, with_line), model, data, arm / "out", steps)
    env = {**os.environ, "ACTUATOR_URL": url, "PYTHONPATH": os.pathsep.join([str(arm), str(ROOT)]),
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(arm / "cache")}
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=arm, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    output = proc.stdout + proc.stderr
    runtime = RUNTIME.findall(output)
    if proc.returncode != 0 or not runtime:
        tail = "\n".join(output.splitlines()[-30:])
        raise SystemExit(f"{name} ({'with' if with_line else 'without'} the line, {steps} steps) failed "
                         f"(exit {proc.returncode}):\n{tail}")
    start_up = START_UP.findall(output)
    return {"s_per_step": float(runtime[-1]) / steps, "train_runtime_s": float(runtime[-1]), "wall_s": wall,
            "start_up_s": float(start_up[-1]) if start_up else None,
            "registered": "registered (policy" in output}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scripts", nargs="+", choices=list(SCRIPTS), default=list(SCRIPTS))
    ap.add_argument("--steps", type=int, nargs="+", default=[10, 200], help="run lengths (each with and without)")
    ap.add_argument("--rounds", type=int, default=1, help="repeats of each pair, arms rotated")
    ap.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "actuator-bench" / "stock",
                    help="where the model directory and the datasets are kept between runs")
    ap.add_argument("--name", default="overhead_stock_scripts")
    a = ap.parse_args()
    for n in a.steps:
        if n < 10:
            ap.error(f"--steps {n}: the presets refuse runs shorter than 10 steps")

    a.cache.mkdir(parents=True, exist_ok=True)
    model = model_dir(a.model, a.cache)
    data = datasets(a.cache / "data", rows=max(a.steps) * 4 + 16)
    info = machine()
    svc = start_service(f"sqlite:///{tempfile.mkdtemp(prefix='actuator-stock-')}/actuator.db")
    work = Path(tempfile.mkdtemp(prefix="actuator-stock-runs-"))
    rows: list[dict[str, Any]] = []
    try:
        for name in a.scripts:
            for steps in a.steps:
                for r in range(a.rounds):
                    order = (False, True) if r % 2 == 0 else (True, False)
                    res = {w: run_arm(name, w, steps, work, model, data[name], svc.url) for w in order}
                    without, with_ = res[False], res[True]
                    row = {"script": name, "steps": steps, "round": r + 1,
                           "s_per_step_without": round(without["s_per_step"], 3),
                           "s_per_step_with": round(with_["s_per_step"], 3),
                           "overhead_pct": round(100 * (with_["s_per_step"] / without["s_per_step"] - 1), 1),
                           "start_up_s": with_["start_up_s"], "registered": with_["registered"],
                           "wall_s_without": round(without["wall_s"], 1), "wall_s_with": round(with_["wall_s"], 1)}
                    rows.append(row)
                    print(f"{name} {steps} steps, round {r + 1}: {row['s_per_step_without']} -> "
                          f"{row['s_per_step_with']} s/step ({row['overhead_pct']:+.1f}%), start-up "
                          f"{row['start_up_s']} s", flush=True)
    finally:
        svc.stop()
    print(table(rows, ["script", "steps", "round", "s_per_step_without", "s_per_step_with", "overhead_pct",
                       "start_up_s"]))
    write_results(a.name, {"command": " ".join(["python -m benchmarks.overhead.stock_scripts", *sys.argv[1:]]),
                           "machine": info, "model": a.model, "rows": rows})


if __name__ == "__main__":
    main()
