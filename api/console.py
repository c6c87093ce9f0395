"""The run console's pages: server-rendered HTML for a browser (runs, one run, policies).

A page holds no inline script or style (the console is served with a Content-Security-Policy
of ``script-src 'self'``): what moves is in ``api/static/``, which reads the same REST endpoints
and live event stream as any client, and sends operator actions to the same control endpoints,
with the token the user typed (kept in the tab's sessionStorage). Pages show only what those
reads show.

Token mode (ACTUATOR_ADMIN_TOKEN set): a browser sends no Authorization header when it navigates,
so a page asked for without a token is the locked page (401, no data); the console's script then
asks for the same page again with the tab's token and puts it in place (``console.js``).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
import html
from datetime import datetime, timezone
from typing import Any

import yaml

from actuator import __version__
from actuator.models import PolicyRow, RunRow
from actuator.schemas import FINAL_STATES

__all__ = ["CSP", "SECURITY_HEADERS", "Frame", "OPEN_FRAME", "runs_page", "runs_rows", "run_page", "policies_page",
           "policy_page", "not_found_page", "locked_page", "policy_yaml"]

# Everything from this origin only; no inline script, no inline style, no plugins, no framing.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}

_STATIC = "/ui/static"


@dataclass(frozen=True)
class Frame:
    """What every page's frame depends on: token mode (reads need a token) and whether /docs is served."""

    token_mode: bool = False
    docs: bool = True


OPEN_FRAME = Frame()


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _page(title: str, body: str, *, page: str, frame: Frame, scripts: tuple[str, ...] = (),
          styles: tuple[str, ...] = (), data: dict[str, str] | None = None) -> str:
    data = {**(data or {}), "auth": "token" if frame.token_mode else "open"}
    attrs = "".join(f' data-{k}="{_e(v)}"' for k, v in data.items())
    api = '<a href="/docs">API</a>' if frame.docs else ""
    links = "".join(f'<link rel="stylesheet" href="{_STATIC}/{s}">' for s in (*styles, "console.css"))
    js = "".join(f'<script src="{_STATIC}/{s}" defer></script>' for s in ("console.js", *scripts))
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)} · Actuator</title>"
            f'<link rel="icon" href="{_STATIC}/favicon.svg" type="image/svg+xml">{links}{js}</head>'
            f'<body data-page="{page}"{attrs}>'
            '<header><a class="brand" href="/ui">Actuator</a><nav><a href="/ui">Runs</a>'
            f'<a href="/ui/policies">Policies</a>{api}</nav>'
            '<form id="token-form" autocomplete="off"><label for="admin-token">token</label>'
            # No name: a submit before the script has taken the form over (a native GET) never puts
            # the token in a URL.
            '<input type="password" id="admin-token" autocomplete="off" spellcheck="false">'
            '<button type="submit">Use</button><button type="button" id="token-forget">Forget</button>'
            '<span id="token-state" role="status"></span></form></header>'
            '<p id="auth-message" class="err" role="alert" hidden></p>'
            f"<main>{body}</main>"
            f'<footer>actuator {_e(__version__)} · actions use the same REST endpoints and audit trail as the API'
            "</footer></body></html>")


def _age(then: datetime | None, now: datetime) -> str:
    if then is None:
        return "–"
    if then.tzinfo is None:  # SQLite keeps naive UTC
        then = then.replace(tzinfo=timezone.utc)
    s = max(0, int((now - then).total_seconds()))
    if s < 120:
        return f"{s} s ago"
    if s < 7200:
        return f"{s // 60} min ago"
    if s < 172800:
        return f"{s // 3600} h ago"
    return f"{s // 86400} d ago"


def _num(value: Any) -> str:
    return "–" if value is None else f"{value:.4g}" if isinstance(value, float) else _e(value)


def runs_rows(runs: list[RunRow], now: datetime, in_effect: dict[str, dict[str, float]],
              starved: dict[str, list[str]]) -> str:
    """The runs table's body (the runs page refreshes it in place); ``in_effect`` and ``starved``
    by run id (``Store.knobs_in_effect``, ``api.routers.runs.starved``)."""
    if not runs:
        return '<tr><td colspan="7" class="empty">no runs yet: register one (an ActuatorCallback does)</td></tr>'
    return "".join(
        f'<tr data-run="{_e(r.id)}"><td><a href="/ui/runs/{_e(r.id)}">{_e(r.name)}</a>'
        f'<div class="sub">{_e(r.id)}</div></td>'
        f'<td><span class="state state-{_e(r.state)}">{_e(r.state)}</span>'
        + (f'<div class="sub warn">starved: {_e(", ".join(starved[r.id]))}</div>' if starved.get(r.id) else "")
        + "</td>"
        f'<td class="num">{_num(r.last_step)}</td>'
        f'<td class="num" title="{_e(r.updated_at.isoformat() if r.updated_at else "")}">{_age(r.updated_at, now)}</td>'
        f'<td class="num">{r.decision_count}</td>'
        f'<td><a href="/ui/policies/{_e(r.policy_name)}">{_e(r.policy_name)}@{r.policy_version}</a></td>'
        f'<td>{_e(", ".join(f"{k}={_num(v)}" for k, v in in_effect.get(r.id, r.knobs_in_effect).items()) or "–")}</td>'
        "</tr>"
        for r in runs)


def runs_page(runs: list[RunRow], now: datetime, in_effect: dict[str, dict[str, float]],
              starved: dict[str, list[str]], *, offset: int, limit: int, frame: Frame = OPEN_FRAME) -> str:
    older = (f'<p><a href="/ui?offset={offset + limit}">older runs</a></p>' if len(runs) == limit else "")
    newer = (f'<p><a href="/ui?offset={max(0, offset - limit)}">newer runs</a></p>' if offset else "")
    body = ("<h1>Runs</h1>"
            '<table id="runs"><thead><tr><th>run</th><th>state</th><th>step</th>'
            '<th title="time of the last stored observation or operator action">updated</th><th>decisions</th>'
            f"<th>policy</th><th>knobs in effect</th></tr></thead><tbody>{runs_rows(runs, now, in_effect, starved)}</tbody>"
            "</table>"
            f"{newer}{older}")
    return _page("Runs", body, page="runs", frame=frame)


def _options(names: list[str], selected: str | None = None) -> str:
    return "".join(f'<option value="{_e(n)}"{" selected" if n == selected else ""}>{_e(n)}</option>' for n in names)


def run_page(run: RunRow, controllers: list[str], frame: Frame = OPEN_FRAME) -> str:
    knobs = sorted(run.knobs)
    # A halted or finished run never runs again: its page is a record, nothing live and no actions.
    final = run.state in FINAL_STATES
    body = (
        f'<h1>{_e(run.name)} <span id="run-state" class="state state-{_e(run.state)}">{_e(run.state)}</span></h1>'
        f'<p class="meta">run <code>{_e(run.id)}</code> · policy '
        f'<a id="run-policy" href="/ui/policies/{_e(run.policy_name)}">{_e(run.policy_name)}@{run.policy_version}</a>'
        f' · step <span id="run-step">{_num(run.last_step)}</span> · decisions '
        f'<span id="run-decisions">{run.decision_count}</span> · '
        f'<span id="stream-state">{"ended" if final else "connecting"}</span></p>'
        # Filled from the run's state: the probes its latest probe report says the budget skips.
        '<p id="starved" class="warn" role="status" hidden></p>'
        # Filled from the run's state: the policy's keep-best checkpoint, which step and why.
        '<p id="kept" role="status" hidden></p>'
        f'<section id="actions"{" hidden" if final else ""}><h2>Operator actions</h2>'
        '<p class="hint">Sent with the token above (the admin token) to the control endpoints (audited like any '
        'API call).</p>'
        '<div class="row"><button type="button" data-action="pause">Pause control</button>'
        '<button type="button" data-action="resume">Resume control</button>'
        '<button type="button" data-action="halt" class="danger">Halt run</button></div>'
        '<form id="override-form" class="row"><label>knob <select id="override-knob" name="knob">'
        f'{_options(knobs)}</select></label><label>value <input id="override-value" name="value" inputmode="decimal" '
        'required></label><button type="submit">Pin (override)</button>'
        '<button type="button" id="override-release">Release</button></form>'
        '<form id="setpoint-form" class="row"><label>controller <select id="setpoint-controller" name="controller">'
        f'{_options(controllers)}</select></label><label>setpoint <input id="setpoint-value" name="setpoint" '
        'inputmode="decimal" required></label><button type="submit">Set</button></form>'
        '<p id="action-status" role="status"></p></section>'
        '<section><h2>Controllers</h2><table id="controllers"><thead><tr><th>controller</th><th>probe</th>'
        '<th>raw</th><th>filtered</th><th>setpoint</th><th>knob</th><th>target</th><th>in effect</th>'
        '</tr></thead><tbody></tbody></table>'
        '<table id="guardrails"><thead><tr><th>guardrail</th><th>probe</th><th>value</th><th>threshold</th>'
        '<th title="readings past the threshold in a row (a reading back inside resets it)">past, in a row</th>'
        '<th title="times it fired: its guardrail_breach events">breaches</th><th>active</th></tr></thead>'
        '<tbody></tbody></table></section>'
        '<section><h2>Probes and knobs</h2><p class="hint">raw and filtered probe values against the setpoint '
        '(dashed), the setpoint in force on a controller\'s ramp (purple) and guardrail threshold (dotted); '
        'knobs in effect; red lines mark decisions; a purple line marks a rewind (a rollback guardrail fired) and the '
        'shaded band the stretch it undid, back to the last step at which every guardrail held.</p>'
        '<div id="charts"></div></section>'
        '<section><h2>Decisions</h2><table id="decisions"><thead><tr><th>#</th><th>step</th><th>knob</th>'
        '<th>change</th><th>reason</th><th>explain</th></tr></thead><tbody></tbody></table></section>'
        '<section><h2>Events</h2><p class="hint">guardrail breaches, overrides, setpoints, state changes</p>'
        '<table id="events"><thead><tr><th>#</th><th>step</th><th>kind</th><th>details</th></tr></thead>'
        '<tbody></tbody></table></section>')
    return _page(f"Run {run.name}", body, page="run", frame=frame, scripts=("vendor/uplot/uPlot.iife.min.js", "run.js"),
                 styles=("vendor/uplot/uPlot.min.css",), data={"run": run.id, "final-states": " ".join(FINAL_STATES)})


def policy_yaml(row: PolicyRow) -> str:
    return yaml.safe_dump(row.document, sort_keys=False, allow_unicode=True)


def policies_page(rows: list[PolicyRow], frame: Frame = OPEN_FRAME) -> str:
    latest: dict[str, PolicyRow] = {}
    for p in rows:  # by name, then version: the last one seen is the latest
        latest[p.name] = p
    table = "".join(
        f'<tr><td><a href="/ui/policies/{_e(p.name)}">{_e(p.name)}</a></td><td class="num">{p.version}</td>'
        f'<td>{"archived" if p.archived else ""}</td><td>{_e(p.created_at.isoformat() if p.created_at else "")}</td>'
        "</tr>" for p in latest.values()) or '<tr><td colspan="4" class="empty">no policies stored</td></tr>'
    body = ('<h1>Policies</h1><table id="policies"><thead><tr><th>name</th><th>latest version</th><th></th>'
            f"<th>created</th></tr></thead><tbody>{table}</tbody></table>"
            '<section id="validate"><h2>Validate a policy</h2>'
            '<p class="hint">Paste a policy document (YAML or JSON); it is checked by <code>POST '
            '/v1/policies/validate</code> and nothing is stored.</p>'
            '<form id="validate-form"><textarea id="validate-text" rows="14" spellcheck="false" '
            'placeholder="name: my-policy&#10;controllers: []"></textarea>'
            '<div class="row"><button type="submit">Validate</button></div></form>'
            '<div id="validate-result" role="status"></div></section>')
    return _page("Policies", body, page="policies", frame=frame, scripts=("vendor/js-yaml/js-yaml.min.js", "policies.js"))


def _diff(a: PolicyRow, b: PolicyRow) -> str:
    lines = difflib.unified_diff(policy_yaml(a).splitlines(), policy_yaml(b).splitlines(),
                                 f"{a.name}@{a.version}", f"{b.name}@{b.version}", lineterm="")
    out = []
    for line in lines:
        kind = ("add" if line.startswith("+") and not line.startswith("+++") else
                "del" if line.startswith("-") and not line.startswith("---") else
                "hunk" if line.startswith("@@") else "ctx")
        out.append(f'<span class="d-{kind}">{_e(line)}</span>')
    return "\n".join(out) or '<span class="d-ctx">(the two versions are identical)</span>'


def policy_page(row: PolicyRow, latest: int, diff: tuple[PolicyRow, PolicyRow] | None,
                frame: Frame = OPEN_FRAME) -> str:
    versions = "".join(
        f'<li><a href="/ui/policies/{_e(row.name)}?version={v}"{" aria-current=page" if v == row.version else ""}>'
        f"v{v}</a></li>" for v in range(latest, 0, -1))
    numbers = [str(v) for v in range(latest, 0, -1)]
    a_default, b_default = (diff[0].version, diff[1].version) if diff else (max(1, latest - 1), latest)
    diff_html = ""
    if diff is not None:
        a, b = diff
        diff_html = f'<h2>Diff v{a.version} → v{b.version}</h2><pre id="policy-diff" class="diff">{_diff(a, b)}</pre>'
    body = (f'<h1>Policy {_e(row.name)}</h1><p class="meta">version {row.version} of {latest}'
            f'{" · archived" if row.archived else ""}</p>'
            f'<h2>Versions</h2><ul class="versions">{versions}</ul>'
            f'<form id="diff-form" method="get" action="/ui/policies/{_e(row.name)}" class="row">'
            f'<label>diff <select name="a">{_options(numbers, str(a_default))}</select></label>'
            f'<label>against <select name="b">{_options(numbers, str(b_default))}</select></label>'
            '<button type="submit">Show diff</button></form>'
            f"{diff_html}<h2>Document (v{row.version})</h2>"
            f'<pre id="policy-document">{_e(policy_yaml(row))}</pre>')
    return _page(f"Policy {row.name}", body, page="policy", frame=frame)


def not_found_page(message: str, frame: Frame = OPEN_FRAME) -> str:
    return _page("Not found", f'<h1>Not found</h1><p id="not-found">{_e(message)}</p>', page="not-found",
                 frame=frame)


def locked_page(status: int, message: str, frame: Frame) -> str:
    """Token mode, a page asked for without a token that may read it: no data, the reason, and what
    to do. ``console.js`` asks for the page again with the tab's token when it has one."""
    body = ('<section id="locked"><h1>Token needed</h1>'
            f'<p id="locked-message" data-status="{status}">{_e(message)} ({status})</p>'
            '<p class="hint">This service keeps its runs and policies behind a token. Type a viewer token or the '
            "admin token above (a run's own token opens that run's page only): this tab keeps it "
            "(sessionStorage, never a cookie or a URL) and sends it with every request.</p></section>")
    return _page("Token needed", body, page="locked", frame=frame)
