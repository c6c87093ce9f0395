"""The ``actuator`` command: run the service, look at runs and decisions, validate policies."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ._exceptions import ClientError, PolicyError

if TYPE_CHECKING:
    from .client import ActuatorClient
    from .config import Settings
    from .schemas import RunPublic

app = typer.Typer(help="Actuator: closed-loop control of LLM post-training.", no_args_is_help=True,
                  add_completion=False)
policy_app = typer.Typer(help="Policy documents.", no_args_is_help=True)
app.add_typer(policy_app, name="policy")
bench_app = typer.Typer(help="Benchmarks: scripts in the source repository's benchmarks/ folder, which the package "
                             "does not install (run them inside a clone).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

# The scripts of benchmarks/control/ that declare a SCENARIO (tests/actuator/test_cli.py checks the two agree).
SCENARIOS = ("plants", "sft-drift", "forgetting", "dpo-kl", "rl-kl", "rl-entropy", "rewind", "draft-distill", "compress-rank")
# Markup off: what is printed (YAML errors, reasons, run names) is shown as it is; rich markup would
# read "[a, b: c]" in a YAML error as a tag and drop it. Styles go through Text instead.
console = Console(markup=False)
err_console = Console(stderr=True, markup=False)  # errors go to stderr, so `actuator runs > runs.txt` keeps them visible

UrlOpt = Annotated[str, typer.Option("--url", envvar="ACTUATOR_URL", help="Controller service URL.")]
TokenOpt = Annotated[Optional[str], typer.Option(
    "--token", envvar="ACTUATOR_TOKEN",
    help="Bearer token: the admin token to change things; to read, when the service has an admin token, a viewer "
         "token (ACTUATOR_VIEWER_TOKEN of the service), the admin token or a run's own token (that run only).")]
DEFAULT_URL = "http://127.0.0.1:8000"


def _labelled(label: str, style: str, text: str) -> Text:
    """``label text`` with the label styled and the text as it is."""
    return Text.assemble((label, style), " ", text)


def _fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``error: message`` on stderr, never re-wrapped; return the Exit to raise."""
    err_console.print(_labelled("error:", "red", message), soft_wrap=True)
    return typer.Exit(code)


def _warn(message: str, style: str = "yellow") -> None:
    err_console.print(_labelled("warning:", style, message), soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        from . import __version__

        console.print(f"actuator {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.")] = False) -> None:
    """Actuator: closed-loop control of LLM post-training."""


@app.command()
def serve(
    host: Annotated[str, typer.Option(envvar="ACTUATOR_HOST")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="ACTUATOR_PORT")] = 8000,
    database_url: Annotated[Optional[str], typer.Option(help="SQLAlchemy URL (default: SQLite file).")] = None,
    redis_url: Annotated[Optional[str], typer.Option(help="Redis URL (default: in-process).")] = None,
    workers: Annotated[int, typer.Option(min=1, help="uvicorn worker processes.")] = 1,
    log_level: str = "info",
    header_timeout: Annotated[float, typer.Option(
        min=0.1, envvar="ACTUATOR_HEADER_TIMEOUT",
        help="Seconds a client has to send a request's headers; then the connection is closed "
             "(slowloris).")] = 10.0,
    body_timeout: Annotated[Optional[float], typer.Option(
        min=0.1, help="Seconds a client has to send a request's body after its headers; then 408 and the "
             "connection is closed (ACTUATOR_BODY_TIMEOUT, default 30).")] = None,
    max_connections: Annotated[Optional[int], typer.Option(
        min=2, help="Connections each worker serves at once; past it 503 (ACTUATOR_MAX_CONNECTIONS; default: "
             "three quarters of the open-file limit, at most 4096).")] = None,
) -> None:
    """Run the controller service (migrations are applied on start)."""
    try:
        import uvicorn

        from actuator.api.protocol import protocol_class
    except ImportError as exc:  # the core install (a training node) has no server
        raise _fail(f"`actuator serve` needs the server extra: pip install 'actuator[server]' ({exc})") from exc

    if database_url:
        os.environ["ACTUATOR_DATABASE_URL"] = database_url
    if redis_url:
        os.environ["ACTUATOR_REDIS_URL"] = redis_url
    if body_timeout is not None:
        os.environ["ACTUATOR_BODY_TIMEOUT"] = str(body_timeout)
    if max_connections is not None:
        os.environ["ACTUATOR_MAX_CONNECTIONS"] = str(max_connections)
    # The app reads where it listens from its settings (the Host names it answers to).
    os.environ["ACTUATOR_HOST"], os.environ["ACTUATOR_PORT"] = host, str(port)
    from pydantic import ValidationError

    from .config import Settings

    try:
        settings = Settings()
    except ValidationError as exc:
        raise _fail(f"invalid settings: {exc}") from exc
    _check_serve(settings, workers)
    if workers > 1:
        # Several processes: prometheus_client's multiprocess mode merges their metrics files.
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            import tempfile

            os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="actuator-metrics-")
        # Run migrations once here so workers do not race (they also hold an advisory lock).
        from .migrate import upgrade

        upgrade(settings.database_url)
        os.environ["ACTUATOR_MIGRATE_ON_START"] = "false"
    # A live stream (a console tab, a dashboard) ends only at its max_seconds: on SIGTERM, give
    # requests 5 s to finish, then close what is still open and shut down as usual.
    uvicorn.run("actuator.api.app:create_app", factory=True, host=host, port=port, workers=workers,
                log_level=log_level, http=protocol_class(header_timeout), timeout_graceful_shutdown=5,
                limit_concurrency=settings.max_connections or _default_connections())


def _default_connections() -> int:
    """Three quarters of the open-file limit (the rest for the store, Redis, logs), at most 4096:
    past it a worker answers 503 instead of failing to accept ("Too many open files")."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(2, min(4096, soft * 3 // 4)) if soft != resource.RLIM_INFINITY else 4096


def _check_serve(settings: Settings, workers: int) -> None:
    """Refuse a start that would fail requests; warn about one that leaves control open."""
    from .config import is_loopback

    if workers > 1 and settings.database_url.startswith("sqlite"):
        raise _fail(f"--workers {workers} needs Postgres: SQLite locks a run only inside one process, so two "
                    "workers would write one run at once and ingests would fail. Run one worker, or use Postgres "
                    "and Redis for several (ACTUATOR_DATABASE_URL=postgresql://..., ACTUATOR_REDIS_URL=redis://...).")
    if workers > 1 and settings.redis_url is None:
        _warn(f"--workers {workers} without Redis (ACTUATOR_REDIS_URL): a run's live stream (/stream, the "
              "console) shows only the events of the worker it is connected to.")
    if settings.admin_token is None and not is_loopback(settings.host):
        _warn(f"listening on {settings.host} with no admin token (ACTUATOR_ADMIN_TOKEN): anyone who can reach "
              f"port {settings.port} can register runs, create and archive policies, pause, override, move and "
              "halt any run, and read every run. Set ACTUATOR_ADMIN_TOKEN, or listen on 127.0.0.1.", "bold yellow")
    if settings.token_mode:
        viewers = len(settings.viewer_token)
        opened = [path for path, is_open in (("/metrics", settings.metrics_open), ("/healthz", settings.health_open),
                                             ("/docs", settings.docs_open)) if is_open]
        err_console.print(
            f"token mode: reads need a token: {viewers} viewer token{'' if viewers == 1 else 's'} "
            "(ACTUATOR_VIEWER_TOKEN), the admin token, or a run's own token for that run; "
            + (f"open without one: {', '.join(opened)}" if opened else "/metrics, /healthz and /docs too"),
            soft_wrap=True)


def _refused(url: str, exc: ClientError) -> typer.Exit:
    """A failed request, and what to do about a refused token."""
    from ._exceptions import Forbidden, Unauthorized

    hint = ""
    if isinstance(exc, Unauthorized):
        hint = (". The service keeps reads behind a token: pass --token (or set ACTUATOR_TOKEN) with a viewer "
                "token or the admin token")
    elif isinstance(exc, Forbidden):
        hint = ". This token does not grant it (a run's token reads only its own run; changes need the admin token)"
    return _fail(f"{url}: {exc}{hint}")


def _client(url: str, token: str | None) -> ActuatorClient:
    from .client import ActuatorClient

    return ActuatorClient(url, token=token)


@app.command()
def runs(url: UrlOpt = DEFAULT_URL, token: TokenOpt = None,
         state: Annotated[Optional[str], typer.Option(help="running|paused|halted|finished")] = None,
         limit: int = 50,
         wide: Annotated[bool, typer.Option("--wide", help="One line a run, nothing wrapped or shortened.")] = False,
         output: Annotated[str, typer.Option("--output", "-o", help="table, or json (every field, in full).")] = "table",
         ) -> None:
    """List runs, with the knob values in effect (observed, or acknowledged applied by the agent)."""
    if output not in ("table", "json"):
        raise _fail(f"--output: {output!r} is not table or json", 2)
    try:
        with _client(url, token) as c:
            items = c.list_runs(state=state, limit=limit)
    except ClientError as exc:
        raise _refused(url, exc) from exc
    if output == "json":
        typer.echo(json.dumps([r.model_dump(mode="json") for r in items], indent=2))
        return
    if wide:
        table = Table(box=box.SIMPLE_HEAD)
        for column in ("id", "name", "state", "policy", "step", "knobs in effect"):
            table.add_column(column, no_wrap=True, justify="right" if column == "step" else "left")
        for r in items:
            table.add_row(r.id, r.name, _state(r), f"{r.policy_name}@{r.policy_version}", _step(r),
                          "  ".join(f"{k} {v:.4g}" for k, v in _in_effect(r).items()))
    else:
        table = _runs_table(items, console.width)
    (Console(markup=False, width=100_000) if wide else console).print(table)
    # A probe the budget starves feeds no controller: said in full below the table.
    for r in items:
        if r.kept is not None:  # the policy's rewind.keep_best
            console.print(f"{r.id}: {r.kept.why()}", soft_wrap=True, markup=False)
        if r.starved:
            console.print(_labelled("*", "yellow", f"{r.id}: starved probes (skipped for the probe-time budget in "
                                                   f"the latest probe report): {', '.join(r.starved)}"),
                          soft_wrap=True)


def _state(r: RunPublic) -> str:
    return r.state + ("*" if r.starved else "")


def _step(r: RunPublic) -> str:
    return str(r.last_step if r.last_step is not None else "-")


def _runs_table(items: list[RunPublic], width: int) -> Table:
    """The runs table within ``width`` columns. Whole ids, states and steps, however narrow the
    terminal (the ids are what every other command takes); name and policy share a column, one
    above the other, shortened with an ellipsis only when the terminal leaves them too little; the
    knobs in effect one a line, wrapped between whole words (a knob's name, its value), never inside one."""
    gap = 2
    knobs = [[f"{k} {v:.4g}" for k, v in _in_effect(r).items()] for r in items]
    cells = {"id": [r.id for r in items], "state": [_state(r) for r in items], "step": [_step(r) for r in items]}
    widths = {name: max([len(name), *map(len, values)]) for name, values in cells.items()}
    words = max((len(w) for lines in knobs for line in lines for w in line.split()), default=5)
    lines = max((len(line) for rows in knobs for line in rows), default=5)
    names = max([len("name/policy"), *(max(len(r.name), len(f"{r.policy_name}@{r.policy_version}")) for r in items)])
    room = width - sum(widths.values()) - gap * 4
    knob_w = max(words, min(lines, room - min(names, room - words)))  # a knob on one line when the names leave room
    name_w = max(8, min(names, room - knob_w))
    table = Table(box=None, padding=(0, gap, 0, 0), pad_edge=False, show_edge=False)
    table.add_column("id", no_wrap=True, width=widths["id"])
    table.add_column("name/policy", no_wrap=True, overflow="ellipsis", width=name_w)
    table.add_column("state", no_wrap=True, width=widths["state"])
    table.add_column("step", no_wrap=True, justify="right", width=widths["step"])
    table.add_column("knobs in effect", width=knob_w)
    for r, rows in zip(items, knobs):
        table.add_row(r.id, f"{r.name}\n{r.policy_name}@{r.policy_version}", _state(r), _step(r), "\n".join(rows))
    return table


def _in_effect(r: RunPublic) -> dict[str, float]:
    """The knob values in effect the service computed (a service that predates the field: the
    values last ordered, which is what it showed)."""
    return r.knobs_in_effect or {k: v.value for k, v in r.knobs.items()}


def _run_lines(runs: list[RunPublic]) -> str:
    return "".join(f"\n  {r.id}  {r.name}  {r.state}  created {r.created_at:%Y-%m-%d %H:%M:%S}" for r in runs)


def _resolve_run(c: ActuatorClient, ref: str) -> str:
    """The id of the run ``ref`` names (its id, a unique start of it, or its name); an unknown or
    ambiguous reference fails with the candidates."""
    runs = c.find_runs(ref)
    if len(runs) == 1:
        return runs[0].id
    if runs:
        raise _fail(f"{ref!r} names {len(runs)}{'+' if len(runs) > c.FIND_MOST else ''} runs; give more of "
                    f"the id:{_run_lines(runs[:c.FIND_MOST])}")
    latest = c.list_runs(limit=10)
    raise _fail(f"run {ref!r} not found (404): it is no run's id, the start of one, or a run's name. "
                + (f"Latest runs:{_run_lines(latest)}" if latest else "The service has no runs."))


def _agent_said(d: Any) -> str:
    """What the agent acknowledged doing with a decision, in words."""
    if d.applied_step is not None:
        clipped = "" if d.applied_value == d.new_value else f" (ordered {d.new_value:.6g}; the agent's own limits)"
        return f"applied after step {d.applied_step}: {d.knob} = {d.applied_value:.6g}{clipped}"
    if d.skipped is not None:
        return f"set aside ({d.skipped})"
    return ("NOT applied: no acknowledgement from the agent (ordered after the run's last step, "
            "or the agent has not reported it yet)")


@app.command()
def decisions(run: Annotated[str, typer.Argument(help="Run id, the start of it, or the run's name.")],
              url: UrlOpt = DEFAULT_URL,
              token: TokenOpt = None,
              explain: Annotated[bool, typer.Option("--explain", help="Show inputs and P/I/D.")] = False,
              limit: int = 1000) -> None:
    """List a run's decisions (the audit trail)."""
    try:
        with _client(url, token) as c:
            page = c.list_decisions(_resolve_run(c, run), limit=limit)
    except ClientError as exc:
        raise _refused(url, exc) from exc
    if explain:
        for d in page.items:
            console.rule(f"decision {d.number} · step {d.step} · {d.knob}")
            console.print(f"  {d.knob}: {d.old_value:.6g} → {d.new_value:.6g}   (policy v{d.policy_version}, "
                          f"controller {d.controller or 'guardrail'})")
            console.print(f"  why: {d.reason}", soft_wrap=True)  # whole, as stored: it is grepped and quoted
            console.print(f"  agent: {_agent_said(d)}", soft_wrap=True)
            inp = d.inputs
            if "probe" in inp:
                console.print(f"  input: {inp['probe']} raw {inp['raw']:.6g}, filtered {inp['filtered']:.6g}, "
                              f"setpoint {inp['setpoint']:.6g}, dt {inp.get('dt')}")
                if inp.get("setpoint_in_force") is not None or inp.get("projected") is not None:
                    # what the law compared: the projected reading against the setpoint on its ramp
                    law = [f"{name} {inp[key]:.6g}" for key, name in (("projected", "projected reading"),
                                                                      ("setpoint_in_force", "setpoint in force (ramp)"))
                           if inp.get(key) is not None]
                    console.print(f"  the law acted on: {', '.join(law)}")
                console.print(f"  limits: bounds {inp.get('bounds')}, max step {inp.get('max_step')} "
                              f"({inp.get('scale')}), limited by: {', '.join(inp.get('limited_by') or []) or 'nothing'}")
            comp = {k: (v if v is not None else float("nan")) for k, v in d.components.items()}
            # The law's terms as they stand after this decision (its reason gives this decision's
            # moves of them: ΔP, ΔI, ΔD).
            if {"p", "i", "d", "error"} <= comp.keys():
                console.print("  levels after this decision: P {p:+.4g}  I {i:+.4g}  D {d:+.4g}  "
                              "error {error:+.4g}".format(**comp))
            elif comp:
                console.print("  law after this decision: " + "  ".join(f"{k} {v:+.4g}" for k, v in comp.items()))
        console.print(f"{page.total} decisions")
        return
    table = Table("#", "step", "knob", "old", "new", "applied", "reason")
    for d in page.items:
        applied = (f"step {d.applied_step}" if d.applied_step is not None else
                   "skipped" if d.skipped is not None else "no")
        table.add_row(str(d.number), str(d.step), d.knob, f"{d.old_value:.4g}", f"{d.new_value:.4g}", applied,
                      d.reason)
    console.print(table)
    console.print(f"{page.total} decisions")


PRESET = "preset:"


def _preset_file(ref: str) -> Path:
    """The shipped file of ``preset:NAME``."""
    from .policy import _PRESETS, list_presets

    name = ref.removeprefix(PRESET)
    if name not in list_presets():
        raise _fail(f"no preset {name!r}; presets: {', '.join(list_presets())}")
    return _PRESETS / f"{name}.yaml"


@policy_app.command("validate")
def policy_validate(source: Annotated[str, typer.Argument(
        metavar="PATH|preset:NAME", help="A policy file (YAML or JSON), or a shipped preset.")]) -> None:
    """Validate a policy file or a preset locally; print every error with its path."""
    from .policy import load_policy

    path = _preset_file(source) if source.startswith(PRESET) else Path(source)
    if not path.is_file():
        raise _fail(f"no policy file {source!r}", 2)
    try:
        doc = load_policy(path)
    except PolicyError as exc:
        for e in exc.errors or [{"loc": "(document)", "msg": str(exc)}]:
            err_console.print(Text.assemble((e["loc"], "red"), ": ", e["msg"]), soft_wrap=True)
        raise typer.Exit(1) from exc
    console.print(_labelled("valid:", "green", f"{doc.name} ({len(doc.controllers)} controllers, "
                                               f"{len(doc.guardrails)} guardrails)"))
    for c in doc.controllers:  # relative (and auto's fallback) gains in both forms: as stated and per probe unit
        if c.gains in ("relative", "auto"):  # a kind without gains reads as absolute
            what = "relative gains" if c.gains == "relative" else "auto gains, fallback (relative)"
            console.print(f"  {c.name}: {what} {c.gains_text()}", soft_wrap=True, highlight=False)


@policy_app.command("show")
def policy_show(ref: Annotated[str, typer.Argument(
        metavar="preset:NAME|NAME[@VERSION]",
        help="A shipped preset, or a policy stored in the service (latest version unless @VERSION).")],
                url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Print a policy as YAML: a preset's file as shipped (comments included: copy it, edit it, pass
    its path), or a stored policy's document."""
    if ref.startswith(PRESET):
        typer.echo(_preset_file(ref).read_text(), nl=False)
        return
    import yaml

    name, _, version = ref.partition("@")
    if version and not version.isdigit():
        raise _fail(f"bad version in {ref!r}; use NAME@3", 2)
    try:
        with _client(url, token) as c:
            policy = c.get_policy(name, int(version) if version else None)
    except ClientError as exc:
        raise _refused(url, exc) from exc
    typer.echo(yaml.safe_dump(policy["document"], sort_keys=False, allow_unicode=True), nl=False)


@policy_app.command("schema")
def policy_schema() -> None:
    """Print the policy JSON Schema."""
    from .policy import PolicyDocument

    console.print_json(json.dumps(PolicyDocument.model_json_schema()))


def _checkout() -> Path | None:
    """The source checkout holding benchmarks/control/: the working directory or one of its parents,
    else the checkout an editable install points at (the folder above this package)."""
    here = Path(__file__).resolve().parent.parent
    for folder in (Path.cwd(), *Path.cwd().parents, here):
        if (folder / "benchmarks" / "control").is_dir():
            return folder
    return None


def _fmt_steps(v: object) -> str:
    return "not within the horizon" if v is None else f"{v} steps"


@policy_app.command("tune")
def policy_tune(
    run: Annotated[str, typer.Option("--run", help="The recorded run (or identification pre-run) to fit: its id, "
                                                  "the start of it, or its name.")],
    controller: Annotated[str, typer.Option("--controller", help="The setpoint controller to tune, by name.")],
    aggressiveness: Annotated[float, typer.Option(
        help="tau_c = effective dead time / X (0 < X <= 10): 1 is SIMC's choice, 2 twice as fast, 0.5 twice "
             "as slow.")] = 1.0,
    policy: Annotated[Optional[str], typer.Option(
        help="A stored policy (name or name@version) holding the controller; default: the run's.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", dir_okay=False,
                                                   help="Also write the proposed policy YAML here.")] = None,
    url: UrlOpt = DEFAULT_URL, token: TokenOpt = None,
) -> None:
    """Identify the plant from a run, propose SIMC gains, predict the response by replay, print the policy."""
    try:
        with _client(url, token) as c:
            r = c.tune_policy(_resolve_run(c, run), controller, aggressiveness=aggressiveness, policy=policy)
    except ClientError as exc:
        raise _fail(str(exc)) from exc
    m, g, pred = r["model"], r["gains"], r["predicted"]
    unit = "ln(" + r["knob"] + ")" if r["scale"] == "log" else r["knob"]
    console.rule(f"{r['controller']}: {r['probe']} vs {r['knob']} ({r['scale']} scale), run {r['run_id']}")
    if m["kind"] == "fopdt":
        console.print(f"model: FOPDT  gain {m['gain']:.4g} {r['probe']} per {unit}, time constant {m['tau']:.3g} "
                      f"steps, dead time {m['theta']:.3g} steps (up to {m['theta_hi']:.3g})"
                      + (f", drifting {m['drift']:.4g} per step on its own" if m.get("drift") else ""))
    else:
        console.print(f"model: integrating  rate {m['gain']:.4g} {r['probe']} per {unit} per step, dead time "
                      f"{m['theta']:.3g} steps (up to {m['theta_hi']:.3g})")
    console.print(f"fit: R² {m['r2']:.3f}, NRMSE {m['nrmse']:.3f}, {m['observations']} observations over "
                  f"{m['steps']} steps (of {r['observations_total']}), knob moved {m['knob_move']:.3g}")
    cur = r["current_gains"]
    console.print(f"gains: kp {g['kp']:.4g}  ki {g['ki']:.4g}  kd {g['kd']:.4g}  direction {g['direction']}  "
                  f"setpoint weight {g['setpoint_weight']:g}   (current: kp {cur['kp']:.4g}  ki {cur['ki']:.4g}  "
                  f"kd {cur['kd']:.4g})")
    console.print(f"rule: {g['rule']}; tau_c {g['tau_c']:.3g}, effective dead time {g['theta_eff']:.3g} "
                  f"(bound {g['theta_hi_eff']:.3g}), "
                  f"tau_I {g['tau_i']:.3g}, tau_D {g['tau_d']:.3g} steps, dt {r['interval']} steps")
    table = Table("predicted (replay on the model)", "settling (±10%)", "overshoot", "decisions")
    for name in ("proposed", "current"):
        p = pred[name]
        over = "-" if p["overshoot_pct"] is None else f"{p['overshoot_pct']:.1f}%"
        mark = " (OUTSIDE limits)" if name == "proposed" and r.get("outside_limits") else ""
        table.add_row(f"{name} gains{mark}", _fmt_steps(p["settling_steps"]), over, str(p["decisions"]))
    console.print(table)
    console.print(f"horizon {pred['horizon']} steps")
    for w in r["warnings"]:
        _warn(w)
    # a service that predates the marking sends no outside_limits
    for miss in r.get("outside_limits") or []:
        err_console.print(_labelled("OUTSIDE tune's limits:", "bold red", miss), soft_wrap=True)
    console.rule("policy")
    console.print(r["policy_yaml"], highlight=False)
    if output is not None:
        output.write_text(r["policy_yaml"])
        console.print(f"wrote {output}")


@bench_app.command("control")
def bench_control(
    scenario: Annotated[str, typer.Argument(help=f"one of {', '.join(SCENARIOS)}, or 'all'")] = "all",
    quick: Annotated[bool, typer.Option("--quick", help="short runs")] = False,
    steps: Annotated[Optional[int], typer.Option(help="training steps per arm")] = None,
    seeds: Annotated[Optional[list[int]], typer.Option(help="seeds (repeatable)")] = None,
) -> None:
    """Control-quality benchmarks: simulated plants (seconds) and the real-model scenarios.
    Each writes benchmarks/results/<scenario>.json and .png and prints a comparison table."""
    import subprocess
    import sys

    root = _checkout()
    if root is None:
        raise _fail(
            "the benchmarks are scripts in the repository's benchmarks/ folder, which installing the actuator "
            "package does not bring. Run this command inside a clone of the Actuator source repository "
            f"(searched {Path.cwd()} and its parents, and beside the installed package at "
            f"{Path(__file__).resolve().parent}), or there: python -m benchmarks.control.<scenario>", 2)
    names = SCENARIOS if scenario == "all" else (scenario,)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise _fail(f"unknown scenario {unknown[0]!r}; choose from {', '.join(SCENARIOS)}", 2)
    for name in names:
        module = root / "benchmarks" / "control" / f"{name.replace('-', '_')}.py"
        if not module.exists():
            err_console.print(Text(f"{name}: not available in this checkout ({module.name} missing)", style="yellow"))
            continue
        args = [sys.executable, "-m", f"benchmarks.control.{name.replace('-', '_')}"]
        if quick:
            args.append("--quick")
        if steps:
            args += ["--steps", str(steps)]
        if seeds:
            args += ["--seeds", *map(str, seeds)]
        console.rule(name)
        rc = subprocess.call(args, cwd=root)
        if rc != 0:
            raise typer.Exit(rc)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
