"""Every fenced code block of README.md and docs/ is run or checked (moved here from
tests/agents/test_readme_snippets.py, which ran the README's trainer snippets).

- **python**: every trainer snippet runs as written, on tiny models against the real controller
  service, after the unmarked python blocks without a trainer on its page (its imports): the
  trainer trains a few steps under control, the run the service stores has the knob the preset
  steers, with the setter the callback found on the trainer, and every probe the policy names
  (built by the callback where the snippet passes none). Models are built in memory, as the
  project's own loader (``load_smollm2()``) gives them: nothing for TRL to load a reference model
  from again. An unmarked python block that is neither is an error.
- **yaml**: a policy document (or its ``controllers:`` part) valid under ``PolicyDocument``.
- **bash**: every command is a Makefile target, a command of the ``actuator`` CLI with options it
  takes, a module or script of the repository, or pytest on paths that exist.
- anything else, and blocks not to run, carry a marker (``tests/docs/snippets.py``) that is checked.
"""

from __future__ import annotations

import ast
import copy
import importlib
import importlib.util
import re
import shlex
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from transformers import Trainer, TrainingArguments

from actuator.agents.callback import ActuatorCallback
from actuator.agents.compression import factorize
from actuator.agents.distill import DistillationTrainer
from actuator.agents.models import tiny_llama
from actuator.agents.trl_knobs import KL_BETA_START
from actuator.policy import PolicyDocument, probe_for_key

from agent_helpers import HELD_OUT, NARROW_TASK, lm_dataset
from snippets import ROOT, Block, all_blocks, blocks
from test_trl_knobs import _reward, preference_dataset

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

STEPS = 3
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def kind_of(block: str) -> str:
    for marker, kind in (("anchor_trainer(SFTTrainer)", "anchor"), ("SFTTrainer(", "sft"), ("DPOTrainer(", "dpo"),
                         ("GRPOTrainer(", "grpo"), ("DistillationTrainer(", "distill"), ("ThresholdKnob(", "threshold"),
                         ("factorize(", "compress"), ("policy={", "own")):
        if marker in block:
            return kind
    return "imports"


# knob the snippet's preset steers, and the setter the callback must find for it
EXPECTED = {"sft": ("learning_rate", "LearningRateKnob"), "dpo": ("kl_weight", "KLAnchorKnob"),
            "grpo": ("kl_beta", "KLBetaKnob"), "distill": ("distill_lambda", "DistillLambdaKnob"),
            "compress": ("rank", "RankKnob"), "threshold": ("compression_threshold", "ThresholdKnob"),
            "own": ("learning_rate", "LearningRateKnob"), "anchor": ("kl_weight", "KLAnchorKnob")}


def runnable(lang: str) -> list[Block]:
    return [b for b in all_blocks() if b.lang == lang and b.marker is None]


def test_every_python_block_is_run_and_every_kind_of_training_is_covered():
    kinds = [kind_of(b.body) for b in runnable("python")]
    assert sorted(k for k in kinds if k != "imports") == sorted(EXPECTED), kinds
    # an imports block runs before its page's trainer snippets, so a page of imports alone runs nothing
    pages = {b.doc for b in runnable("python") if kind_of(b.body) == "imports"}
    assert pages == {b.doc for b in runnable("python") if kind_of(b.body) != "imports"}


def _common(tmp_path) -> dict:
    return dict(output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=2, use_cpu=True,
                report_to=[], save_strategy="no", disable_tqdm=True, logging_steps=1, seed=0,
                dataloader_num_workers=0)


def saved_tiny(tmp_path, tok) -> str:
    model_dir = tmp_path / "tiny"
    tiny_llama(seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    return str(model_dir)


def namespace(kind: str, tmp_path, tok) -> dict:
    from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

    if kind == "anchor":  # anchor_set asks the model for its own answers through the chat template
        tok = copy.deepcopy(tok)
        tok.chat_template = CHAT_TEMPLATE

    ns = {"tok": tok, "tokenizer": tok, "prompts": HELD_OUT, "texts": HELD_OUT, "held_out_prompts": HELD_OUT,
          "held_out_texts": HELD_OUT, "Trainer": Trainer, "SFTTrainer": SFTTrainer, "DPOTrainer": DPOTrainer,
          "GRPOTrainer": GRPOTrainer, "DistillationTrainer": DistillationTrainer, "factorize": factorize}
    plain = TrainingArguments(**_common(tmp_path), learning_rate=5e-3)
    if kind in ("sft", "anchor"):
        ns.update(model=tiny_llama(seed=0), ds=datasets.Dataset.from_dict({"text": NARROW_TASK}),
                  args=SFTConfig(**_common(tmp_path), max_length=32, bf16=False))
    elif kind == "dpo":  # in memory, like load_smollm2(): the snippet passes ref_model=
        ns.update(model=tiny_llama(seed=0), pairs=preference_dataset(8),
                  args=DPOConfig(**_common(tmp_path), max_length=32, bf16=False))
    elif kind == "grpo":
        ns.update(model_id=saved_tiny(tmp_path, tok), reward=_reward,
                  prompt_ds=datasets.Dataset.from_dict({"prompt": ["1+1=", "2+2=", "3+3=", "4+4="]}),
                  grpo_args=GRPOConfig(**_common(tmp_path), num_generations=2, max_completion_length=4,
                                       beta=KL_BETA_START, bf16=False))
    elif kind == "distill":
        ns.update(student=tiny_llama(seed=0), teacher=tiny_llama(seed=1), args=plain,
                  ds=lm_dataset(tok, NARROW_TASK))
    elif kind == "threshold":
        gen = torch.Generator().manual_seed(0)
        ns.update(model=tiny_llama(seed=0), args=plain, ds=lm_dataset(tok, NARROW_TASK),
                  calibration_blocks=[torch.randint(3, 128, (16,), generator=gen).tolist() for _ in range(4)])
    else:  # compress, own
        ns.update(model=tiny_llama(seed=0), args=plain, ds=lm_dataset(tok, NARROW_TASK),
                  train=lm_dataset(tok, NARROW_TASK))
    return ns


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_doc_snippet_trains_under_control(kind, tmp_path, char_tokenizer, sqlite_service, monkeypatch):
    monkeypatch.setenv("ACTUATOR_URL", sqlite_service.url)
    monkeypatch.chdir(tmp_path)  # a snippet may write (the compression export)
    snippet = next(b for b in runnable("python") if kind_of(b.body) == kind)
    ns = namespace(kind, tmp_path, char_tokenizer)
    for imports in (b for b in blocks(ROOT / snippet.doc) if b.lang == "python" and b.marker is None
                    and kind_of(b.body) == "imports"):
        exec(compile(imports.body, str(imports), "exec"), ns)
    exec(compile(snippet.body, str(snippet), "exec"), ns)
    trainer = ns["trainer"]
    if "trainer.train()" not in snippet.body:
        trainer.train()

    assert trainer.state.global_step == STEPS
    cb = next(c for c in trainer.callback_handler.callbacks if isinstance(c, ActuatorCallback))
    knob, setter = EXPECTED[kind]
    assert type(cb.session.setters[knob]).__name__ == setter
    run = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}").json()
    assert run["state"] == "finished" and knob in run["knobs"]
    assert run["knobs_in_effect"][knob] == pytest.approx(cb.session.setters[knob].read())
    # every probe the policy names was measured at the baseline (the callback built those not passed)
    named = {spec.name for spec in cb.session.policy_doc.probes}
    assert named <= {probe_for_key(key) or key for key in cb.session.history[0]["probes"]}, cb.session.history[0]
    if kind == "threshold":  # the export the snippet wrote loaded back without Actuator's classes
        assert (tmp_path / "compressed" / "config.json").exists()
        # (a plain transformers class, or the exported modeling_actuator_lowrank.py file's: not the actuator package)
        assert type(ns["model"]).__module__.split(".")[0] != "actuator", type(ns["model"]).__module__


# ---- yaml: policies ------------------------------------------------------------------------------

@pytest.mark.parametrize("block", runnable("yaml"), ids=str)
def test_yaml_block_is_a_valid_policy(block):
    document = yaml.safe_load(block.body)
    PolicyDocument.model_validate({"name": "doc-snippet", **document})


# ---- bash: commands --------------------------------------------------------------------------------

def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def commands(body: str) -> list[list[str]]:
    """Each command of a shell block: continuations joined, comments, `&`, `VAR=value ` prefixes
    and the docs' [optional] brackets dropped."""
    text = re.sub(r"\\\n", " ", body)
    found = []
    for line in text.splitlines():
        words = shlex.split(line.replace("[", "").replace("]", ""), comments=True)
        while words and re.match(r"^[A-Z_]+=", words[0]):
            words.pop(0)
        if words and words[-1] == "&":
            words.pop()
        if words:
            found.append(words)
    return found


def cli_parses(args: list[str]) -> str:
    """Parse ``actuator ARGS`` with the CLI's own parser, down to the command it names, without
    running it. Returns the command path; an unknown command or option raises."""
    import typer

    from actuator.cli import app

    command, name, rest = typer.main.get_command(app), "actuator", list(args)
    while True:
        try:
            ctx = command.make_context(name, list(rest))
        except Exception as exc:  # typer's own click raises its Exit for an eager option (--version)
            if type(exc).__name__ == "Exit":
                return name
            raise
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]  # a group keeps its command name there
        if not hasattr(command, "resolve_command") or not rest:
            return name
        sub, command, rest = command.resolve_command(ctx, rest)
        name = f"{name} {sub}"


def check_command(words: list[str]) -> None:
    head, args = words[0], words[1:]
    if head == "make":
        assert args and set(a for a in args if "=" not in a) <= make_targets(), words
    elif head == "actuator":
        cli_parses(args)
    elif head.endswith("python") and args[:2] == ["-m", "pytest"]:
        paths = [a for a in args[2:] if not a.startswith("-")]
        assert paths and all((ROOT / p).exists() for p in paths), words
    elif head.endswith("python") and args[:1] == ["-m"]:
        assert importlib.util.find_spec(args[1]) is not None, words
    elif head.endswith("python"):
        assert (ROOT / args[0]).is_file(), words
    else:
        raise AssertionError(f"{words}: not a command this test can check; mark the block")


@pytest.mark.parametrize("block", runnable("bash"), ids=str)
def test_bash_block_commands_exist(block):
    for words in commands(block.body):
        check_command(words)


def test_the_cli_check_refuses_what_the_cli_refuses():
    assert cli_parses(["decisions", "abc", "--explain"]) == "actuator decisions"
    assert cli_parses(["policy", "show", "preset:sft-capability"]) == "actuator policy show"
    for bad in (["decisions", "abc", "--explainn"], ["policy", "shw", "x"], ["runs", "--state"]):
        with pytest.raises(Exception, match=r"(?i)no such|requires an argument"):  # typer's own click's UsageErrors
            cli_parses(bad)
    with pytest.raises(AssertionError):
        check_command(["make", "no-such-target"])


# ---- markers ------------------------------------------------------------------------------------

def test_every_block_has_a_language_it_checks_or_a_marker():
    unchecked = [str(b) for b in all_blocks() if b.marker is None and b.lang not in ("python", "yaml", "bash")]
    assert not unchecked, f"mark these blocks (tests/docs/snippets.py): {unchecked}"


@pytest.mark.parametrize("block", [b for b in all_blocks() if b.marker], ids=str)
def test_marked_block_is_checked(block):
    if block.marker == "not-run":
        assert len(block.arg) > 10, f"{block}: say why it is not run"
        if block.lang == "python":
            tree = ast.parse(block.body)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("actuator"):
                    module = importlib.import_module(node.module)
                    missing = [a.name for a in node.names if not hasattr(module, a.name)]
                    assert not missing, f"{block}: {node.module} has no {missing}"
        elif block.lang == "yaml":
            yaml.safe_load(block.body)
        elif block.lang == "bash":
            for words in commands(block.body):
                if words[0] == "actuator":
                    cli_parses(words[1:])
    elif block.marker == "output":
        source = ROOT / block.arg.split()[0].strip("(")
        assert source.is_file(), block
        text = source.read_text()
        for line in block.body.splitlines():
            assert line.split()[0] in text, (block, line)
    elif block.marker == "paths":
        for line in block.body.splitlines():
            assert (ROOT / line.split()[0]).exists(), (block, line)
    elif block.marker == "run-by":
        test = ROOT / block.arg
        assert test.is_file(), block
        assert Path(block.doc).name in test.read_text(), f"{test} does not read {block.doc}"
