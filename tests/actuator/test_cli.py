"""The typer CLI against a real service: runs, decisions (--explain), policy validate; errors on
stderr, --version, bench outside a checkout, the scenario list and `bench control plants`' flags and
files; the package data it ships."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
from typer.testing import CliRunner

import actuator
from actuator.cli import app

POLICY = {"name": "cli-policy", "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                                  "setpoint": 0.1, "kp": 1.0, "ki": 0.2}]}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log"}]


def test_runs_and_decisions(sqlite_service):
    url = sqlite_service.url
    run = httpx.post(f"{url}/v1/runs", json={"name": "cli-run", "policy": POLICY, "knobs": KNOBS}).json()
    headers = {"Authorization": f"Bearer {run['token']}"}
    for seq, drift in enumerate([0.1, 0.4]):
        r = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers=headers,
                       json={"observations": [{"seq": seq, "step": 10 * (seq + 1), "probes": {"kl_drift": drift}}]})
        assert r.status_code == 200
    runner = CliRunner()
    out = runner.invoke(app, ["runs", "--url", url], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert run["id"] in out.output and "cli-run" in out.output and "cli-policy@1" in out.output

    out = runner.invoke(app, ["decisions", run["id"], "--url", url], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "learning_rate" in out.output and "1 decisions" in out.output

    out = runner.invoke(app, ["decisions", run["id"], "--url", url, "--explain"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "setpoint 0.1" in out.output and "raw 0.4" in out.output and "P " in out.output

    out = runner.invoke(app, ["decisions", "no-such-run", "--url", url])
    assert out.exit_code == 1 and "404" in out.output


def test_unreachable_service_is_a_clear_error():
    out = CliRunner().invoke(app, ["runs", "--url", "http://127.0.0.1:9"])
    assert out.exit_code == 1 and "error" in out.output


def test_policy_validate(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("name: p\ncontrollers:\n  - {name: c, probe: kl_drift, knob: learning_rate, setpoint: 0.1, kp: 1}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: p\ncontrollers:\n  - {name: c, probe: kl_drift, knob: warp_speed, setpoint: 0.1, kp: -1}\n")
    runner = CliRunner()
    assert runner.invoke(app, ["policy", "validate", str(good)]).exit_code == 0
    out = runner.invoke(app, ["policy", "validate", str(bad)], env={"COLUMNS": "200"})
    assert out.exit_code == 1
    assert "controllers.0.knob" in out.output and "controllers.0.kp" in out.output


def _cli(*args: str, cwd: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The real command line, in a child process: what a user's shell sees on stdout and stderr."""
    return subprocess.run([sys.executable, "-m", "actuator.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={**os.environ, "COLUMNS": "200", **(env or {})})


def test_errors_go_to_stderr():
    out = _cli("runs", "--url", "http://127.0.0.1:9")
    assert out.returncode == 1
    assert "error" in out.stderr and "127.0.0.1:9" in out.stderr
    assert out.stdout == ""  # `actuator runs > runs.txt` leaves the error on the terminal, not in the file


def test_version():
    out = _cli("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"actuator {importlib.metadata.version('actuator')}"


def test_bench_outside_a_checkout_explains_itself(tmp_path):
    """An installed (non-editable) package has no benchmarks/ beside it: the command says where the
    benchmarks are and how to run them, on stderr, with exit code 2."""
    site = tmp_path / "site"
    shutil.copytree(Path(actuator.__file__).parent, site / "actuator")  # the package as pip would install it
    work = tmp_path / "elsewhere"
    work.mkdir()
    out = _cli("bench", "control", "plants", cwd=str(work), env={"PYTHONPATH": str(site)})
    assert out.returncode == 2, out
    assert out.stdout == ""
    text = " ".join(out.stderr.split())
    assert "benchmarks/" in text and "clone" in text and "python -m benchmarks.control" in text, text
    assert str(work) in text


def test_package_data_globs_all_match_files():
    """Every package-data pattern in pyproject.toml names at least one file of the package it is for."""
    root = Path(__file__).resolve().parents[2]
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = config["package-dir"]
    for package, patterns in config["package-data"].items():
        folder = root / dirs.get(package, package.replace(".", "/"))
        for pattern in patterns:
            assert list(folder.glob(pattern)), f"package-data {package}: {pattern!r} matches nothing in {folder}"


def _scenario_modules(folder: Path) -> dict[str, str]:
    """The modules of ``folder`` that declare a module-level ``SCENARIO = "<name>"``: name -> file stem."""
    found = {}
    for path in sorted(folder.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["SCENARIO"]
                    and isinstance(node.value, ast.Constant)):
                found[node.value.value] = path.stem
    return found


def test_the_cli_lists_exactly_the_scenario_modules_that_exist():
    from actuator.cli import SCENARIOS

    modules = _scenario_modules(Path(__file__).resolve().parents[2] / "benchmarks" / "control")
    assert len(set(SCENARIOS)) == len(SCENARIOS)
    assert set(SCENARIOS) == set(modules)
    assert all(stem == name.replace("-", "_") for name, stem in modules.items())  # how the CLI finds the file


def test_bench_control_plants_takes_its_flags_and_writes_the_json_and_png_it_promises(tmp_path):
    """``actuator bench control plants`` in a checkout (a copy, so benchmarks/results stays as it is):
    --steps and --seeds reach the plants, --quick shortens the run, and both result files are written."""
    root = Path(__file__).resolve().parents[2]
    checkout = tmp_path / "checkout"
    shutil.copytree(root / "benchmarks" / "control", checkout / "benchmarks" / "control",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(root / "benchmarks" / "__init__.py", checkout / "benchmarks" / "__init__.py")
    results = checkout / "benchmarks" / "results"
    out = _cli("bench", "control", "plants", "--steps", "20", "--seeds", "3", "--seeds", "4", cwd=str(checkout))
    assert out.returncode == 0, out.stderr[-3000:]
    written = json.loads((results / "plants.json").read_text())
    assert written["seeds"] == [3, 4] and written["command"].endswith("--steps 20 --seeds 3 4")
    assert set(written["steps"].values()) == {20}
    comparisons = {k: v for k, v in written.items() if isinstance(v, dict) and k != "steps"}
    printed = {line[3:].rpartition(", seeds")[0] for line in out.stdout.splitlines() if line.startswith("== ")}
    assert len(comparisons) >= 5 and set(comparisons) == printed  # every comparison the run printed, in the file
    assert all(len(rows) == 2 for arms in comparisons.values() for rows in arms.values())
    assert (results / "plants.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in out.stdout and "plants.png" in out.stdout

    (results / "plants.png").unlink()
    out = _cli("bench", "control", "plants", "--quick", cwd=str(checkout))
    assert out.returncode == 0, out.stderr[-3000:]
    written = json.loads((results / "plants.json").read_text())
    assert written["seeds"] == [0, 1] and max(written["steps"].values()) == 100
    assert (results / "plants.png").is_file()
