"""The KL scenarios' shared trace callback (``harness.kl_trace``, used by dpo_kl and rl_kl) in a real
``Trainer.train()`` on a tiny model: the arm's own suite gives the step-0 reading at train begin,
each probe reading reaches ``on_value`` at its step with the trainer's optimizer, every step advances
the progress bar once and the trainer's logs reach ``on_log``."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from actuator.agents.probes import Perplexity, ProbeSuite
from actuator.agents.testing import HELD_OUT, NARROW_TASK, char_tokenizer, lm_dataset
from benchmarks.control.harness import kl_trace


class Beta:
    def __init__(self) -> None:
        self.value = 0.25

    def read(self) -> float:
        return self.value


def test_the_trace_callback_reads_the_arms_probe_at_its_steps(tmp_path) -> None:
    torch.manual_seed(0)
    tok = char_tokenizer()
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64))
    suite = ProbeSuite([Perplexity(HELD_OUT, tok, every=2)], budget_share=1.0)
    trace: list[dict] = []
    seen: list[tuple[int, float, bool]] = []
    logs: list[int] = []
    advanced: list[int] = []
    trainer = Trainer(model=model, train_dataset=lm_dataset(tok, NARROW_TASK[:16]), args=TrainingArguments(
        output_dir=str(tmp_path), max_steps=5, per_device_train_batch_size=4, learning_rate=1e-3, logging_steps=1,
        report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True))
    trainer.add_callback(kl_trace(
        "perplexity", Beta(), 0.25, trace, cb=None, suite=suite,
        on_value=lambda step, value, kw: seen.append((step, value, kw["optimizer"] is trainer.optimizer)),
        on_log=lambda step, entry: logs.append(step) if "loss" in entry else None,
        advance=lambda: advanced.append(1)))
    trainer.train()

    assert [t["step"] for t in trace] == [0] and trace[0]["beta"] == 0.25 and trace[0]["perplexity"] > 1
    assert [s for s, _, _ in seen] == [2, 4] and all(ok for *_, ok in seen)
    assert seen[0][1] != seen[1][1] and all(v > 1 for _, v, _ in seen)  # the model trained between them
    assert len(advanced) == 5 and logs == [1, 2, 3, 4, 5]
