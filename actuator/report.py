"""Run reports: the series of probes, setpoints, thresholds and knob values over steps, with
decisions marked — as JSON, a PNG (matplotlib) and a self-contained HTML page.

A report is bounded whatever the run's length: the caller passes observations already
downsampled (``sampling`` says how), and only the latest decisions and events (the number left
out is reported). Rendering is bounded too: at most ``max_panels`` panels, decision marks drawn
as one collection per panel, one render at a time per process (a matplotlib figure of a long run
is tens of MB).

Whatever ingest accepts is drawable: text from users (the run's name) is drawn as written, never
read as mathtext (``$...$``), and values are drawn within +-``PLOT_LIMIT`` (a finite value such
as 1e308 gives an axis span that overflows to infinity), the legend saying which series were cut.
"""

from __future__ import annotations

import base64
import html
import io
import threading
from typing import Any
from ._exceptions import ActuatorError

__all__ = ["build_report", "render_png", "render_html", "RendererBusy", "PLOT_LIMIT"]

# One figure at a time per process; a request that waits longer than this is told to retry.
_RENDER = threading.BoundedSemaphore(1)
RENDER_WAIT_SECONDS = 10.0


class RendererBusy(ActuatorError, RuntimeError):
    """Another report is being drawn in this process; retry shortly."""


# Values are drawn within +-PLOT_LIMIT: matplotlib's transforms invert a matrix whose entries
# are 1/span, so an axis span near the float range (+-1e308: infinite) cannot be drawn at all.
PLOT_LIMIT = 1e100


def _drawable(values: list[float]) -> tuple[list[float], bool]:
    """``values`` within +-PLOT_LIMIT, and whether any was cut."""
    drawn = [min(PLOT_LIMIT, max(-PLOT_LIMIT, v)) for v in values]
    return drawn, drawn != values


def _cut(label: str, cut: bool) -> str:
    return f"{label} (cut to ±{PLOT_LIMIT:.0e})" if cut else label

def build_report(run: Any, observations: list[Any], decisions: list[Any], events: list[Any],
                 policy: Any, *, sampling: dict[str, Any] | None = None, decisions_total: int | None = None,
                 events_total: int | None = None) -> dict[str, Any]:
    """The report's data (what :class:`actuator.schemas.ReportPublic` describes: decisions as
    :class:`~actuator.schemas.DecisionListed`, events as stored). ``sampling``: how ``observations`` were picked (``{"observations": n,
    "every": k}``); ``decisions_total``/``events_total``: how many the run has, when only the
    latest were passed (the rest are counted as omitted)."""
    probes: dict[str, list[list[float]]] = {}
    knobs: dict[str, list[list[float]]] = {}
    metrics: dict[str, list[list[float]]] = {}
    for o in sorted(observations, key=lambda o: (o.step, o.seq)):
        for k, v in o.probes.items():
            probes.setdefault(k, []).append([o.step, v])
        for k, v in o.knobs.items():
            knobs.setdefault(k, []).append([o.step, v])
        for k, v in o.metrics.items():
            metrics.setdefault(k, []).append([o.step, v])
    from .policy import relative
    from .run_state import RunContext
    from .schemas import DecisionListed, EventRecord

    ctx = RunContext.from_json(run.knobs, run.controllers, run.guardrails)
    setpoints: dict[str, Any] = {}
    for c in policy.controllers:
        sp: Any = c.setpoint
        if isinstance(sp, str):
            st = ctx.controllers.get(c.name)
            sp = relative(sp, st.baseline) if st is not None and st.baseline is not None else None
        if sp is not None:
            setpoints[c.probe] = sp
    for st in ctx.controllers.values():
        if st.setpoint_override is not None and st.probe:
            setpoints[st.probe] = st.setpoint_override
    thresholds = {g.probe: g.threshold for g in ctx.guardrails.values() if g.threshold is not None}
    return {
        "run": {"id": run.id, "name": run.name, "state": run.state, "policy": f"{run.policy_name}@{run.policy_version}",
                "last_step": run.last_step},
        "probes": probes,
        "knobs": knobs,
        "metrics": metrics,
        "setpoints": setpoints,
        "thresholds": thresholds,
        "decisions": [DecisionListed.model_validate(d, from_attributes=True).model_dump() for d in decisions],
        "events": [EventRecord.model_validate(e, from_attributes=True).model_dump() for e in events],
        "sampling": sampling or {"observations": len(observations), "every": 1},
        "decisions_omitted": max(0, (decisions_total or 0) - len(decisions)),
        "events_omitted": max(0, (events_total or 0) - len(events)),
    }


def render_png(report: dict[str, Any], *, max_panels: int = 12) -> bytes:
    """The report as a PNG: one panel per probe (with setpoint and guardrail threshold), then one
    per knob (decisions marked), at most ``max_panels``. Raises :class:`RendererBusy` when
    another render holds this process's renderer for longer than ``RENDER_WAIT_SECONDS``."""
    if not _RENDER.acquire(timeout=RENDER_WAIT_SECONDS):
        raise RendererBusy("another report is being drawn; retry in a few seconds")
    try:
        return _draw(report, max_panels)
    finally:
        _RENDER.release()


def _draw(report: dict[str, Any], max_panels: int) -> bytes:
    # The object API, not pyplot: no global figure registry shared by the server's threads.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from .policy import setpoint_at

    panels = list(report["probes"]) + [f"knob:{k}" for k in report["knobs"]]
    shown, hidden = panels[:max_panels], len(panels) - max_panels
    n = max(1, len(shown))
    fig = Figure(figsize=(9, 2.4 * n))
    FigureCanvasAgg(fig)
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)
    for ax, panel in zip(axes[:, 0], shown):
        if panel.startswith("knob:"):
            name = panel[5:]
            pts = report["knobs"][name]
            values, cut = _drawable([p[1] for p in pts])
            ax.step([p[0] for p in pts], values, where="post", color="tab:green", label=_cut(name, cut))
            marks = [d["step"] for d in report["decisions"] if d["knob"] == name]
            if marks:  # one collection, not an artist per decision
                ax.vlines(marks, 0, 1, transform=ax.get_xaxis_transform(), color="tab:red", alpha=0.25, lw=1)
            if name in ("learning_rate", "kl_beta") and values and all(v > 0 for v in values):
                ax.set_yscale("log")
        else:
            pts = report["probes"][panel]
            steps = [p[0] for p in pts]
            values, cut = _drawable([p[1] for p in pts])
            ax.plot(steps, values, marker="." if len(pts) <= 200 else None, color="tab:blue", label=_cut(panel, cut))
            if panel in report["setpoints"] and steps:
                sp = report["setpoints"][panel]
                values, cut = _drawable([setpoint_at(sp, s) for s in steps])
                ax.plot(steps, values, ls="--", color="black", label=_cut("setpoint", cut))
            if panel in report["thresholds"]:
                [threshold], cut = _drawable([report["thresholds"][panel]])
                ax.axhline(threshold, ls=":", color="tab:red", label=_cut("guardrail", cut))
        ax.set_ylabel(panel.removeprefix("knob:"), fontsize=8, parse_math=False)
        for text in ax.legend(fontsize=7, loc="upper right").get_texts():
            text.set_parse_math(False)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    r = report["run"]
    decided = len(report["decisions"]) + report.get("decisions_omitted", 0)
    title = f"{r['name']} ({r['id'][:8]}) — {r['policy']} — {decided} decisions"
    sampling = report.get("sampling") or {}
    if sampling.get("every", 1) > 1:
        title += f" — every {sampling['every']}th of {sampling['observations']} observations"
    if hidden > 0:
        title += f" — {hidden} more series not drawn"
    fig.suptitle(title, fontsize=9, parse_math=False)  # the run's name is the user's text
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return buf.getvalue()


def render_html(report: dict[str, Any], *, max_panels: int = 12) -> str:
    png = base64.b64encode(render_png(report, max_panels=max_panels)).decode()
    omitted = report.get("decisions_omitted", 0)
    earlier = (f"<p>{omitted} earlier decisions are not listed (GET /v1/runs/{report['run']['id']}/decisions "
               "pages through all of them).</p>") if omitted else ""
    def applied(d: dict[str, Any]) -> str:
        if d.get("applied_step") is not None:
            return f"after step {d['applied_step']}: {d['applied_value']:.4g}"
        return html.escape(f"set aside: {d['skipped']}") if d.get("skipped") else "<b>not applied</b>"

    rows = "".join(
        f"<tr><td>{d['number']}</td><td>{d['step']}</td><td>{html.escape(d['knob'])}</td>"
        f"<td>{d['old_value']:.4g} → {d['new_value']:.4g}</td><td>{applied(d)}</td>"
        f"<td>{html.escape(d['reason'])}</td></tr>"
        for d in report["decisions"])
    r = report["run"]
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Actuator run {html.escape(r['name'])}</title>"
            "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;border-bottom:1px solid #ddd;"
            "font-size:13px;text-align:left}</style></head><body>"
            f"<h1>{html.escape(r['name'])}</h1><p>run {r['id']} · {html.escape(r['policy'])} · state {r['state']} · "
            f"last step {r['last_step']}</p><img alt='probes and knobs' src='data:image/png;base64,{png}'>"
            f"<h2>Decisions</h2>{earlier}<table><tr><th>#</th><th>step</th><th>knob</th><th>change</th><th>agent applied</th><th>why</th></tr>{rows}"
            "</table></body></html>")
