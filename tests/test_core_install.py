"""Issue 18, item 10: the agent runs with only the core install (`pip install actuator`).

What is real and what is borrowed, so the test stays honest and fast:

* The project is built into a wheel and installed, with its core dependencies resolved by pip from
  PyPI (pip's own cache is reused), into a fresh venv that does **not** see the system or this
  venv's site-packages. Nothing of the ``[server]`` or ``[train]`` extras is in it.
* torch, transformers and accelerate are the user's side of a training node (any build they like;
  we do not pull them). Installing torch again would cost minutes and a GB, so the new venv gets a
  ``.pth`` naming a directory of symlinks to exactly those three distributions and their own
  runtime requirements (followed through their metadata, markers evaluated), taken from this venv:
  a package neither core nor that closure cannot be imported there.
* In that venv a tiny ``transformers.Trainer`` trains with ``ActuatorCallback`` against the real
  controller service (run from this venv, as a separate machine would), receives a decision and
  applies it; the server packages are checked to be absent, not just unimported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
import venv
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
USER_SIDE = ("torch", "transformers", "accelerate")
SERVER_MODULES = ("fastapi", "uvicorn", "sqlalchemy", "alembic", "psycopg", "redis", "prometheus_client",
                  "matplotlib", "pydantic_settings", "starlette")

pytestmark = pytest.mark.timeout(900)


def _closure(names: tuple[str, ...]) -> set[str]:
    """The installed distributions ``names`` need at run time (no extras), themselves included."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a requirement for another platform
        seen.add(key)
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _link_distributions(names: set[str], into: Path) -> None:
    """Symlink each distribution's top-level modules and its .dist-info (for importlib.metadata)."""
    into.mkdir()
    for name in names:
        dist = metadata.distribution(name)
        roots = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for root in roots:
            source = Path(str(dist.locate_file(root)))
            target = into / root
            if source.exists() and not target.exists() and root != "__pycache__":
                target.symlink_to(source)


SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, sys
    server = [m for m in {server!r} if importlib.util.find_spec(m) is not None]
    import torch
    torch.set_num_threads(1)
    from transformers import Trainer, TrainerCallback, TrainingArguments
    from actuator.agents import ActuatorCallback, Probe
    from actuator.agents.models import tiny_llama

    class Rising(Probe):
        name = "rising"
        def __init__(self):
            self._init_schedule(1, False)
            self.calls = 0
        def _measure(self, model, *, max_examples=None):
            self.calls += 1
            return {{"custom.rising": float(self.calls)}}

    class Lockstep(TrainerCallback):  # each answer taken at the boundary after its reading (tiny steps take ms)
        def on_step_end(self, args, state, control, **kw):
            cb.session.sender.flush(20.0)

    policy = {{"name": "core-install", "controllers": [{{"name": "down", "probe": "custom.rising",
              "knob": "learning_rate", "setpoint": 0.0, "kp": 1.0}}]}}
    data = [{{"input_ids": torch.arange(2, 18), "labels": torch.arange(2, 18)}}] * 64
    args = TrainingArguments(output_dir={out!r}, max_steps=12, per_device_train_batch_size=4, learning_rate=1e-3,
                             lr_scheduler_type="constant", save_strategy="no", report_to=[], use_cpu=True,
                             disable_tqdm=True, logging_steps=1)
    cb = ActuatorCallback(policy, connection={url!r},
                          knobs={{"learning_rate": {{"min": 1e-6, "max": 1e-2, "max_step": 0.5}}}},
                          probes=[Rising()], reporting={{"budget_share": 1.0}})
    trainer = Trainer(model=tiny_llama(), args=args, train_dataset=data, callbacks=[cb, Lockstep()])
    trainer.train()
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in {server!r})
    print(json.dumps({{"server_installed": server, "server_loaded": loaded, "run_id": cb.session.run_id,
                      "applied": [e["knob"] for e in cb.session.applied],
                      "lr": trainer.optimizer.param_groups[0]["lr"]}}))
    """
)


def test_the_agent_trains_under_control_with_only_the_core_install(tmp_path, sqlite_service):
    core = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not any(Requirement(r).name in ("torch", "transformers", "fastapi", "sqlalchemy") for r in core)

    # Built from a copy of what the Dockerfile copies, so the build leaves nothing in the checkout.
    source = tmp_path / "src"
    for name in ("pyproject.toml", "README.md"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, source / name)
    for name in ("actuator", "controllers", "agents", "api", "migrations"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(source),
                    "-w", str(wheels)], check=True, cwd=tmp_path)
    wheel = next(wheels.glob("actuator-*.whl"))
    env_dir = tmp_path / "core-venv"
    venv.create(env_dir, with_pip=True, system_site_packages=False)
    python = env_dir / "bin" / "python"
    pip_env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
                   check=True, env=pip_env)
    installed = subprocess.run([str(python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
                               check=True, capture_output=True, text=True, env=pip_env).stdout
    names = {p["name"].lower() for p in json.loads(installed)}
    assert "actuator" in names and not names & {"torch", "transformers", "fastapi", "sqlalchemy", "matplotlib"}

    user_side = _closure(USER_SIDE)
    _link_distributions(user_side, tmp_path / "user-side")
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "user_side.pth").write_text(str(tmp_path / "user-side") + "\n")

    script = SCRIPT.format(server=SERVER_MODULES, out=str(tmp_path / "out"), url=sqlite_service.url)
    run_env = {**pip_env, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([str(python), "-c", script], capture_output=True, text=True, env=run_env, cwd=tmp_path,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["server_installed"] == [] and result["server_loaded"] == []
    assert result["run_id"] and "learning_rate" in result["applied"]
    assert result["lr"] < 1e-3  # the controller lowered it against the rising probe

    # The CLI's client side works there; `actuator serve` names the extra it needs.
    cli = env_dir / "bin" / "actuator"
    version = subprocess.run([str(cli), "--version"], capture_output=True, text=True, env=run_env)
    assert version.returncode == 0 and version.stdout.startswith("actuator ")
    serve = subprocess.run([str(cli), "serve"], capture_output=True, text=True, env=run_env)
    assert serve.returncode == 1 and "pip install 'actuator[server]'" in serve.stderr, serve.stderr
