"""The word-task scenarios' trainer (``word_task.make_trainer``, used by forgetting and sft_drift)
takes the batch a robustness row asks for: the batches the real ``Trainer`` draws have that many
examples, and forgetting's ``--batch-size`` is refused below 1 naming the flag, before a model loads."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from actuator.agents.testing import NARROW_TASK, char_tokenizer, lm_dataset
from benchmarks.control.forgetting import main, parser
from benchmarks.control.word_task import make_trainer


@pytest.mark.parametrize("batch", [4, 8])
def test_the_trainer_draws_batches_of_the_size_asked(tmp_path, batch: int) -> None:
    torch.manual_seed(0)
    tok = char_tokenizer()
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64))
    data = lm_dataset(tok, NARROW_TASK[:16])
    setup = SimpleNamespace(model=model, tok=tok, train=data)
    seen: list[int] = []
    trainer = make_trainer(setup, "b", 1e-3, 2, 0, tmp_path, batch_size=batch)  # type: ignore[arg-type]
    # the rows each training forward really saw
    model.register_forward_pre_hook(lambda _m, _args, kw: seen.append(kw["input_ids"].shape[0]), with_kwargs=True)
    trainer.train()
    assert seen == [batch, batch]
    assert trainer.args.per_device_train_batch_size == batch


def test_forgetting_keeps_batch_4_by_default_and_refuses_a_batch_below_1(capsys) -> None:
    assert parser().parse_args([]).batch_size == 4
    assert parser().parse_args(["--batch-size", "8"]).batch_size == 8
    with pytest.raises(SystemExit):
        main(["--batch-size", "0", "--aggregate"])
    assert "--batch-size must be >= 1, got 0" in capsys.readouterr().err
