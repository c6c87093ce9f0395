"""The ``actuator`` command: run the service, look at runs and decisions, validate policies."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from ._exceptions import ClientError, PolicyError

if TYPE_CHECKING:
    from .client import ActuatorClient
    from .config import Settings

app = typer.Typer(help="Actuator: closed-loop control of LLM post-training.", no_args_is_help=True,
                  add_completion=False)
policy_app = typer.Typer(help="Policy documents.", no_args_is_help=True)
app.add_typer(policy_app, name="policy")
bench_app = typer.Typer(help="Benchmarks: scripts in the source repository's benchmarks/ folder, which the package "
                             "does not install (run them inside a clone).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

SCENARIOS = ("plants", "sft-drift", "dpo-kl", "rl-kl", "draft-distill", "compress-rank")
console = Console()
err_console = Console(stderr=True)  # errors go to stderr, so `actuator runs > runs.txt` keeps them visible

UrlOpt = Annotated[str, typer.Option("--url", envvar="ACTUATOR_URL", help="Controller service URL.")]
TokenOpt = Annotated[Optional[str], typer.Option("--token", envvar="ACTUATOR_TOKEN", help="Bearer token.")]
DEFAULT_URL = "http://127.0.0.1:8000"


def _fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``error: message`` on stderr; return the Exit to raise."""
    err_console.print(f"[red]error:[/red] {message}")
    return typer.Exit(code)


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
) -> None:
    """Run the controller service (migrations are applied on start)."""
    try:
        import uvicorn

        from actuator.api.protocol import protocol_class
    except ImportError as exc:  # the core install (a training node) has no server
        # \[ : a literal bracket for rich, which would read [server] as markup and drop it
        raise _fail(f"`actuator serve` needs the server extra: pip install 'actuator\\[server]' ({exc})") from exc

    if database_url:
        os.environ["ACTUATOR_DATABASE_URL"] = database_url
    if redis_url:
        os.environ["ACTUATOR_REDIS_URL"] = redis_url
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
    uvicorn.run("actuator.api.app:create_app", factory=True, host=host, port=port, workers=workers,
                log_level=log_level, http=protocol_class(header_timeout))


def _check_serve(settings: Settings, workers: int) -> None:
    """Refuse a start that would fail requests; warn about one that leaves control open."""
    from .config import is_loopback

    if workers > 1 and settings.database_url.startswith("sqlite"):
        raise _fail(f"--workers {workers} needs Postgres: SQLite locks a run only inside one process, so two "
                    "workers would write one run at once and ingests would fail. Run one worker, or use Postgres "
                    "and Redis for several (ACTUATOR_DATABASE_URL=postgresql://..., ACTUATOR_REDIS_URL=redis://...).")
    if workers > 1 and settings.redis_url is None:
        err_console.print(f"[yellow]warning:[/yellow] --workers {workers} without Redis (ACTUATOR_REDIS_URL): a "
                          "run's live stream (/stream, the console) shows only the events of the worker it is "
                          "connected to.")
    if settings.admin_token is None and not is_loopback(settings.host):
        err_console.print(f"[bold yellow]warning:[/bold yellow] listening on {settings.host} with no admin token "
                          "(ACTUATOR_ADMIN_TOKEN): anyone who can reach port "
                          f"{settings.port} can register runs, create and archive policies, pause, override, "
                          "move and halt any run, and read every run. Set ACTUATOR_ADMIN_TOKEN, or listen on "
                          "127.0.0.1.")


def _client(url: str, token: str | None) -> ActuatorClient:
    from .client import ActuatorClient

    return ActuatorClient(url, token=token)


@app.command()
def runs(url: UrlOpt = DEFAULT_URL, token: TokenOpt = None,
         state: Annotated[Optional[str], typer.Option(help="running|paused|halted|finished")] = None,
         limit: int = 50) -> None:
    """List runs."""
    try:
        with _client(url, token) as c:
            items = c.list_runs(state=state, limit=limit)
    except ClientError as exc:
        raise _fail(f"{url}: {exc}") from exc
    table = Table("id", "name", "state", "policy", "step", "knobs")
    for r in items:
        knobs = ", ".join(f"{k}={v.value:.4g}" for k, v in r.knobs.items())
        table.add_row(r.id, r.name, r.state, f"{r.policy_name}@{r.policy_version}",
                      str(r.last_step if r.last_step is not None else "-"), knobs)
    console.print(table)


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
def decisions(run: Annotated[str, typer.Argument(help="Run id.")], url: UrlOpt = DEFAULT_URL,
              token: TokenOpt = None,
              explain: Annotated[bool, typer.Option("--explain", help="Show inputs and P/I/D.")] = False,
              limit: int = 1000) -> None:
    """List a run's decisions (the audit trail)."""
    try:
        with _client(url, token) as c:
            page = c.list_decisions(run, limit=limit)
    except ClientError as exc:
        raise _fail(f"{url}: {exc}") from exc
    if explain:
        for d in page.items:
            console.rule(f"decision {d.number} · step {d.step} · {d.knob}")
            console.print(f"  {d.knob}: {d.old_value:.6g} → {d.new_value:.6g}   (policy v{d.policy_version}, "
                          f"controller {d.controller or 'guardrail'})")
            console.print(f"  why: {d.reason}")
            console.print(f"  agent: {_agent_said(d)}")
            inp = d.inputs
            if "probe" in inp:
                console.print(f"  input: {inp['probe']} raw {inp['raw']:.6g}, filtered {inp['filtered']:.6g}, "
                              f"setpoint {inp['setpoint']:.6g}, dt {inp.get('dt')}")
                console.print(f"  limits: bounds {inp.get('bounds')}, max step {inp.get('max_step')} "
                              f"({inp.get('scale')}), limited by: {', '.join(inp.get('limited_by') or []) or 'nothing'}")
            comp = d.components
            if comp:
                console.print("  P {p:+.4g}  I {i:+.4g}  D {d:+.4g}  error {error:+.4g}".format(
                    **{k: (v if v is not None else float('nan')) for k, v in comp.items()}))
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


@policy_app.command("validate")
def policy_validate(path: Annotated[Path, typer.Argument(exists=True, dir_okay=False)]) -> None:
    """Validate a policy file locally; print every error with its path."""
    from .policy import load_policy

    try:
        doc = load_policy(path)
    except PolicyError as exc:
        for e in exc.errors or [{"loc": "(document)", "msg": str(exc)}]:
            err_console.print(f"[red]{e['loc']}[/red]: {e['msg']}")
        raise typer.Exit(1) from exc
    console.print(f"[green]valid[/green]: {doc.name} ({len(doc.controllers)} controllers, "
                  f"{len(doc.guardrails)} guardrails)")


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
    run: Annotated[str, typer.Option("--run", help="The recorded run (or identification pre-run) to fit.")],
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
            r = c.tune_policy(run, controller, aggressiveness=aggressiveness, policy=policy)
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
        table.add_row(f"{name} gains", _fmt_steps(p["settling_steps"]), over, str(p["decisions"]))
    console.print(table)
    console.print(f"horizon {pred['horizon']} steps")
    for w in r["warnings"]:
        err_console.print(f"[yellow]warning:[/yellow] {w}")
    console.rule("policy")
    console.print(r["policy_yaml"], markup=False, highlight=False)
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
            err_console.print(f"[yellow]{name}: not available in this checkout ({module.name} missing)[/yellow]")
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
