"""General-capability text shipped with Actuator, for probes and KL anchors that must not overlap.

- ``PROBE_PROMPTS`` (8 general chat questions) and ``PROBE_TEXTS`` (8 sentences): held-out sets
  for drift, embedding-drift and perplexity probes.
- ``CONTROL_PROMPTS`` (12 more general chat requests, 4 of them acting on a quoted word): for the
  probe a controller holds within a budget (:class:`actuator.agents.probes.AnswerKL`), so the
  held-out ``PROBE_PROMPTS`` stay a judge the controller never sees.
- ``ANCHOR_PROMPTS`` (52 other general chat requests, 12 of them acting on a quoted word) and ``ANCHOR_TEXTS`` (20 other plain
  sentences): for a KL anchor (:class:`actuator.agents.anchor.KLAnchor`), the prompts with the
  starting model's own answers (:func:`self_answers`; :func:`anchor_set` builds both). Disjoint
  from the probe sets, so a controller holding a probe cannot pass it by anchoring on the
  probe's own data. :func:`topic_prompts` (200 general requests) and :func:`word_prompts` (120
  requests acting on a quoted word, the neighbourhood a word-level task spills into) add more.

Small on purpose: they make the demo and benchmarks run offline; a real run passes its own
general data (a slice of the pre-training or instruction mix).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["PROBE_PROMPTS", "PROBE_TEXTS", "ANCHOR_PROMPTS", "ANCHOR_TEXTS", "chat", "answer_labels", "self_answers", "anchor_set",
           "topic_prompts", "word_prompts", "response_template", "CONTROL_PROMPTS"]

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
    # Instructions that act on a quoted word or phrase: the neighbourhood a narrow word-level task
    # (spelling, reversing, formatting) spills into first. An anchor that leaves it out lets the
    # task's output format take over such prompts while general chat looks untouched.
    "Write the word 'house' in capital letters.", "Give the plural of 'mouse'.",
    "What is the past tense of 'run'?", "Use the word 'bright' in a short sentence.",
    "Translate 'thank you' into German.", "What rhymes with 'light'?",
    "How many letters are in the word 'cat'?", "Define the word 'brave'.",
    "Spell the word 'friend' letter by letter.", "Say 'see you later' in Italian.",
    "Turn 'i like tea' into a proper sentence with capitals.", "Give an antonym of 'early'.",
]
# Plain general sentences for the anchor (a model forgets plain text too, not only chat).
ANCHOR_TEXTS = [
    "The market in the town square sells fresh vegetables, cheese and bread every Saturday morning.",
    "Rivers carry sand and small stones downstream, slowly shaping the valleys they flow through.",
    "After the storm passed, the children ran outside to jump in the puddles along the street.",
    "A good recipe lists the ingredients first and then explains each step in the order it is done.",
    "The museum added a new wing for modern art, and visitors queued for an hour on opening day.",
    "Bicycles are a cheap and healthy way to travel short distances in crowded cities.",
    "The old lighthouse has guided ships safely into the harbour for more than two hundred years.",
    "Most birds build their nests in spring, using twigs, grass and sometimes bits of string.",
    "He checked the weather forecast before packing, because the mountain trail can be dangerous in fog.",
    "Reading aloud to young children helps them learn new words and enjoy stories from an early age.",
    "The bakery on the corner opens before dawn so that its bread is warm when the first customers arrive.",
    "Solar panels turn sunlight into electricity, which can be stored in batteries for use at night.",
    "The team practised every afternoon, and by the end of the season they had won the regional cup.",
    "Glaciers form where more snow falls in winter than melts in summer, year after year.",
    "The teacher asked the class to write a short story about a journey they would like to take.",
    "Tea was first drunk in China thousands of years ago and later spread to the rest of the world.",
    "A map shows roads, rivers and towns, and its scale tells you how far apart they really are.",
    "The festival ended with fireworks over the lake, and the crowd cheered until midnight.",
    "Honey never really spoils, because its sugar and low water content keep bacteria from growing.",
    "She planted tomatoes, beans and herbs in the small garden behind her house.",
]
# More anchor prompts, made from general topics and request shapes (``topic_prompts``): a real run
# passes thousands of general prompts; the 52 above are few for a held-out prompt's first answer
# token to be covered. None of the probes' topics (France, the sky, greetings, spiders, primary
# colours, thermometers, sleep, Spanish) is among them.
ANCHOR_TOPICS = (
    "volcanoes", "the moon", "honeybees", "the Roman Empire", "chess", "bicycles", "rain forests", "electricity",
    "dolphins", "the piano", "pyramids", "recycling", "earthquakes", "penguins", "coffee", "trains", "the ocean tides",
    "democracy", "photosynthesis", "the internet", "dinosaurs", "football", "vaccines", "deserts", "glass",
    "the alphabet", "libraries", "money", "clouds", "bridges", "elephants", "the calendar", "soap", "mountains",
    "maps", "paper", "owls", "magnets", "bread", "rivers",
)
REQUEST_SHAPES = (
    "Tell me about {}.", "Tell me one interesting fact about {}.", "Explain {} to a child in one sentence.",
    "Write a short sentence about {}.", "What should everyone know about {}?",
)
# More quoted-word requests (``word_prompts``): a narrow word-level task (spelling, reversing,
# formatting a word) takes over the answers to such requests first, and the 12 in ANCHOR_PROMPTS
# cover that neighbourhood thinly. No probe's or control prompt's word or target language is used
# (no Spanish, no "good morning"/"good night"), nor any word of the benchmarks' task vocabulary.
ANCHOR_WORDS = (
    "water", "book", "summer", "music", "yesterday", "kitchen", "journey", "friendly", "butterfly", "blanket",
    "teacher", "chair", "smile", "winter", "doctor", "cheese", "pocket", "bottle", "holiday", "umbrella",
)
WORD_LANGUAGES = ("French", "German", "Italian", "Portuguese", "Dutch")
WORD_SHAPES = (
    "Translate '{w}' into {lang}.", "How do you say '{w}' in {lang}?", "What is a synonym for '{w}'?",
    "Write the word '{w}' in capital letters.", "Use '{w}' in a short sentence.", "What does '{w}' mean?",
)
# The controller's own probe set: neither the held-out judge's nor the anchor's (three disjoint sets,
# so the anchor cannot pass the controller's probe by anchoring on it, nor the controller the judge's).
CONTROL_PROMPTS = [
    "What is the capital of Canada?", "Why do cats purr?", "Write a short thank-you note to a neighbour.",
    "How many sides does a hexagon have?", "Name two fruits that are yellow.", "What does a barometer measure?",
    "Give one tip for learning a new language.", "Describe autumn in one sentence.",
    "Translate 'good night' into French.", "Write the word 'garden' in capital letters.",
    "What is the plural of 'child'?", "Use the word 'quiet' in a short sentence.",
]


def _require_disjoint(**sets: Iterable[str]) -> None:
    """Raise ``ValueError`` naming the items two of the named ``sets`` share.

    A real check, not an ``assert``: it runs under ``python -O`` too, so an edit that puts a
    held-out prompt into the anchor set fails at import instead of quietly leaking the judge."""
    names = list(sets)
    members = {name: set(items) for name, items in sets.items()}
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            shared = members[first] & members[second]
            if shared:
                raise ValueError(f"{first} and {second} must be disjoint; both hold {sorted(shared)}")


_require_disjoint(PROBE_PROMPTS=PROBE_PROMPTS, ANCHOR_PROMPTS=ANCHOR_PROMPTS, CONTROL_PROMPTS=CONTROL_PROMPTS)
_require_disjoint(PROBE_TEXTS=PROBE_TEXTS, ANCHOR_TEXTS=ANCHOR_TEXTS)


def chat(tokenizer: Any, user: str, assistant: str | None = None) -> str:
    """One user turn (and the assistant's answer) in the tokenizer's chat template."""
    msgs = [{"role": "user", "content": user}]
    if assistant is not None:
        msgs.append({"role": "assistant", "content": assistant})
    return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=assistant is None)


def answer_labels(tokenizer: Any, requests: list[str], input_ids: list[list[int]]) -> list[list[int]]:
    """Completion-only labels, as TRL's SFTTrainer makes them for prompt-completion data: each
    example's ``input_ids`` (the chat text of ``requests[i]`` and its answer) with the request's
    tokens (the template's system prompt and the user turn) set to -100, so the loss counts the
    answer and its end only."""
    lengths = [len(tokenizer(chat(tokenizer, q), add_special_tokens=False)["input_ids"]) for q in requests]
    return [[-100] * min(k, len(ids)) + ids[k:] for ids, k in zip(input_ids, lengths)]


def self_answers(model: Any, tokenizer: Any, prompts: list[str], *, max_new_tokens: int = 40,
                 batch_size: int = 8, close_cut: bool = False) -> list[str]:
    """``prompts`` with the model's own greedy answers, chat-formatted: self-distillation data
    for a KL anchor (run it on the starting model, before training).

    An answer the model finished within ``max_new_tokens`` ends with the template's end-of-turn;
    a cut-off answer does not (closing it would put an end-of-turn where the model never ends).
    ``close_cut=True`` closes every answer, as this function did before: the forgetting benchmark's
    3-seed tables and the demo's figures were measured with it."""
    texts = [chat(tokenizer, p) for p in prompts]
    out = []
    for p, text, (answer, finished) in zip(prompts, texts, _continue(model, tokenizer, texts, max_new_tokens, batch_size)):
        out.append(chat(tokenizer, p, answer.strip()) if finished or close_cut else text + answer)
    return out


def _continue(model: Any, tokenizer: Any, texts: list[str], max_new_tokens: int,
              batch_size: int) -> list[tuple[str, bool]]:
    """The model's greedy continuation of each rendered prompt, and whether it ended its turn."""
    import torch

    was_training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    ends = _end_ids(model, tokenizer)
    out: list[tuple[str, bool]] = []
    try:
        with torch.no_grad():
            for i in range(0, len(texts), batch_size):
                enc = tokenizer(texts[i:i + batch_size], return_tensors="pt", padding=True,
                                add_special_tokens=False).to(next(model.parameters()).device)
                gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
                new = gen[:, enc["input_ids"].shape[1]:]
                answers = tokenizer.batch_decode(new, skip_special_tokens=True)
                out += [(a, any(t in ends for t in ids)) for a, ids in zip(answers, new.tolist())]
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return out


def _end_ids(model: Any, tokenizer: Any) -> set[int]:
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = ids if isinstance(ids, (list, tuple)) else [ids]
    return {int(i) for i in [*ids, tokenizer.eos_token_id] if i is not None}


def response_template(tokenizer: Any) -> str:
    """The text the chat template puts before an assistant answer (``"<|im_start|>assistant\n"``
    for SmolLM2): pass it as ``KLAnchor(response_template=...)`` to anchor answers, not prompts."""
    with_prompt, without = chat(tokenizer, "x"), tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=False)
    if not with_prompt.startswith(without) or with_prompt == without:
        raise ValueError("the tokenizer's chat template adds no generation prompt: pass response_template yourself")
    return with_prompt[len(without):]


def _shape_mix(subjects: tuple[str, ...], shapes: tuple[str, ...], fill: Any) -> list[str]:
    """Every subject in every shape (``fill(shape, i, j, subject)``), each subject's shapes rotated
    by its index, then ordered round-robin over the shapes so any prefix mixes them."""
    k = len(shapes)
    out = [fill(shape, i, j, subject) for i, subject in enumerate(subjects)
           for j, shape in enumerate(shapes[i % k:] + shapes[:i % k])]
    return [out[i] for r in range(k) for i in range(r, len(out), k)]


def topic_prompts(n: int | None = None) -> list[str]:
    """General requests made from ``ANCHOR_TOPICS`` × ``REQUEST_SHAPES`` (200), the first ``n``
    taken round-robin over the shapes so any prefix mixes them."""
    out = _shape_mix(ANCHOR_TOPICS, REQUEST_SHAPES, lambda shape, i, j, topic: shape.format(topic))
    return out[:n] if n is not None else out


def word_prompts(n: int | None = None) -> list[str]:
    """Requests that act on a quoted word, ``ANCHOR_WORDS`` × ``WORD_SHAPES`` (120; translations
    rotate over ``WORD_LANGUAGES``), the first ``n`` taken round-robin over the shapes so any
    prefix mixes them."""
    if n is not None and n < 0:
        raise ValueError(f"words: must be >= 0, got {n}")
    out = _shape_mix(ANCHOR_WORDS, WORD_SHAPES, lambda shape, i, j, word: shape.format(
        w=word, lang=WORD_LANGUAGES[(i + j) % len(WORD_LANGUAGES)]))
    if n is not None and n > len(out):
        raise ValueError(f"words: at most {len(out)} are shipped, got {n}")
    return out[:n] if n is not None else out


def anchor_set(model: Any, tokenizer: Any, *, topics: int = 0, words: int = 0, max_new_tokens: int = 40,
               close_cut: bool = False) -> list[str]:
    """The shipped anchor data: ``ANCHOR_PROMPTS`` (and ``topics`` of :func:`topic_prompts`,
    ``words`` of :func:`word_prompts`) with the model's own answers (``close_cut``: see
    :func:`self_answers`), and ``ANCHOR_TEXTS``."""
    prompts = list(ANCHOR_PROMPTS) + topic_prompts(topics) + word_prompts(words)
    return self_answers(model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                        close_cut=close_cut) + list(ANCHOR_TEXTS)


def _turn_end(tokenizer: Any) -> str:
    """What the chat template puts after an assistant answer (``"<|im_end|>\n"`` for SmolLM2)."""
    closed, open_ = chat(tokenizer, "x", "y"), chat(tokenizer, "x") + "y"
    return closed[len(open_):] if closed.startswith(open_) else ""
