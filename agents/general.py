"""General-capability text shipped with Actuator, for probes and KL anchors that must not overlap.

- ``PROBE_PROMPTS`` (8 general chat questions) and ``PROBE_TEXTS`` (8 sentences): held-out sets
  for drift, embedding-drift and perplexity probes.
- ``ANCHOR_PROMPTS`` (40 other general chat questions): for a KL anchor
  (:class:`actuator.agents.anchor.KLAnchor`), typically with the starting model's own answers
  (:func:`self_answers`). Disjoint from the probe sets, so a controller holding a probe cannot
  pass it by anchoring on the probe's own prompts.

Small on purpose: they make the demo and benchmarks run offline; a real run passes its own
general data (a slice of the pre-training or instruction mix).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PROBE_PROMPTS", "PROBE_TEXTS", "ANCHOR_PROMPTS", "chat", "self_answers"]

PROBE_PROMPTS = [
    "What is the capital of France?", "Explain in one sentence why the sky is blue.",
    "Write a short greeting for a new colleague.", "How many legs does a spider have?",
    "Name three primary colors.", "What does a thermometer measure?", "Give one tip for sleeping better.",
    "Translate 'good morning' into Spanish.",
]
PROBE_TEXTS = [
    "The library opens at nine in the morning and closes at six in the evening on weekdays.",
    "Photosynthesis lets plants turn sunlight, water and carbon dioxide into sugar and oxygen.",
    "The train to the coast was delayed because a tree had fallen across the tracks overnight.",
    "Good sleep habits include a regular bedtime, a dark room and avoiding screens late at night.",
    "The committee will publish its report after reviewing the comments it received from the public.",
    "Mount Everest is the highest mountain above sea level, on the border between Nepal and China.",
    "She practised the violin every evening, and by spring she could play the whole concerto.",
    "Water boils at one hundred degrees Celsius at sea level, and at lower temperatures at altitude.",
]
ANCHOR_PROMPTS = [
    "What is the largest planet in the solar system?", "Give me a synonym for 'happy'.",
    "How do you make a cup of tea?", "What is the boiling point of water in Fahrenheit?",
    "Name a famous painting by Leonardo da Vinci.", "Why do leaves change color in autumn?",
    "What is two plus two?", "Suggest a name for a pet cat.", "What language is spoken in Brazil?",
    "Describe a rainbow in one sentence.", "What is the opposite of 'cold'?", "How many days are in a week?",
    "Give one reason to exercise regularly.", "What is the chemical symbol for gold?",
    "Write a one-line poem about the sea.", "Who wrote 'Romeo and Juliet'?", "What do bees make?",
    "Explain what a noun is.", "How many continents are there?", "What is the capital of Japan?",
    "Recommend a healthy breakfast.", "What is the freezing point of water in Celsius?",
    "Name two animals that live in the ocean.", "What does a compass show?", "Why do we need sleep?",
    "What is the square root of nine?", "Give an example of a renewable energy source.",
    "How do plants get water?", "What is the main ingredient of bread?", "Say thank you in French.",
    "What is the tallest animal?", "Explain what a verb is in one sentence.", "How many hours are in a day?",
    "What color do you get by mixing blue and yellow?", "Name a musical instrument with strings.",
    "What is the capital of Italy?", "Why is exercise good for the heart?", "What is a group of wolves called?",
    "Give one tip for saving money.", "What gas do humans breathe out?",
]
assert not set(ANCHOR_PROMPTS) & set(PROBE_PROMPTS)


def chat(tokenizer: Any, user: str, assistant: str | None = None) -> str:
    """One user turn (and the assistant's answer) in the tokenizer's chat template."""
    msgs = [{"role": "user", "content": user}]
    if assistant is not None:
        msgs.append({"role": "assistant", "content": assistant})
    return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=assistant is None)


def self_answers(model: Any, tokenizer: Any, prompts: list[str], *, max_new_tokens: int = 40,
                 batch_size: int = 8) -> list[str]:
    """``prompts`` with the model's own greedy answers, chat-formatted: self-distillation data
    for a KL anchor (run it on the starting model, before training)."""
    import torch

    was_training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    out_texts = []
    try:
        with torch.no_grad():
            for i in range(0, len(prompts), batch_size):
                batch = prompts[i:i + batch_size]
                enc = tokenizer([chat(tokenizer, p) for p in batch], return_tensors="pt", padding=True,
                                add_special_tokens=False).to(next(model.parameters()).device)
                out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
                answers = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
                out_texts += [chat(tokenizer, p, a.strip()) for p, a in zip(batch, answers)]
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return out_texts
