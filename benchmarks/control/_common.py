"""What every real-model control scenario shares: output paths, console, threads, the embedded
controller, the per-arm progress bar and writing the result files.

Importing this module sets the offline switches (``HF_HUB_OFFLINE``) before transformers loads:
the scenarios never download anything.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402

__all__ = ["RESULTS", "console", "pick_threads", "start_controller", "arm_progress", "command_line",
           "machine", "cpu_flags", "native_precision", "precision_args", "scenario_args", "figure", "arm_label",
           "record_targets", "save_results"]

RESULTS = Path(__file__).resolve().parents[1] / "results"
console = Console(width=None if os.isatty(1) else 180)


def pick_threads(requested: int | None) -> int:
    """``--threads`` or: all cores when the machine is idle, one when it is oversubscribed
    (measured on the shared 2-core box at load ~5: a SmolLM2 forward+backward took 22-34 s with
    2 threads and 10 s with 1, torch's OpenMP threads spin-waiting for each other)."""
    cores = os.cpu_count() or 1
    if requested:
        return requested
    return 1 if os.getloadavg()[0] > cores else cores


def start_controller(scratch: Path) -> str:
    """The real controller service on loopback (uvicorn in a thread) over a fresh SQLite file in
    ``scratch``; returns its URL. The file is per process: seeds run side by side in one scratch
    directory would otherwise delete and re-migrate each other's database."""
    from actuator.api.embedded import serve_in_thread
    from actuator.config import Settings

    scratch.mkdir(parents=True, exist_ok=True)
    db = scratch / f"actuator-{os.getpid()}.db"
    db.unlink(missing_ok=True)
    return serve_in_thread(Settings(database_url=f"sqlite:///{db}"))


@contextmanager
def arm_progress(name: str, steps: int, width: int = 22) -> Iterator[Callable[[], None]]:
    """A progress bar for one arm; yields ``advance()`` for the arm's step-end callback."""
    with Progress(TextColumn(f"[bold]{name:<{width}}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task(name, total=steps)
        yield lambda: progress.update(task, advance=1)


def scenario_args(ap: Any, scenario: str, steps: int, quick: str) -> None:
    """The options every scenario takes: --steps, --seeds, --quick (``quick`` says what it does),
    --threads and --out (scratch space; results always go to benchmarks/results)."""
    import tempfile

    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: by machine load)")
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "actuator-bench" / scenario,
                    help="scratch: trainer dirs and the controller's SQLite file (results go to benchmarks/results)")


@contextmanager
def figure(path: Path, nrows: int = 1, ncols: int = 3, size: tuple[float, float] = (16, 4.3)) -> Iterator[Any]:
    """A headless matplotlib figure of ``nrows`` x ``ncols`` axes (``size`` is per row), written to
    ``path`` when the block ends without an error, closed either way. Yields ``(fig, axes)`` with
    ``axes`` always 2-D."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(size[0], size[1] * nrows), squeeze=False)
    try:
        yield fig, axes
        fig.tight_layout()
        fig.savefig(path, dpi=90)
    finally:
        plt.close(fig)


def arm_label(arm: dict[str, Any], result: dict[str, Any]) -> str:
    """An arm's legend label: its name, plus the seed when the result holds several."""
    return f"{arm['arm']} (seed {arm['seed']})" if len(result["seeds"]) > 1 else arm["arm"]


def record_targets(out: dict[str, Any], targets: dict[str, Any]) -> None:
    """Put the target verdicts in the result and print them (nothing when there are none)."""
    if targets:
        out["targets"] = targets
        console.print(f"targets: {targets}")


def command_line(module: str, argv: Sequence[str] | None) -> str:
    args = list(argv) if argv is not None else sys.argv[1:]
    return " ".join([f"python -m benchmarks.control.{module}", *args])


# The CPU features that decide whether bf16 is native (and a few that say what kind of CPU it is).
_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "avx_vnni", "avx512_vnni")


def cpu_flags() -> list[str]:
    """The CPU's SIMD flags from /proc/cpuinfo that matter for training precision (Linux)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    present = set(line.split(":", 1)[1].split())
                    return [f for f in _FLAGS if f in present]
    except OSError:
        pass
    return []


def native_precision() -> str:
    """``"bf16"`` where the machine computes bf16 natively (a GPU that supports it; a CPU with
    AVX512-BF16 or AMX), else ``"fp32"``. Elsewhere bf16 autocast is emulated: on an AVX2-only CPU a
    SmolLM2 DPO step took ~8x as long as in fp32 (TRL's configs default to bf16)."""
    import torch

    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    native = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    if (native is not None and native()) or {"avx512_bf16", "amx_bf16"} & set(cpu_flags()):
        return "bf16"
    return "fp32"


def precision_args(precision: str | None = None) -> dict[str, bool]:
    """TrainingArguments / TRL config fields for ``precision`` (default: :func:`native_precision`);
    both set explicitly, since TRL's configs turn bf16 on when left unset."""
    precision = precision or native_precision()
    if precision not in ("bf16", "fp32"):
        raise ValueError(f"precision must be 'bf16' or 'fp32', got {precision!r}")
    return {"bf16": precision == "bf16", "fp16": False}


def machine() -> dict[str, Any]:
    """What a result was measured on: CPU model and flags, cores, torch, threads, load, precision."""
    import platform

    import torch

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), model)
    except OSError:
        pass
    return {"cpu": model, "cpu_flags": cpu_flags(), "cores": os.cpu_count(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "load_at_end": round(os.getloadavg()[0], 1),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "native_precision": native_precision()}


def save_results(scenario: str, out: dict[str, Any], plot: Callable[[dict[str, Any], Path], None],
                 t_start: float | None = None) -> None:
    """Write ``benchmarks/results/<scenario>.json`` and ``.png`` and say so."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    out.setdefault("machine", machine())
    if t_start is not None:
        out.setdefault("wall_seconds", time.time() - t_start)
    (RESULTS / f"{scenario}.json").write_text(json.dumps(out, indent=2, default=str))
    plot(out, RESULTS / f"{scenario}.png")
    took = f" ({out['wall_seconds']:.0f} s)" if "wall_seconds" in out else ""
    console.print(f"wrote {RESULTS / (scenario + '.json')} and {scenario}.png{took}")


# -- the tuned arm (issue 16): identification pre-run, then ``tune`` ---------------------------
def identification_args(ap: argparse.ArgumentParser, size: float = -1.0,
                        size_help: str = "the learning-rate step, log units (-1: x0.37; the rate starts at its "
                                         "ceiling)") -> None:
    """The tuned arm's pre-run options, shared by the scenarios that have one (``size``: the
    default step of the knob the scenario identifies, in its scale)."""
    ap.add_argument("--ident-steps", type=int, default=8,
                    help="tuned arm: identification pre-run length (steps; default 8 = 20%% of 40)")
    ap.add_argument("--ident-hold", type=int, default=3, help="tuned arm: steps before the knob's step")
    ap.add_argument("--ident-size", type=float, default=size, help=f"tuned arm: {size_help}")


def identification_test(a: argparse.Namespace, knob: str = "learning_rate") -> dict[str, Any]:
    """The agent's identification mode for the pre-run: step ``knob`` once (by ``--ident-size`` in
    its scale) after ``--ident-hold`` steps, held to the pre-run's end."""
    return {"knob": knob, "size": a.ident_size, "hold": a.ident_hold, "length": a.ident_steps - a.ident_hold}


def identify_and_tune(run_arm: Callable[..., dict[str, Any]], setup: Any, a: argparse.Namespace, url: str,
                      seed: int, *, controller: str, policy: Callable[[], dict[str, Any]],
                      knob: str = "learning_rate", arm: dict[str, Any] | None = None,
                      run_args: argparse.Namespace | None = None,
                      keep: Sequence[str] = ("trace", "seconds", "run_id"),
                      refusals: bool = False) -> dict[str, Any]:
    """The tuned arm's preparation, for the scenarios that have one: an identification pre-run
    through the scenario's ``run_arm(setup, arm, args, url, seed)`` (``arm``: its fields beside
    the name, the kind and the agent's identification mode on ``knob``; ``run_args``: the
    scenario's arguments for it, default ``a``), then ``POST /v1/policies/tune`` on its stored
    observations for ``controller`` of ``policy()`` (built after the pre-run). Returns the tune
    response, the pre-run's ``keep`` fields and the step test. With ``refusals`` a 409 (nothing
    the controller can use was identified) comes back as ``{"refused": message}`` instead of
    raising: there is then no loop to run."""
    from actuator import ActuatorError
    from actuator.client import ActuatorClient

    test = identification_test(a, knob=knob)
    pre = run_arm(setup, {"name": "identification", "kind": "identify", **(arm or {}), "identify": test},
                  a if run_args is None else run_args, url, seed)
    ident = {k: pre[k] for k in keep}
    try:
        result = ActuatorClient(url, timeout=120).tune_policy(pre["run_id"], controller, policy=policy())
    except ActuatorError as exc:
        if not refusals:
            raise
        return {"refused": str(exc), "identification": ident, "test": test}
    return {"tune": result, "identification": ident, "test": test}


def tune_summary(seed: int, prep: dict[str, Any]) -> str:
    """One line: the fitted model and the proposed gains of a tuned arm."""
    g, m = prep["tune"]["gains"], prep["tune"]["model"]
    return (f"  tuned seed {seed}: {m['kind']} gain {m['gain']:.4g} tau {m['tau']:.3g} theta "
            f"{m['theta']:.3g} (hi {m['theta_hi']:.3g}) R2 {m['r2']:.3f}; kp {g['kp']:.4g} "
            f"ki {g['ki']:.4g} kd {g['kd']:.4g} b {g['setpoint_weight']:g}")
