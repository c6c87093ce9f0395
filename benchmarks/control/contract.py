"""The scenario contract (issue 53): what a scenario declares, and what the harness does with it.

A scenario (:class:`Scenario`) declares

- its task (one line: what is trained, on what);
- its arms (:class:`Arm`: a name, a kind and the parameters its run needs; ``arms(quick=True)``
  the few a ``--quick`` run takes);
- its metrics (:class:`Metric`: name, direction, unit and, where the scenario makes a claim, a
  target: a bound, absolute or relative to another arm or to the fixed setting picked on seed 0);
- its picks (:class:`Pick`: a fixed setting chosen among candidate arms on seed 0);

and runs one arm on one seed, ``run_arm(seed, arm)``, returning a typed :class:`ArmResult` (the
metric values and the trace). Everything else is done here, once, over typed results:

- the seed loop and the per-seed files (:func:`run`, :func:`write_seed`), the ``--quick`` mode;
- reading stored runs, old per-seed files included, through ONE loader (:func:`load_results`);
- the validation split (:func:`validate`): choices on seed 0, the tuning-stage claim on seeds
  1–4, fresh seeds 5–9 before a figure is quoted. Figures are quoted over seeds 1–9: the mean,
  the range, the worst seed and how many seeds meet the target. A target is **met** only if it
  holds on at least 8 of 9 of those seeds *and* on the mean; fewer seeds: the same share, and
  the verdict says it is provisional. Where the fresh seeds disagree with seeds 1–4 (the verdict
  differs, or their mean lies outside the tuning seeds' mean ± 2 sd) the aggregate says so;
- the pick on seed 0, judged on seeds 1–9 with the best in hindsight shown (:func:`pick`);
- the printed table (:func:`table`), the aggregate file and its plot (:func:`save`).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

Direction = Literal["min", "max"]
CHOICE_SEEDS = (0,)
TUNING_SEEDS = (1, 2, 3, 4)
FRESH_SEEDS = (5, 6, 7, 8, 9)
NEEDED, OF = 8, 9


@dataclass(frozen=True)
class Metric:
    """One figure an arm is measured by. ``direction``: "min" when lower is better. ``target``: the
    bound a seed's value must meet (None: reported only), scaled by the value of ``relative_to`` on
    the same seeds when set (an arm's name, or ``pick:NAME`` for the arm :class:`Pick` NAME chose on
    seed 0) — its own value of this metric, or of ``ref_metric`` (rewind: the final model against the
    open loop's *best* reading); ``judge``: the arms whose verdict is quoted (empty: every arm but the
    reference). ``read`` takes the value from a stored record (default: ``record[name]``)."""

    name: str
    direction: Direction
    unit: str = ""
    target: float | None = None
    relative_to: str | None = None
    judge: tuple[str, ...] = ()
    read: Callable[[Mapping[str, Any]], float | None] | None = None
    label: str = ""
    ref_metric: str | None = None  # the reference arm's metric the target scales (default: this one)

    def value(self, record: Mapping[str, Any]) -> float | None:
        v = self.read(record) if self.read is not None else record.get(self.name)
        return None if v is None else float(v)

    def bound(self, ref: float | None) -> float | None:
        """The bound a value must meet (None: no target, or a relative one without its reference)."""
        if self.target is None or (self.relative_to is not None and ref is None):
            return None
        return self.target * (ref if self.relative_to is not None else 1.0)  # type: ignore[operator]

    def holds(self, value: float | None, ref: float | None = None) -> bool | None:
        """Whether ``value`` meets the target (None: nothing to judge)."""
        b = self.bound(ref)
        if b is None or value is None or not math.isfinite(value):
            return None
        return value <= b if self.direction == "min" else value >= b

    def worse(self, a: float, b: float) -> bool:
        return a > b if self.direction == "min" else a < b


@dataclass(frozen=True)
class Arm:
    """One arm of a scenario: its name (unique in the scenario), its kind and its parameters."""

    name: str
    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class ArmResult:
    """One arm's run on one seed: the metric values, the trace (one dict a measurement, with its
    ``step``) and the full stored record (the scenario's own fields)."""

    arm: str
    kind: str
    seed: int
    metrics: dict[str, float | None]
    trace: list[dict[str, Any]] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    def to_record(self) -> dict[str, Any]:
        """The stored form: the scenario's record with the metrics, the trace and who ran."""
        return {**self.record, **self.metrics, "arm": self.arm, "kind": self.kind, "seed": self.seed,
                "trace": self.trace}


@dataclass(frozen=True)
class Pick:
    """A fixed setting chosen as a user would: the best value of ``metric`` on seed 0 among the
    ``candidates`` (arm names), then judged on seeds 1–9 beside the best in hindsight."""

    name: str
    metric: str
    candidates: tuple[str, ...]


class Scenario(Protocol):
    """What a scenario file declares; :func:`run`, :func:`validate` and :func:`save` do the rest."""

    name: str
    task: str
    metrics: Sequence[Metric]
    picks: Sequence[Pick]
    plots: Sequence[str]

    def arms(self, quick: bool = False) -> Sequence[Arm]: ...

    def run_arm(self, seed: int, arm: Arm) -> ArmResult: ...


# -- running: seeds and per-seed files ----------------------------------------------------------
def seed_file(results: Path, scenario: str, seed: int, tag: str = "") -> Path:
    """``<results>/<scenario>-seed<N><tag>.json``: one seed's file (the name every scenario used)."""
    return results / f"{scenario}-seed{seed}{tag}.json"


def write_seed(path: Path, scenario: Scenario, seed: int, done: Sequence[ArmResult]) -> None:
    """One seed's file, rewritten after every arm (a run cut short keeps the arms it finished)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    out = {"scenario": scenario.name, "task": scenario.task, "seed": seed,
           "arms": [r.to_record() for r in done]}
    path.write_text(json.dumps(out, indent=2, default=str))


def run(scenario: Scenario, seeds: Sequence[int], results: Path, tag: str = "", quick: bool = False,
        only: Sequence[str] | None = None) -> list[ArmResult]:
    """Every arm (``only``: those named; ``quick``: the scenario's quick arms) on every seed, one
    after another, each seed's results in its own file."""
    arms = [a for a in scenario.arms(quick) if only is None or a.name in only]
    out: list[ArmResult] = []
    for seed in seeds:
        done: list[ArmResult] = []
        for arm in arms:
            # read back as a stored run is: a fresh result and a loaded one are the same
            done.append(as_result(scenario, scenario.run_arm(seed, arm).to_record()))
            write_seed(seed_file(results, scenario.name, seed, tag), scenario, seed, done)
        out += done
    return out


# -- the ONE loader of stored runs ----------------------------------------------------------------
Normalize = Callable[[Mapping[str, Any], dict[str, Any]], dict[str, Any]]


def load_results(scenario: Scenario, files: Iterable[Path],
                 normalize: Normalize | None = None) -> list[ArmResult]:
    """Every run stored in ``files``, as typed results: per-seed files of this contract, the older
    per-seed and per-run files of every scenario (``{"arms": [record, …]}``), and older aggregates
    (which keep every run in ``arms``). ``normalize(file, record)`` is the scenario's one place for
    what an older file stored differently (e.g. a name its aggregate completed from the file's
    configuration). A later file's run of the same arm and seed replaces an earlier one."""
    runs: dict[tuple[str, int], ArmResult] = {}
    for f in files:
        part = json.loads(Path(f).read_text())
        for rec in part.get("arms", []):
            r = as_result(scenario, normalize(part, dict(rec)) if normalize is not None else rec, Path(f).name)
            runs[(r.arm, r.seed)] = r
    return list(runs.values())


def as_result(scenario: Scenario, record: Mapping[str, Any], source: str = "") -> ArmResult:
    """A run's record (the dict a scenario's run writes, old or new) as a typed result."""
    rec = dict(record)
    return ArmResult(arm=rec["arm"], kind=rec.get("kind", ""), seed=int(rec["seed"]),
                     metrics={m.name: m.value(rec) for m in scenario.metrics}, trace=list(rec.get("trace") or []),
                     record=rec, source=source)


def tagged_files(results: Path, scenario: str, tags: Sequence[str]) -> list[Path]:
    """The per-seed files of ``tags`` in ``results`` (``SCENARIO-TAG*.json``; a tag starting with
    "-" is a suffix: ``SCENARIO-seed*TAG.json``; ``-``: the untagged ``SCENARIO.json``), the
    aggregates left out, each file once; none is an error that says to run the seeds first."""
    found: list[Path] = []
    for t in tags:
        pattern = (f"{scenario}.json" if t == "-" else f"{scenario}-seed*{t}.json" if t.startswith("-")
                   else f"{scenario}-{t}*.json")
        found += [f for f in sorted(results.glob(pattern)) if "-aggregate" not in f.stem and f not in found]
    if not found:
        raise SystemExit(f"no {scenario} files of tags {list(tags)} in {results}: run the seeds first")
    return found


# -- the validation split -------------------------------------------------------------------------
def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _need(n: int) -> int:
    return math.ceil(n * NEEDED / OF)


def _holds_share(m: Metric, values: Mapping[int, float], refs: Mapping[int, float | None],
                 seeds: Sequence[int]) -> tuple[int, int, bool | None]:
    """(seeds held, seeds judged, holds on the mean) of ``m`` over ``seeds``."""
    judged = [s for s in seeds if s in values and m.holds(values[s], refs.get(s)) is not None]
    held = sum(bool(m.holds(values[s], refs.get(s))) for s in judged)
    ref_vals = [r for s in judged if (r := refs.get(s)) is not None]
    mean_ref = _mean(ref_vals) if m.relative_to is not None else None
    on_mean = m.holds(_mean([values[s] for s in judged]), mean_ref) if judged else None
    return held, len(judged), on_mean


def _verdict(held: int, n: int, on_mean: bool | None) -> bool | None:
    return None if not n or on_mean is None else held >= _need(n) and on_mean


def _disagreement(m: Metric, values: Mapping[int, float], refs: Mapping[int, float | None]) -> list[str]:
    """Why the fresh seeds (5–9) disagree with the tuning seeds (1–4), if they do."""
    tune = [values[s] for s in TUNING_SEEDS if s in values]
    fresh = [values[s] for s in FRESH_SEEDS if s in values]
    if not tune or not fresh:
        return []
    why: list[str] = []
    vt = _verdict(*_holds_share(m, values, refs, TUNING_SEEDS))
    vf = _verdict(*_holds_share(m, values, refs, FRESH_SEEDS))
    if vt is not None and vf is not None and vt != vf:
        why.append(f"target {'met' if vt else 'missed'} on seeds 1-4, {'met' if vf else 'missed'} on 5-9")
    mt, mf = statistics.fmean(tune), statistics.fmean(fresh)
    sd = statistics.stdev(tune) if len(tune) > 1 else 0.0
    if abs(mf - mt) > 2 * sd + 1e-12 * max(1.0, abs(mt)):
        why.append(f"mean {mf:.4g} on seeds 5-9 outside {mt:.4g} ± 2×{sd:.2g} of seeds 1-4")
    return why


@dataclass
class Figure:
    """One metric of one arm over the judged seeds (1–9): what a README quotes."""

    arm: str
    metric: str
    unit: str
    direction: Direction
    seeds: list[int]
    per_seed: dict[int, float]
    mean: float | None
    sd: float | None
    low: float | None
    high: float | None
    worst_seed: int | None
    worst: float | None
    tuning_mean: float | None
    fresh_mean: float | None
    target: float | None = None
    relative_to: str | None = None
    seeds_met: int | None = None
    seeds_judged: int | None = None
    seeds_needed: int | None = None
    met_on_mean: bool | None = None
    met: bool | None = None
    provisional: bool = False
    disagreement: list[str] = field(default_factory=list)


def _worst(m: Metric, mine: Mapping[int, float]) -> int | None:
    return max(mine, key=lambda s: mine[s] if m.direction == "min" else -mine[s]) if mine else None


def _sd(vals: Sequence[float]) -> float | None:
    return statistics.stdev(vals) if len(vals) > 1 else (0.0 if vals else None)


def _on(mine: Mapping[int, float], seeds: Sequence[int]) -> list[float]:
    return [mine[s] for s in seeds if s in mine]


def figure(m: Metric, arm: str, values: Mapping[int, float], refs: Mapping[int, float | None],
           seeds: Sequence[int]) -> Figure:
    """``m`` of ``arm`` over ``seeds`` (those it ran), with its verdict when it has a target."""
    mine = {s: values[s] for s in seeds if s in values}
    vals = list(mine.values())
    worst = _worst(m, mine)
    f = Figure(arm=arm, metric=m.name, unit=m.unit, direction=m.direction, seeds=sorted(mine), per_seed=mine,
               mean=_mean(vals), sd=_sd(vals), low=min(vals, default=None), high=max(vals, default=None),
               worst_seed=worst, worst=None if worst is None else mine[worst],
               tuning_mean=_mean(_on(mine, TUNING_SEEDS)), fresh_mean=_mean(_on(mine, FRESH_SEEDS)))
    if m.target is not None and (not m.judge or arm in m.judge) and arm != m.relative_to:
        _judge(f, m, mine, refs, seeds)
    return f


def _judge(f: Figure, m: Metric, mine: Mapping[int, float], refs: Mapping[int, float | None],
           seeds: Sequence[int]) -> None:
    """``f``'s verdict on ``m``'s target over ``seeds``, and where seeds 5-9 disagree with 1-4."""
    held, n, on_mean = _holds_share(m, mine, refs, seeds)
    ref = m.relative_to if m.relative_to is None or m.ref_metric is None else f"{m.relative_to}'s {m.ref_metric}"
    f.target, f.relative_to, f.seeds_met, f.seeds_judged, f.seeds_needed = m.target, ref, held, n, _need(n)
    f.met_on_mean, f.met, f.provisional = on_mean, _verdict(held, n, on_mean), n < OF
    f.disagreement = _disagreement(m, mine, refs)


@dataclass
class PickResult:
    """A fixed setting picked on seed 0 and judged on the later seeds, the best in hindsight beside."""

    name: str
    metric: str
    picked_on_seed0: str | None
    best_in_hindsight: str | None
    judged_on: list[int]
    picked_mean: float | None
    hindsight_mean: float | None


def pick(p: Pick, metric: Metric, runs: Sequence[ArmResult], judged_on: Sequence[int]) -> PickResult:
    """The candidate with the best ``metric`` on seed 0, and the best on the mean over the judged
    seeds among the candidates that ran on all of them (the picked one when none did)."""
    val = {(r.arm, r.seed): r.metrics.get(p.metric) for r in runs}

    def best(names: Iterable[str], on: Sequence[int]) -> tuple[str | None, float | None]:
        scored = [(n, statistics.fmean(v for s in on if (v := val.get((n, s))) is not None)) for n in names
                  if on and all(val.get((n, s)) is not None for s in on)]
        sign = 1.0 if metric.direction == "min" else -1.0
        found = min(scored, key=lambda t: sign * t[1], default=None)
        return (None, None) if found is None else found

    chosen, _ = best(p.candidates, [0])
    later = [s for s in judged_on if s != 0 and any(val.get((c, s)) is not None for c in p.candidates)]
    hind, hmean = best(p.candidates, later)
    on_picked = [s for s in later if val.get((chosen, s)) is not None] if chosen else []
    pmean = _mean([val[(chosen, s)] for s in on_picked]) if chosen else None  # type: ignore[misc]
    if hind is None:
        hind, hmean = chosen, pmean
    return PickResult(p.name, p.metric, chosen, hind, later, pmean, hmean)


@dataclass
class Validation:
    """A scenario's aggregate under the validation split."""

    scenario: str
    task: str
    seeds: list[int]
    judged_on: list[int]
    picks: list[PickResult]
    figures: list[Figure]
    files: list[str]

    @property
    def disagreements(self) -> list[Figure]:
        return [f for f in self.figures if f.disagreement]

    def get(self, arm: str, metric: str) -> Figure:
        return next(f for f in self.figures if f.arm == arm and f.metric == metric)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["disagreement"] = [f"{f.arm}: {f.metric}: {'; '.join(f.disagreement)}" for f in self.disagreements]
        return out


def _refs(m: Metric, runs: Sequence[ArmResult], picks: Mapping[str, PickResult]) -> dict[int, float | None]:
    """The reference values of a relative target, per seed (empty for an absolute one)."""
    if m.relative_to is None:
        return {}
    ref = m.relative_to
    if ref.startswith("pick:"):
        ref = picks[ref[5:]].picked_on_seed0 or ""
    return {r.seed: r.metrics.get(m.ref_metric or m.name) for r in runs if r.arm == ref}


def validate(scenario: Scenario, runs: Sequence[ArmResult], files: Sequence[str] = (),
             judged_on: Sequence[int] = TUNING_SEEDS + FRESH_SEEDS) -> Validation:
    """The aggregate of ``runs`` under the validation split: each pick made on seed 0, every arm's
    metrics over ``judged_on`` (seeds 1–9) with the verdicts and the disagreement flags."""
    by_name = {m.name: m for m in scenario.metrics}
    picks = {p.name: pick(p, by_name[p.metric], runs, judged_on) for p in scenario.picks}
    seeds = sorted({r.seed for r in runs})
    figures: list[Figure] = []
    for arm in dict.fromkeys(r.arm for r in runs):
        for m in scenario.metrics:
            values = {r.seed: v for r in runs if r.arm == arm and (v := r.metrics.get(m.name)) is not None}
            if values:
                figures.append(figure(m, arm, values, _refs(m, runs, picks), judged_on))
    return Validation(scenario.name, scenario.task, seeds, list(judged_on), list(picks.values()), figures,
                      list(files))


# -- printing, the aggregate file and its plot ----------------------------------------------------
def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def verdict_text(f: Figure) -> str:
    """"met (9 of 9)", "missed (6 of 9)", "met (4 of 4, provisional)" or "" without a target."""
    if f.met is None:
        return "" if f.target is None else "not judged"
    return (f"{'met' if f.met else 'missed'} ({f.seeds_met} of {f.seeds_judged}" + (", provisional" if f.provisional else "")
            + ("" if f.met_on_mean else ", not on the mean") + ")")


def table(v: Validation) -> list[str]:
    """The printed table: a figure a line, then the picks and every disagreement."""
    lines = [f"{v.scenario}: {v.task}", f"seeds run {v.seeds}; figures over seeds {v.judged_on} "
             f"(a target is met on >= {NEEDED} of {OF} seeds and on the mean)",
             f"{'arm':<44} {'metric':<22} {'mean':>9} {'sd':>8} {'range':>19} {'worst (seed)':>16}  verdict"]
    for f in v.figures:
        lines.append(f"{f.arm[:44]:<44} {f.metric[:22]:<22} {_num(f.mean):>9} {_num(f.sd):>8} "
                     f"{_num(f.low) + '..' + _num(f.high):>19} {_num(f.worst) + f' ({f.worst_seed})':>16}  "
                     f"{verdict_text(f)}")
    for p in v.picks:
        lines.append(f"pick {p.name} on seed 0: {p.picked_on_seed0} ({p.metric} {_num(p.picked_mean)} on seeds "
                     f"{p.judged_on}); best in hindsight: {p.best_in_hindsight} ({_num(p.hindsight_mean)})")
    for f in v.disagreements:
        lines.append(f"DISAGREEMENT {f.arm}: {f.metric}: {'; '.join(f.disagreement)}")
    return lines


def plot(v: Validation, runs: Sequence[ArmResult], keys: Sequence[str], path: Path) -> None:
    """Each trace key of ``keys`` against the step, every arm and seed (fresh seeds dashed). A run's
    record may carry ``marks`` (``[{"step", "label"}]``: events such as a rewind, a dotted line in the
    arm's colour) and ``spans`` (``[{"from", "to", "label"}]``: stretches such as a fault, shaded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, max(1, len(keys)), figsize=(6 * max(1, len(keys)), 4.3), squeeze=False)
    colours: dict[str, Any] = {}
    try:
        for ax, key in zip(axes[0], keys, strict=False):
            for r in runs:
                pts = [(t["step"], t[key]) for t in r.trace if t.get(key) is not None]
                if not pts:
                    continue
                line = ax.plot(*zip(*pts, strict=True), ls="--" if r.seed in FRESH_SEEDS else "-", lw=1,
                               color=colours.get(r.arm), label=None if r.arm in colours else r.arm)
                colours.setdefault(r.arm, line[0].get_color())
                _marks(ax, r, colours[r.arm])
            values = [float(t[key]) for r in runs for t in r.trace if isinstance(t.get(key), (int, float))]
            if values and min(values) > 0 and max(values) > 8 * min(values):  # e.g. a perplexity from 28 to 2
                ax.set_yscale("log")
            ax.set_title(f"{key} (seeds 5-9 dashed)")
            ax.set_xlabel("step")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=90)
    finally:
        plt.close(fig)


def _marks(ax: Any, r: ArmResult, colour: Any) -> None:
    """A run's events (dotted, labelled at the top) and spans (shaded once per stretch) on ``ax``."""
    record = r.record if isinstance(r.record, dict) else {}
    shaded = {(p.get_x(), p.get_width()) for p in ax.patches}
    for span in record.get("spans") or ():
        lo, hi = float(span["from"]), float(span["to"])
        if (lo, hi - lo) not in shaded:
            ax.axvspan(lo, hi, color="grey", alpha=0.12, lw=0, label=span.get("label"))
    for mark in record.get("marks") or ():
        ax.axvline(float(mark["step"]), color=colour, ls=":", lw=0.9)
        ax.annotate(str(mark.get("label", "")), (float(mark["step"]), 1.0), xycoords=("data", "axes fraction"),
                    fontsize=6, color=colour, rotation=90, va="top", ha="right")


def save(scenario: Scenario, v: Validation, runs: Sequence[ArmResult], results: Path, name: str) -> Path:
    """Write ``<results>/<name>.json`` (the validation and every run) and ``.png``; print the table."""
    results.mkdir(parents=True, exist_ok=True)
    out = results / f"{name}.json"
    out.write_text(json.dumps({**v.to_json(), "arms": [r.to_record() for r in runs]}, indent=2, default=str))
    plot(v, runs, scenario.plots, results / f"{name}.png")
    print("\n".join(table(v)))
    print(f"wrote {out} and {name}.png")
    return out


# -- a declared scenario --------------------------------------------------------------------------
@dataclass
class Declared:
    """A scenario as its file declares it (:class:`Scenario`): the task, the arms (``quick``: the
    names a ``--quick`` run takes), the metrics, the picks, the trace keys to plot, how an older
    file's record reads (``normalize``) and how one arm runs on one seed (``runner``; a scenario
    whose runs need its own command line sets it when that line is parsed)."""

    name: str
    task: str
    metrics: Sequence[Metric]
    arm_list: Sequence[Arm]
    picks: Sequence[Pick] = ()
    plots: Sequence[str] = ()
    quick: Sequence[str] = ()
    normalize: Normalize | None = None
    runner: Callable[[int, Arm], ArmResult] | None = None

    def arms(self, quick: bool = False) -> Sequence[Arm]:
        return [a for a in self.arm_list if not quick or a.name in self.quick]

    def run_arm(self, seed: int, arm: Arm) -> ArmResult:
        if self.runner is None:
            raise RuntimeError(f"{self.name}: run it through its command line (python -m benchmarks.control.…)")
        return self.runner(seed, arm)

    def result(self, record: Mapping[str, Any]) -> ArmResult:
        """A run's record (the dict a scenario's run writes) as a typed result."""
        return as_result(self, record)

    def load(self, files: Iterable[Path]) -> list[ArmResult]:
        """The stored runs of the declared arms in ``files`` (:func:`load_results`)."""
        names = {a.name for a in self.arm_list}
        return [r for r in load_results(self, files, self.normalize) if r.arm in names]


# -- the command line every scenario on the contract shares --------------------------------------
def main(scenario: Scenario, argv: Sequence[str] | None = None, results: Path | None = None) -> Validation:
    """``--seeds`` (run these, one per-seed file each), ``--quick`` (the quick arms only),
    ``--arms``, ``--tag``, ``--results``; ``--aggregate``: run nothing, combine the per-seed files of
    ``--tag`` under the validation split and write ``SCENARIO-aggregate[TAG].json`` / ``.png``."""
    import argparse

    ap = argparse.ArgumentParser(description=scenario.task)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--quick", action="store_true", help="the scenario's quick arms only")
    ap.add_argument("--arms", nargs="+", default=None, choices=[a.name for a in scenario.arms()])
    ap.add_argument("--tag", default="", help="suffix of the per-seed files")
    ap.add_argument("--results", type=Path, default=results or Path("benchmarks/results"))
    ap.add_argument("--aggregate", action="store_true", help="combine the per-seed files; run nothing")
    a = ap.parse_args(argv)
    if a.aggregate:
        files = sorted(a.results.glob(f"{scenario.name}-seed*{a.tag}.json"))
        if not files:
            raise SystemExit(f"no {scenario.name}-seed*{a.tag}.json in {a.results}: run the seeds first")
        runs = load_results(scenario, files)
    else:
        runs = run(scenario, a.seeds, a.results, a.tag, a.quick, a.arms)
        files = [seed_file(a.results, scenario.name, s, a.tag) for s in a.seeds]
    v = validate(scenario, runs, [f.name for f in files])
    save(scenario, v, runs, a.results, f"{scenario.name}-aggregate{a.tag}")
    return v


def scenario_main(spec: Declared, own: Any, make_runner: Callable[[Any], Callable[[int, Arm], ArmResult]],
                  argv: Sequence[str] | None = None, quick: Callable[[Any], None] | None = None) -> Validation:
    """A declared scenario's command line: its own flags (``own``, an ``argparse`` parser without
    help; ``--out`` defaults to a scratch folder per scenario), ``quick`` shortening the run under
    ``--quick``, then the contract's flags (:func:`main`). The runner (``make_runner(args)``: the
    model, the service) is built at the first arm, so ``--aggregate`` and ``--help`` load nothing."""
    import tempfile

    a, rest = own.parse_known_args(argv)
    a.out = Path(a.out) if a.out else Path(tempfile.gettempdir()) / "actuator-bench" / spec.name
    if {"-h", "--help"} & set(rest):  # the scenario's own flags, then the contract's (which exits)
        print(own.format_help())
    if "--quick" in rest and quick is not None:
        quick(a)
    if "--aggregate" not in rest:
        runner: Callable[[int, Arm], ArmResult] | None = None

        def run_arm(seed: int, arm: Arm) -> ArmResult:
            nonlocal runner
            runner = runner or make_runner(a)
            return runner(seed, arm)

        spec.runner = run_arm
    return main(spec, rest)
