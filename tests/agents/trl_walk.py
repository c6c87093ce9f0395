"""Each of TRL's trainers the support table lists, built on the seed tiny Llama and the in-process
character tokenizer with a few rows of plain-text data, for tests/agents/test_trainer_support.py."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

from actuator.agents.models import tiny_llama
from actuator.agents.testing import NARROW_TASK

TRAINERS = ("sft", "dpo", "grpo", "rloo", "kto", "orpo", "cpo")
STEPS = 2


def _common(out: Path) -> dict[str, Any]:
    return dict(output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=2, learning_rate=1e-3,
                lr_scheduler_type="constant", use_cpu=True, report_to=[], logging_steps=1, save_strategy="no",
                disable_tqdm=True, seed=0, dataloader_num_workers=0, bf16=False)


def _pairs():
    import datasets

    return datasets.Dataset.from_list([{"prompt": f"{a}+1=", "chosen": str(a + 1), "rejected": str(a + 2)}
                                       for a in range(8)])


def _reward(completions, **kw):  # type: ignore[no-untyped-def]
    return [float(len(c)) for c in completions]


def build(name: str, out: Path, tokenizer: Any, callback: Any) -> Any:
    """TRL's ``name`` trainer with ``callback`` in ``callbacks=[...]`` (the README's one line)."""
    import datasets

    model = tiny_llama(seed=0)
    common = _common(out)
    warnings.filterwarnings("ignore")
    if name == "sft":
        from trl import SFTConfig, SFTTrainer

        return SFTTrainer(model=model, args=SFTConfig(max_length=32, **common),
                          train_dataset=datasets.Dataset.from_dict({"text": NARROW_TASK}), processing_class=tokenizer,
                          callbacks=[callback])
    if name == "dpo":
        from trl import DPOConfig, DPOTrainer

        return DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=DPOConfig(max_length=32, **common),
                          train_dataset=_pairs(), processing_class=tokenizer, callbacks=[callback])
    if name in ("grpo", "rloo"):
        from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

        config, trainer = (GRPOConfig, GRPOTrainer) if name == "grpo" else (RLOOConfig, RLOOTrainer)
        # beta 0.5: the README's TRL command lines (beta 0 never loads a reference model)
        args = config(num_generations=2, max_completion_length=4, beta=0.5, **common)
        saved = out.parent / "tiny-llama"  # with beta > 0 the trainer loads its reference by the model's path
        if not saved.exists():
            model.save_pretrained(saved)
        return trainer(model=str(saved), reward_funcs=_reward, args=args,
                       train_dataset=datasets.Dataset.from_dict({"prompt": ["1+1=", "2+2=", "3+3=", "4+4="]}),
                       processing_class=tokenizer, callbacks=[callback])
    if name == "kto":
        from trl import KTOConfig, KTOTrainer

        rows = [{"prompt": f"{a}+1=", "completion": str(a + 1 + (a % 2)), "label": a % 2 == 0} for a in range(8)]
        return KTOTrainer(model=model, ref_model=copy.deepcopy(model), args=KTOConfig(max_length=32, **common),
                          train_dataset=datasets.Dataset.from_list(rows), processing_class=tokenizer,
                          callbacks=[callback])
    if name == "orpo":
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer

        return ORPOTrainer(model=model, args=ORPOConfig(max_length=32, **common), train_dataset=_pairs(),
                           processing_class=tokenizer, callbacks=[callback])
    if name == "cpo":
        from trl.experimental.cpo import CPOConfig, CPOTrainer

        return CPOTrainer(model=model, args=CPOConfig(max_length=32, **common), train_dataset=_pairs(),
                          processing_class=tokenizer, callbacks=[callback])
    raise ValueError(name)
