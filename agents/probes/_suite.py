"""ProbeSuite: runs the probes that are due, inside the safety wrapper, within a wall-time budget."""

from __future__ import annotations

import logging
import math
import time
from contextlib import ExitStack
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ._base import Probe
from ._common import logger, probe_mode
from ._reference import ReferenceModel

__all__ = ["ProbeReport", "ProbeSuite"]


@dataclass
class ProbeReport:
    """What one ``ProbeSuite.run`` measured.

    ``values`` holds every probe value plus the cost metrics ``probe_seconds.<name>`` (wall
    seconds of each probe that ran) and ``probe_share`` (probe seconds / wall seconds since
    setup, after this run), so the cost travels in the observation like any other value.
    ``probe_starved.<name>`` (consecutive skips) for each probe skipped for budget since it last
    ran. ``seconds`` repeats the per-probe seconds keyed by probe name. ``skipped`` names the probes
    that were due but skipped for budget; ``notes`` says why, and which probes were subsampled
    (``examples`` gives the number of examples each probe used). ``failed`` names probes that
    raised (``on_error="warn"``).
    """

    values: dict[str, float]
    seconds: dict[str, float]
    skipped: list[str]
    notes: list[str]
    step: int | None = None
    examples: dict[str, int] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)


class ProbeSuite:
    """Run due probes and keep their wall-time share under ``budget_share``.

    The share is probe seconds over wall seconds since ``setup`` (the suite keeps the clock).
    Spending ``x`` more seconds with ``P`` probe seconds and ``W`` wall seconds so far keeps
    ``(P + x) / (W + x) <= budget`` iff ``x <= (budget * W - P) / (1 - budget)``.

    The budget is shared out between scheduled probes in proportion to their demand (seconds
    per step a full measurement would need: cost per example x examples / ``every``), and
    each probe is held to its own part as well as to the whole. When the budget is short every
    probe is scaled down by the same factor, and a cheap probe running every step cannot eat
    the budget an expensive, rarer probe needs. Costs per example are learnt from past runs (a
    running average). Before each probe: if the full measurement fits, it runs; if a subset of
    at least ``probe.min_examples`` fits, it runs on that subset (evenly spaced,
    ``max_examples``); otherwise it is skipped, and the report's notes say so. A skipped probe
    keeps its unspent part, so it runs later rather than never.

    Probes named in ``priority`` (those feeding a controller: a controller without readings is
    not controlling, a guardrail can look rarely) share the whole budget among themselves and are
    run first at a step; the others are held to their part of every probe's demand and use what
    the first leave.

    The first measurement of each probe is not budgeted: it is the baseline a controller
    compares against and it calibrates the cost estimate. The share can therefore exceed the
    budget right after setup; probes are then skipped until it is back under. ``baseline=True``
    (the run's reading before its first step) is paid like setup instead: its costs are learnt,
    then the clock restarts, so a baseline as long as many training steps does not keep every
    probe out of the first steps. Runs at ``evaluate`` are held to the whole budget only;
    ``force=True`` runs every probe in full regardless of budget (a final or on-demand
    measurement). Setup time (reference copy, embedder load, reference answers) is not counted:
    it is paid once, before the clock starts.

    Probes named in ``whole`` (those a guardrail or a relative setpoint compares with a number
    stated on the whole measurement) are never subsampled: they run on every example or are
    skipped, since a subset's value is another measure (a perplexity over 4 of 8 sentences read
    +24% over all 8 on the same weights).

    ``lockstep`` (set for training sharded by FSDP2): every rank calls ``run`` at every step, and
    runs exactly the probes rank 0's budget lets run, in rank 0's order and with its example
    counts (see the attribute).
    """

    def __init__(
        self,
        probes: Sequence[Probe],
        *,
        budget_share: float = 0.10,
        on_error: Literal["warn", "raise"] = "warn",
        clock: Callable[[], float] = time.perf_counter,
        priority: Collection[str] = (),
        whole: Collection[str] = (),
    ) -> None:
        if not 0.0 < budget_share <= 1.0:
            raise ValueError(f"budget_share must be in (0, 1], got {budget_share}")
        if on_error not in ("warn", "raise"):
            raise ValueError(f"on_error must be 'warn' or 'raise', got {on_error!r}")
        names = [p.name for p in probes]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"probe names must be unique, repeated: {duplicates}")
        self.probes = list(probes)
        self.priority = set(priority)
        self.whole = set(whole)
        self.budget_share = float(budget_share)
        self.on_error = on_error
        self._clock = clock
        self._t0: float | None = None
        self._probe_seconds = 0.0
        self._cost_per_example: dict[str, float] = {}
        self._spent: dict[str, float] = {p.name: 0.0 for p in self.probes}
        self._skips: dict[str, int] = {p.name: 0 for p in self.probes}
        # Probes skipped for budget since their last measurement, with the warning's text: a
        # controller fed by a starved probe is not controlling, and the user must hear so.
        self.starved: dict[str, str] = {}
        self._warned: set[str] = set()
        # each probe's last reading: (seconds, examples, step): what a starvation warning quotes
        self._last: dict[str, tuple[float, int, int]] = {}
        self._first_step: int | None = None
        self.setup_seconds = 0.0
        # Sharded training (FSDP2): a function returning rank 0's value on every rank. Then every
        # rank runs the probes rank 0 runs at a step, in its order, on its number of examples: a
        # probe's forward passes are collectives (actuator.agents.sharded).
        self.lockstep: Callable[[Any], Any] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def add(self, probe: Probe) -> None:
        """Add ``probe`` before ``setup`` (the callback adds the probes a policy names that the run
        was not given)."""
        if self._t0 is not None:
            raise RuntimeError(f"probe {probe.name}: add probes before setup(): its reference is the model at setup")
        if any(p.name == probe.name for p in self.probes):
            raise ValueError(f"probe names must be unique, repeated: [{probe.name!r}]")
        self.probes.append(probe)
        self._spent[probe.name] = 0.0
        self._skips[probe.name] = 0

    def setup(self, model: Any) -> None:
        """Set every probe up (reference snapshots, embedder) and start the wall clock."""
        start = self._clock()
        snapshots: dict[int, Any] = {}  # drift probes share one frozen copy of the weights
        for probe in self.probes:
            holder = getattr(probe, "reference_holder", None)
            if isinstance(holder, ReferenceModel):
                holder.share(snapshots)
            probe.setup(model)
        self.setup_seconds = self._clock() - start
        self._t0 = self._clock()

    @property
    def probe_seconds(self) -> float:
        return self._probe_seconds

    @property
    def probe_share(self) -> float:
        """Probe wall seconds / wall seconds since setup (0 before anything ran)."""
        if self._t0 is None:
            return 0.0
        wall = self._clock() - self._t0
        return self._probe_seconds / wall if wall > 0 else 0.0

    def state_dict(self) -> dict[str, Any]:
        """Budget state for checkpoints, so a resumed run keeps its share and cost estimates."""
        wall = self._clock() - self._t0 if self._t0 is not None else 0.0
        return {
            "wall_seconds": wall,
            "probe_seconds": self._probe_seconds,
            "cost_per_example": dict(self._cost_per_example),
            "spent": dict(self._spent),
            "skips": dict(self._skips),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._t0 = self._clock() - float(state.get("wall_seconds", 0.0))
        self._probe_seconds = float(state.get("probe_seconds", 0.0))
        self._cost_per_example.update(state.get("cost_per_example", {}))
        for name, seconds in state.get("spent", {}).items():
            if name in self._spent:
                self._spent[name] = float(seconds)
        for name, count in state.get("skips", {}).items():
            if name in self._skips:
                self._skips[name] = int(count)

    # -- running ---------------------------------------------------------------------------
    def due(self, step: int, *, evaluate: bool = False) -> list[Probe]:
        return [p for p in self.probes if p.due(step) or (evaluate and p.on_evaluate)]

    def run(
        self, model: Any, step: int, *, evaluate: bool = False, force: bool = False, baseline: bool = False
    ) -> ProbeReport | None:
        """Run the probes due at ``step`` (all of them if ``force`` or ``baseline``); ``None`` if
        none is due. ``baseline``: the reading before training, paid like setup (class docstring)."""
        force = force or baseline
        due = list(self.probes) if force else self.due(step, evaluate=evaluate)
        if self.lockstep is not None:  # sharded: every rank runs what rank 0 runs, in its order
            due.sort(key=self._order)
            by_name = {p.name: p for p in self.probes}
            due = [by_name[name] for name in self.lockstep([p.name for p in due])]
        if not due:
            return None
        if self._t0 is None:
            logger.warning("ProbeSuite.run() before setup(): setting probes up now")
            self.setup(model)
        report = ProbeReport(values={}, seconds={}, skipped=[], notes=[], step=step)
        if self._first_step is None:
            self._first_step = step
        if self.lockstep is None:
            due.sort(key=self._order)
        budgeted = (self._probe_seconds, dict(self._spent))
        run_start = self._clock()
        spent = 0.0
        with ExitStack() as wrapper:
            entered = False
            for probe in due:
                limit = None
                if not force:
                    action, limit, note = self._plan(probe, scheduled=probe.due(step))
                    if self.lockstep is not None:
                        action, limit = self.lockstep((action, limit))
                    if note:
                        report.notes.append(note)
                    if action == "skip":
                        report.skipped.append(probe.name)
                        self._skips[probe.name] = self._skips.get(probe.name, 0) + 1
                        self._starve(probe, step)
                        continue
                if not entered:  # only when a probe runs: a step whose probes are all skipped costs nothing
                    wrapper.enter_context(probe_mode(model))
                    entered = True
                spent += self._run_one(probe, model, step, limit, report)
        if entered and self.lockstep is not None:  # sharded: no rank keeps gathered weights
            from ..sharded import reshard

            reshard(model, *(m for p in self.probes for m in p.aux_models()))
        # The wrapper's own cost (mode bookkeeping, RNG capture) is probe time too.
        if entered:
            self._probe_seconds += max(self._clock() - run_start - spent, 0.0)
        if baseline:
            self.setup_seconds += self._clock() - run_start
            self._probe_seconds, self._spent = budgeted
            self._t0 = self._clock()
        report.values["probe_share"] = self.probe_share
        # Travels with the observation so the service can show the run's starved probes.
        for name in self.starved:
            report.values[f"probe_starved.{name}"] = float(self._skips.get(name, 0))
        if report.skipped:
            logger.debug("probes skipped at step %s: %s", step, "; ".join(report.notes))
        return report

    def _order(self, p: Probe) -> tuple[Any, ...]:
        return (p.name not in self.priority, -self._skips.get(p.name, 0), p.cost_rank, self._estimate(p) or 0.0)

    def _run_one(
        self, probe: Probe, model: Any, step: int, limit: int | None, report: ProbeReport
    ) -> float:
        start = self._clock()
        values: dict[str, float] | None = None
        try:
            values = probe.measure(model, step=step, max_examples=limit)
        except Exception as exc:
            if self.on_error == "raise":
                raise
            logger.exception("probe %s failed at step %s", probe.name, step)
            report.failed.append(probe.name)
            report.notes.append(f"{probe.name} failed: {exc!r}")
        seconds = self._clock() - start
        self._probe_seconds += seconds
        self._spent[probe.name] = self._spent.get(probe.name, 0.0) + seconds
        report.seconds[probe.name] = seconds
        report.values[f"probe_seconds.{probe.name}"] = seconds
        if values is not None:
            report.values.update(values)
            used = self._used_examples(probe, limit)
            report.examples[probe.name] = used
            self._last[probe.name] = (seconds, used, step)
            per_example = seconds / used
            previous = self._cost_per_example.get(probe.name)
            # A running average: one slow outlier (a GC pause, a busy core) should not starve a probe.
            self._cost_per_example[probe.name] = (
                per_example if previous is None else 0.5 * previous + 0.5 * per_example
            )
            self._skips[probe.name] = 0
            self.starved.pop(probe.name, None)
        return seconds

    def _starve(self, probe: Probe, step: int) -> None:
        """Tell the first time ``probe`` is skipped for budget since it last ran (WARNING the first
        time in the run, INFO after), with the
        arithmetic: its cost, the budget, and how often the budget lets it run."""
        if probe.name in self.starved:
            return
        full = self._estimate(probe) or 0.0
        last = self._last.get(probe.name)
        n = self._used_examples(probe, None)
        if last is not None and last[1] >= n:
            # its last reading was a full one: quote what it measured, not the running average
            full = last[0]
            cost = f"one measurement took {full:.2f} s (its reading at step {last[2]}, {n} examples)"
        elif last is not None:
            cost = (f"one full measurement ({n} examples) is estimated at ~{full:.2f} s, extrapolated from its last "
                    f"reading: {last[0]:.2f} s on {last[1]} examples at step {last[2]}")
        else:
            cost = f"one measurement is estimated at ~{full:.2f} s"
        assert self._t0 is not None
        steps = step - (self._first_step if self._first_step is not None else step)
        train_seconds = max(self._clock() - self._t0 - self._probe_seconds, 0.0)
        per_step = train_seconds / steps if steps > 0 else None
        if per_step:
            # In steady state one measurement per k steps takes the share full / (full + k x step time):
            # the budget holds from k = full (1 - budget) / (budget x step time).
            b = self.budget_share
            interval = max(math.ceil(full * (1.0 - b) / (b * per_step)), 1) if b < 1.0 else 1
            pace = f"at ~{per_step:.2f} s per training step it fits about once every {interval} steps"
        else:
            pace = "the training steps so far leave no room for it"
        message = (
            f"probe {probe.name} skipped for budget at step {step}: {cost} and "
            f"probes may use {100 * self.budget_share:.0f}% of wall time (budget_share); {pace} "
            f"(every={probe.every} asked). Controllers fed by it get no new reading until then: give it fewer "
            f"examples, raise budget_share, or probe less often."
        )
        self.starved[probe.name] = message
        # Loud once per probe per run; later starvations (a probe every step alternating between a
        # reading and a skip) are INFO: a warning every other step would bury the one that matters.
        level = logging.INFO if probe.name in self._warned else logging.WARNING
        self._warned.add(probe.name)
        logger.log(level, "actuator: %s", message)

    @staticmethod
    def _used_examples(probe: Probe, limit: int | None) -> int:
        n = probe.num_examples
        if n is None:
            return 1
        return max(min(n, limit) if limit is not None else n, 1)

    def _estimate(self, probe: Probe) -> float | None:
        cost = self._cost_per_example.get(probe.name)
        if cost is None:
            return None
        return cost * self._used_examples(probe, None)

    def _weight(self, probe: Probe) -> float | None:
        """This probe's part of the budget: its demand over all scheduled probes' demand (a
        ``priority`` probe's: over the priority probes' demand)."""
        demand: dict[str, float] = {}
        for p in self.probes:
            cost = self._cost_per_example.get(p.name)
            if cost is not None and p.every and (probe.name not in self.priority or p.name in self.priority):
                demand[p.name] = cost * self._used_examples(p, None) / p.every
        total = sum(demand.values())
        if probe.name not in demand or total <= 0:
            return None
        return demand[probe.name] / total

    def _allowed(self, probe: Probe, *, scheduled: bool) -> float:
        """Seconds this probe may spend now without breaking its part or the whole budget."""
        assert self._t0 is not None
        wall = self._clock() - self._t0
        budget = self.budget_share
        allowed = (budget * wall - self._probe_seconds) / (1.0 - budget)
        weight = self._weight(probe) if scheduled else None
        if weight is not None:
            part = budget * weight
            allowed = min(allowed, (part * wall - self._spent.get(probe.name, 0.0)) / (1.0 - part))
        return allowed

    def _plan(self, probe: Probe, *, scheduled: bool) -> tuple[str, int | None, str | None]:
        """("run", None | max_examples, note) or ("skip", None, reason)."""
        cost = self._cost_per_example.get(probe.name)
        if cost is None or self.budget_share >= 1.0:
            return "run", None, None
        allowed = self._allowed(probe, scheduled=scheduled)
        n = probe.num_examples
        full = cost * (n if n is not None else 1)
        if full <= allowed:
            return "run", None, None
        share = f"{100 * self.probe_share:.1f}% of wall time so far, budget {100 * self.budget_share:.0f}%"
        if n is not None and n > 1 and allowed > 0 and probe.name not in self.whole:
            k = min(int(math.floor(allowed / cost)), n - 1)
            if k >= max(probe.min_examples, 1):
                return "run", k, f"{probe.name} subsampled to {k} of {n} examples for budget ({share})"
        whole = (" (whole or not at all: a guardrail or a relative setpoint compares it with a whole reading)"
                 if probe.name in self.whole else "")
        return (
            "skip",
            None,
            f"{probe.name} skipped for budget{whole}: needs ~{full:.2f}s, "
            f"{max(allowed, 0.0):.2f}s available ({share})",
        )
