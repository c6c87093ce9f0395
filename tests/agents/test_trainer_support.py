"""Issue 57: what each preset does on TRL's trainers is listed (docs/reference/callback.md, "Presets
on TRL's trainers") and the list is true. TRL's SFT, DPO, GRPO, RLOO, KTO, ORPO and CPO trainers,
each on the seed tiny Llama with the one line ``callbacks=[ActuatorCallback("preset:NAME")]``, under
every shipped preset, for two real ``train()`` steps against the real service: each run is
controlled (registered, its knobs bound, observations sent) where the table says verified or
controlled, and refused at ``train()`` start with a ConfigError naming the knob where it says
refused. ORPO and CPO under dpo-kl were controlled (an anchor put on them) and listed nowhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from actuator import ConfigError
from actuator.agents.callback import ActuatorCallback, Reporting
from actuator.policy import list_presets, load_preset

from trl_walk import TRAINERS, build

ROOT = Path(__file__).resolve().parents[2]
NAMES = {"sft": "SFT", "dpo": "DPO", "grpo": "GRPO", "rloo": "RLOO", "kto": "KTO", "orpo": "ORPO", "cpo": "CPO"}


def support_table() -> dict[str, dict[str, str]]:
    """trainer row -> preset -> cell, from the docs' table."""
    text = (ROOT / "docs" / "reference" / "callback.md").read_text()
    start = text.index("## Presets on TRL's trainers")
    section = text[start:text.index("\n## ", start + 1)]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("|") and not line.startswith("|---")]
    header, body = rows[0], rows[1:]
    return {row[0]: dict(zip(header[1:], row[1:])) for row in body}


def test_the_table_covers_every_preset_and_the_trainers_the_issue_names():
    table = support_table()
    assert set(table) == {*NAMES.values(), "GKD", "online DPO"}
    assert all(set(cells) == set(list_presets()) for cells in table.values()), (list_presets(), table)
    assert all(re.match(r"(verified|controlled|refused|untested)\b", c) for cells in table.values()
               for c in cells.values())


@pytest.mark.parametrize("trainer", TRAINERS)
def test_each_preset_controls_or_refuses_the_trainer_as_the_table_says(trainer, tmp_path, char_tokenizer,
                                                                        module_service):
    expected = support_table()[NAMES[trainer]]
    for preset in list_presets():
        cb = ActuatorCallback(f"preset:{preset}", connection=module_service.url, run=f"{trainer}-{preset}",
                              reporting=Reporting(budget_share=1.0))
        trl_trainer = build(trainer, tmp_path / preset, char_tokenizer, cb)
        cell = expected[preset]
        if cell.startswith("refused"):
            with pytest.raises(ConfigError, match=r"^knobs\.\w+: ") as refused:
                trl_trainer.train()
            assert trl_trainer.state.global_step == 0, (preset, str(refused.value))
            continue
        trl_trainer.train()
        knobs = set(cb.session.policy_knobs())
        assert cb.session.run_id and knobs and knobs <= set(cb.session.setters), (preset, cb.session.setters)
        # a preset on the trainer's own train.* signals runs no probe: no baseline at step 0, its first
        # observation is the first logged step
        first = 0 if load_preset(preset).probes else 1
        assert trl_trainer.state.global_step == 2 and cb.session.history and cb.session.history[0]["step"] == first, preset
        if "anchor added" in cell:
            assert getattr(trl_trainer, "kl_anchor", None) is not None, preset
