"""SFT under accelerate's FSDP2 plugin with ActuatorCallback (a GPU recipe; not run by the tests).

    accelerate launch --config_file examples/fsdp2/accelerate_fsdp2.yaml examples/fsdp2/train.py \
        --model HuggingFaceTB/SmolLM2-1.7B-Instruct --url http://controller:8000

Every rank builds the same callback, with the same probes: under FSDP2 each probe's forward passes
are collectives, so every rank runs them in lockstep (rank 0 decides the schedule and sends the
values); the drift reference is a sharded copy; a rollback restores the sharded checkpoint the
callback writes beside each Trainer checkpoint (``actuator-sharded/``, torch.distributed.checkpoint;
``output_dir`` must be on a filesystem every rank reaches). See docs/how-to/sharded-training.md.
"""

from __future__ import annotations

import argparse

from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from actuator.agents.callback import ActuatorCallback, Protect
from actuator.agents.probes import KLDrift, Perplexity

GENERAL = ["Explain why the sky is blue.", "Write a short poem about the sea.",
           "What is the capital of Australia?", "Summarise the plot of Hamlet in two sentences."]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="HuggingFaceTB/SmolLM2-1.7B-Instruct")
    ap.add_argument("--url", default=None, help="the controller service (default $ACTUATOR_URL)")
    ap.add_argument("--output-dir", default="out-fsdp2")
    a = ap.parse_args()

    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model)
    data = load_dataset("trl-lib/Capybara", split="train[:2000]")
    args = SFTConfig(output_dir=a.output_dir, max_steps=500, per_device_train_batch_size=4, learning_rate=2e-5,
                     bf16=True, logging_steps=10, save_strategy="steps", save_steps=50, report_to=[])
    callback = ActuatorCallback(
        protect=Protect({"kl_drift": 0.5, "perplexity": "+10%"}, on_breach="rollback"), connection=a.url,
        probes=[KLDrift(GENERAL, tok, every=25), Perplexity(GENERAL, tok, every=50)])
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok, callbacks=[callback])
    trainer.train()


if __name__ == "__main__":
    main()
