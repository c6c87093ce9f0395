"""The scenario harness: what every real-model control scenario shares, so that a scenario file
keeps only its task, its arms and its metrics.

- the common flags (:func:`scenario_args`: ``--steps --seeds --quick --threads --out --arms --tag
  --results --aggregate``) and the start of a run (:func:`start`: threads by machine load, scratch
  folder, the embedded controller service);
- the seed loop (:func:`for_each_seed`; one process runs the ``--seeds`` it is given, so seeds run
  side by side as one process each: ``--seeds 0 & --seeds 1 & …``, each with ``--threads 1``);
- per-seed result files (:func:`seed_path`, :func:`write_seed`, :func:`read_seeds`);
- aggregation: mean ± sd and the worst seed (:func:`mean_sd`, :func:`spread`), a fixed setting
  picked on seed 0 and judged on the other seeds beside the best in hindsight
  (:func:`pick_on_seed0`), and the verdict on a target (:func:`verdict`: met only when it holds on
  at least 4 of 5 seeds and on the mean; with fewer seeds it says on how many it was judged);
- plots (:func:`figure`), the console, the progress bar per arm and the result files
  (:func:`save_results`) with the machine they were measured on (:func:`machine`);
- the tuned arm's identification pre-run (:func:`identify_and_tune`).

The scenario contract and the validation split (choices on seed 0, figures over seeds 1–9, met on
at least 8 of 9 and the mean, fresh seeds 5–9 flagged where they disagree with 1–4) are in
:mod:`benchmarks.control.contract`; ``python -m benchmarks.control.validate`` applies them to the
stored runs of a scenario.

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

from actuator.agents.precision import cpu_flags, native_precision  # noqa: E402

__all__ = ["RESULTS", "console", "pick_threads", "start_controller", "start", "arm_progress", "command_line",
           "machine", "scenario_args", "add_flags", "figure", "arm_label", "record_targets", "save_results", "seed_path",
           "write_seed", "read_seeds", "for_each_seed", "mean_sd", "fmt_ms", "spread", "verdict", "judged", "pick_on_seed0",
           "control_quality",
           "identification_args", "identification_test", "identify_and_tune", "tune_summary", "KLBaselines",
           "kl_adaptive_lr", "kl_trace", "probe_value", "trace_start", "variant_label", "settles_against_ziegler"]

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


def scenario_args(ap: Any, scenario: str, steps: int, quick: str | None, *, arms: Sequence[str] | None = None,
                  arms_default: Sequence[str] | None = None, arms_help: str | None = None, tag_help: str | None = None,
                  aggregate: str | None = None) -> None:
    """The options every scenario takes: --steps, --seeds, --quick (``quick`` says what it does;
    None: the scenario has no quick mode), --threads, --out (scratch space), --results (the folder
    of the result files, default benchmarks/results), --tag (a suffix of the result files), --arms
    (``arms``: the choices, None: any name; ``arms_default``: without the flag) and, where the
    scenario writes per-seed files, --aggregate (``aggregate`` says what it combines)."""
    import tempfile

    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0],
                    help="seeds this process runs one after another (seeds side by side: one process each)")
    if quick is not None:
        ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: by machine load)")
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "actuator-bench" / scenario,
                    help="scratch: trainer dirs and the controller's SQLite file (results go to --results)")
    ap.add_argument("--results", type=Path, default=RESULTS,
                    help="folder of the result files (variants and calibrations: a subfolder, so they do not "
                         "mix with the arm rows of benchmarks/results)")
    ap.add_argument("--tag", default="", help=tag_help or "suffix of the result files (a variant run)")
    if arms is not None or arms_default is not None:
        ap.add_argument("--arms", nargs="+", default=None if arms_default is None else list(arms_default),
                        help=arms_help, **({"choices": list(arms)} if arms is not None else {}))
    if aggregate is not None:
        ap.add_argument("--aggregate", action="store_true", help=aggregate)


def add_flags(ap: Any, flags: dict[str, tuple[Any, str]]) -> None:
    """A scenario's numeric parameters as a table, ``{"--flag": (default, help)}``: each flag
    takes the type of its default."""
    for name, (default, text) in flags.items():
        ap.add_argument(name, type=type(default), default=default, help=text)


def start(a: argparse.Namespace, scratch: Path | None = None, controller: bool = True) -> str:
    """A run's start: the scratch folder, torch threads (``--threads`` or by machine load) and the
    embedded controller service over a SQLite file in ``scratch`` (default ``--out``); returns its
    URL ("" without ``controller``)."""
    import torch

    a.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(pick_threads(a.threads))
    return start_controller(scratch or a.out) if controller else ""


def for_each_seed(a: argparse.Namespace, run_seed: Callable[[int], Any]) -> Any:
    """The seed loop: ``run_seed(seed)`` for each of ``--seeds`` in this process, in order; returns
    the last one's result. Seeds run side by side as one process each (``--seeds N --threads T``),
    each writing its own per-seed file, and ``--aggregate`` combines them."""
    out = None
    for seed in a.seeds:
        out = run_seed(seed)
    return out


# -- per-seed result files ----------------------------------------------------------------------
def seed_path(results: Path, scenario: str, seed: int, tag: str = "") -> Path:
    """``<results>/<scenario>-seed<N><tag>.json``: one seed's result file."""
    return results / f"{scenario}-seed{seed}{tag}.json"


def write_seed(path: Path, out: dict[str, Any], say: bool = True) -> None:
    """Write one seed's result file (its folder made as needed); rewritten after every arm, so a
    run cut short keeps the arms it finished."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=str))
    if say:
        console.print(f"wrote {path}")


def read_seeds(results: Path, pattern: str, keep: Callable[[Path], bool] = lambda p: True
               ) -> list[tuple[Path, dict[str, Any]]]:
    """The per-seed files ``pattern`` matches in ``results`` that ``keep`` keeps, sorted by name,
    each with its JSON; none is an error that says to run the seeds first."""
    found = [(f, json.loads(f.read_text())) for f in sorted(results.glob(pattern)) if keep(f)]
    if not found:
        raise SystemExit(f"no {pattern} in {results}: run the seeds first")
    return found


def read_tagged(results: Path, scenario: str, tag: str = "", tags: Sequence[str] | None = None
                ) -> list[tuple[Path, dict[str, Any]]]:
    """A scenario's per-run files for ``--aggregate``: ``SCENARIO-TAG*.json`` (every
    ``SCENARIO*.json`` without a tag), or with ``tags`` those of every tag listed (``-``: the
    untagged ``SCENARIO.json``), each file once, the aggregates left out."""
    patterns = [f"{scenario}.json" if t == "-" else f"{scenario}-{t}*.json" for t in tags] if tags else \
        [f"{scenario}-{tag}*.json" if tag else f"{scenario}*.json"]
    found: list[tuple[Path, dict[str, Any]]] = []
    for pattern in patterns:
        found += [f for f in read_seeds(results, pattern, keep=lambda f: "-aggregate" not in f.stem)
                  if f[0] not in {g for g, _ in found}]
    return found


# -- aggregation --------------------------------------------------------------------------------
def mean_sd(values: Sequence[float | None]) -> tuple[float, float]:
    """Mean and sample sd of the finite values (sd 0 for one value; NaN, NaN for none)."""
    import math
    import statistics

    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def fmt_ms(values: Sequence[float | None], spec: str = ".3f", bare_single: bool = False) -> str:
    """``mean ± sd`` of ``values`` with ``spec`` ("-" for none; with ``bare_single`` one value
    alone)."""
    import math

    m, s = mean_sd(values)
    if math.isnan(m):
        return "-"
    if bare_single and len([v for v in values if v is not None]) == 1:
        return f"{m:{spec}}"
    return f"{m:{spec}} ± {s:{spec.lstrip('+')}}"


def spread(per_seed: dict[int, float], higher_is_better: bool = True) -> dict[str, Any]:
    """Mean ± sd over seeds and the worst seed (its number and value)."""
    if not per_seed:
        return {"mean": None, "sd": None, "worst_seed": None, "worst": None, "seeds": []}
    m, s = mean_sd(list(per_seed.values()))
    worst = (min if higher_is_better else max)(per_seed, key=lambda k: per_seed[k])
    return {"mean": m, "sd": s, "worst_seed": worst, "worst": per_seed[worst], "seeds": sorted(per_seed)}


SEEDS_NEEDED, SEEDS_OF = 4, 5


def verdict(per_seed: dict[int, bool], on_mean: bool) -> dict[str, Any]:
    """A target's verdict: met only when it holds on at least 4 of 5 seeds (the same share of
    more) and on the mean. With fewer than 5 seeds it is judged on all of them and ``note`` says
    on how many."""
    import math

    n, held = len(per_seed), sum(bool(v) for v in per_seed.values())
    need = max(SEEDS_NEEDED, math.ceil(n * SEEDS_NEEDED / SEEDS_OF)) if n >= SEEDS_OF else n
    out: dict[str, Any] = {"met": bool(n) and held >= need and bool(on_mean), "seeds_held": held, "seeds": n,
                           "seeds_needed": need, "on_mean": bool(on_mean)}
    if n < SEEDS_OF:
        out["note"] = f"judged on {n} seed{'s' if n != 1 else ''} (the rule asks {SEEDS_NEEDED} of {SEEDS_OF})"
    return out


def judged(target: dict[str, Any], per_seed: dict[int, bool]) -> dict[str, Any]:
    """``target``, whose ``met`` says whether it holds on the mean over seeds, under the rule of
    :func:`verdict`: ``met`` only when it holds on the mean and on at least 4 of 5 seeds (with
    fewer seeds, on every one, and ``seeds_note`` says how many). The verdict on the mean stays as
    ``met_on_mean``, and ``held_per_seed`` shows each seed."""
    v = verdict(per_seed, target["met"])
    out = {**target, "met": v["met"], "met_on_mean": v["on_mean"],
           "held_per_seed": {str(s): bool(per_seed[s]) for s in sorted(per_seed)},
           "seeds_held": v["seeds_held"], "seeds_needed": v["seeds_needed"]}
    if "note" in v:
        out["seeds_note"] = v["note"]
    return out


def pick_on_seed0(candidates: Sequence[str], score: Callable[[str, int], float | None], seeds: Sequence[int],
                  feasible: Callable[[str, Sequence[int]], bool] | None = None) -> dict[str, Any]:
    """A fixed setting picked as a user would: the best ``score(name, seed)`` on seed 0 (among the
    ``feasible`` ones when any is), judged on the other seeds; beside it the best in hindsight on
    those seeds, which no user could have picked. Higher scores are better; a None score leaves
    the candidate out on that seed."""
    import statistics

    later = [s for s in seeds if s != 0]

    def best(on: Sequence[int]) -> str | None:
        pool = [c for c in candidates if on and all(score(c, s) is not None for s in on)]
        ok = [c for c in pool if feasible is None or feasible(c, on)] or pool
        return max(ok, key=lambda c: statistics.fmean(score(c, s) for s in on)) if ok else None  # type: ignore[misc]

    return {"picked_on_seed0": best([0]) if 0 in seeds else None, "best_in_hindsight": best(later),
            "judged_on": later}


def control_quality(trace: list[dict[str, float]], target: float, band: float) -> dict[str, Any]:
    """Settling step (first step from which every later measurement is within ±band of the
    target; None if the last one is outside), overshoot %, steady-state error %."""
    kl = [t["kl_drift"] for t in trace]
    steps = [t["step"] for t in trace]
    settled = None
    for i in range(len(kl) - 1, -1, -1):
        if abs(kl[i] - target) > band * target:
            break
        settled = steps[i]
    tail = kl[-3:]
    return {
        "settling_step": settled,
        "overshoot_pct": max(0.0, 100 * (max(kl) / target - 1)) if kl else None,
        "steady_state_error_pct": 100 * sum(abs(k - target) for k in tail) / target / max(1, len(tail)),
        "final_kl": sum(tail) / max(1, len(tail)),
        "peak_kl": max(kl) if kl else None,
    }


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
                 t_start: float | None = None, results: Path = RESULTS) -> None:
    """Write ``<results>/<scenario>.json`` and ``.png`` and say so."""
    results.mkdir(parents=True, exist_ok=True)
    out.setdefault("machine", machine())
    if t_start is not None:
        out.setdefault("wall_seconds", time.time() - t_start)
    (results / f"{scenario}.json").write_text(json.dumps(out, indent=2, default=str))
    plot(out, results / f"{scenario}.png")
    took = f" ({out['wall_seconds']:.0f} s)" if "wall_seconds" in out else ""
    console.print(f"wrote {results / (scenario + '.json')} and {scenario}.png{took}")


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


def kl_adaptive_lr(a: argparse.Namespace) -> Any:
    """The ``kl-adaptive-lr`` arm's rule: TorchRL's KLAdaptiveLR at the KL target, its factor, and
    bounds ``--kl-lr-bounds`` × ``--lr``."""
    from actuator.controllers import KLAdaptiveLR

    lo, hi = a.kl_lr_bounds
    return KLAdaptiveLR(a.target, factor=a.kl_lr_factor, min_lr=a.lr * lo, max_lr=a.lr * hi)


class KLBaselines:
    """The open-loop rules of a KL scenario's baseline arms, applied at each measurement of the KL:
    ``ziegler`` (Ziegler et al.'s adaptive β on the β knob, n = samples since its last update) and
    ``kl-adaptive-lr`` (TorchRL's KLAdaptiveLR on the learning rate: the schedule's peak, constant
    in these scenarios, as for every lr arm). Any other arm kind: nothing."""

    def __init__(self, kind: str, a: argparse.Namespace, samples_per_step: int) -> None:
        from actuator.controllers import AdaptiveKLController

        self.ziegler = AdaptiveKLController(a.beta, a.target, a.horizon) if kind == "ziegler" else None
        self.kl_lr = kl_adaptive_lr(a) if kind == "kl-adaptive-lr" else None
        self.samples_per_step = samples_per_step
        self._state: Any = None
        self._last_update = 0

    def update(self, value: float, step: int, beta_knob: Any, optimizer: Any, scheduler: Any) -> None:
        if self.ziegler is not None:
            n = (step - self._last_update) * self.samples_per_step
            beta, self._state = self.ziegler.update(value, n, self._state)
            beta_knob.apply(beta)
            self._last_update = step
        if self.kl_lr is not None:
            from actuator.agents.knobs import LearningRateKnob

            lr_knob = LearningRateKnob(optimizer, scheduler)
            lr_knob.apply(self.kl_lr.update(value, lr_knob.read()))


def variant_label(controllers: Sequence[dict[str, Any]]) -> str:
    """An arm's issue-40 variant, for its name: "" for the plain laws, else " (predict H)",
    " (ramp N)" or both, read off its controllers (so an aggregate names a stored run the same way
    from the controllers its file records)."""
    h = max((c.get("horizon") or 0 for c in controllers), default=0)
    r = max((c.get("setpoint_ramp") or 0 for c in controllers), default=0)
    parts = ([f"predict {h:g}"] if h else []) + ([f"ramp {r:g}"] if r else [])
    return f" ({', '.join(parts)})" if parts else ""


def settles_against_ziegler(step: int | None, ziegler_step: int | None) -> bool:
    """Issue 40's settling target on one seed: settled (``step`` not None) in at most half
    Ziegler's settling steps, or within the run where Ziegler never settles."""
    if step is None:
        return False
    return ziegler_step is None or step <= ziegler_step / 2


def kl_trace(key: str, knob: Any, beta: float, trace: list[dict[str, float]], *, cb: Any, suite: Any,
             on_value: Callable[[int, float, dict[str, Any]], None], advance: Callable[[], None],
             on_log: Callable[[int, dict[str, Any]], None] | None = None) -> Any:
    """The KL scenarios' trace callback (a ``TrainerCallback``): the arm's step-0 reading of probe
    ``key`` (:func:`trace_start`), then at each step end the arm's value of it (:func:`probe_value`)
    handed to ``on_value(step, value, event_kwargs)`` and the progress bar ``advance``-d; the
    trainer's logs to ``on_log(step, logs)`` when given."""
    from transformers import TrainerCallback

    class Trace(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kw):  # noqa: ANN001
            trace_start(trace, key, knob.read(), suite=suite, model=model)

        def on_step_end(self, args, state, control, model=None, **kw):  # noqa: ANN001
            step = state.global_step
            trace_start(trace, key, beta, cb=cb)
            value = probe_value(cb, suite, model, step, key)
            if value is not None:
                on_value(step, value, kw)
            advance()

        def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001
            if logs and on_log is not None:
                on_log(state.global_step, logs)

    return Trace()


def probe_value(cb: Any, suite: Any, model: Any, step: int, key: str) -> float | None:
    """The probe value ``key`` an arm measured at ``step``: from the controlled arm's callback
    history, else from the arm's own suite (run here)."""
    if cb is not None:
        return next((h["probes"][key] for h in reversed(cb.session.history) if h["step"] == step and key in h["probes"]),
                    None)
    rep = suite.run(model, step)
    return rep.values.get(key) if rep is not None else None


def trace_start(trace: list[dict[str, float]], key: str, beta: float, *, suite: Any = None, model: Any = None,
                cb: Any = None) -> None:
    """The trace's step-0 reading of probe ``key``, once: from the arm's own suite at train begin
    (set up there), or from a controlled arm's first observation (``cb``'s history)."""
    if trace:
        return
    if suite is not None and model is not None:
        suite.setup(model)
        trace.append({"step": 0, key: suite.run(model, 0, force=True).values[key], "beta": beta})
    elif cb is not None and cb.session.history and key in cb.session.history[0]["probes"]:
        trace.append({"step": 0, key: cb.session.history[0]["probes"][key], "beta": beta})
