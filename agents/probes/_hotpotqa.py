"""HotpotQA: EM / F1 of greedy answers and the log-probability of the gold answer.

Reads the official HotpotQA JSON format (a list of records with ``_id``, ``question``,
``answer``, ``context`` = ``[[title, [sentence, ...]], ...]``, ``supporting_facts`` =
``[[title, sentence_index], ...]``, ``type``, ``level``) from a path the user gives, or the
synthetic multi-hop set shipped in ``data/`` (see ``_synthetic``). Nothing is downloaded.
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import os
import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ._base import DefaultEvery, Probe
from ._common import context_length, encode, eos_token_ids, logger, model_device, subsample
from ._errors import HotpotQAFormatError, ProbeDataError, ProbeDataNotFoundError, ProbeError
from ._registry import register

__all__ = [
    "HotpotQA",
    "load_hotpotqa",
    "builtin_hotpotqa_path",
    "validate_hotpotqa_record",
    "normalize_answer",
    "exact_match_score",
    "f1_score",
    "build_prompt",
    "extract_answer",
    "is_yes_no_question",
    "choice_options",
    "few_shot_examples",
    "generate_and_score",
    "HotpotQAPrompt",
    "BUILTIN_HOTPOTQA",
    "HOTPOTQA_TYPES",
    "HOTPOTQA_LEVELS",
]

BUILTIN_HOTPOTQA = "hotpotqa_synthetic.json"
HOTPOTQA_TYPES = ("bridge", "comparison")
HOTPOTQA_LEVELS = ("easy", "medium", "hard")
DEFAULT_MAX_PROMPT = 2048  # CPU-friendly cap when max_length is not given (model context otherwise)

INSTRUCTION = (
    "Answer the question using the paragraphs below. Reply with the answer only: "
    "a name, a number, a short phrase, or yes or no."
)
DEFAULT_SHOTS = 3
# The kinds the few-shot examples cycle through: a bridge question (an entity), a yes/no
# comparison, a comparison that names one of the two. One of each teaches a small model all three
# answer shapes; the yes/no one also shows that "yes"/"no" is a whole answer.
_SHOT_KINDS = ("bridge", "yes/no", "comparison")


# -- official answer metrics (hotpot_evaluate_v1.py) -------------------------------------------
def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation, drop articles (a, an, the), collapse whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match_score(prediction: str, ground_truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1_score(prediction: str, ground_truth: str) -> tuple[float, float, float]:
    """(f1, precision, recall) over normalised tokens, as the official script computes them.

    A yes / no / noanswer on either side scores zero unless both sides are the same word.
    """
    pred = normalize_answer(prediction)
    gold = normalize_answer(ground_truth)
    special = ("yes", "no", "noanswer")
    if (pred in special or gold in special) and pred != gold:
        return 0.0, 0.0, 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0, 0.0, 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


# -- format ------------------------------------------------------------------------------------
def builtin_hotpotqa_path() -> Path:
    """Path of the shipped synthetic multi-hop set (official HotpotQA format)."""
    return Path(str(resources.files("actuator.agents.probes") / "data" / BUILTIN_HOTPOTQA))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_hotpotqa_record(record: Any, index: int, *, strict: bool = False) -> None:
    """Raise ``HotpotQAFormatError`` (naming record and field) unless ``record`` is well formed.

    Always checked: ``_id``, ``question``, ``answer`` are strings, ``context`` is a non-empty
    list of ``[title, [sentences]]``, ``supporting_facts`` a list of ``[title, int]``, and
    ``type`` / ``level`` take official values when present. ``strict`` (used on the data this
    project generates) also requires ``type`` and ``level``, unique titles, a non-empty
    answer, and supporting facts that point at existing sentences; the official files have a
    few records that break those, so loading does not demand them.
    """
    if not isinstance(record, dict):
        raise HotpotQAFormatError(f"expected an object, got {type(record).__name__}", index=index, field="<record>")
    rid = record.get("_id") if isinstance(record.get("_id"), str) else None

    def fail(field: str, message: str) -> HotpotQAFormatError:
        return HotpotQAFormatError(message, index=index, field=field, record_id=rid)

    for field in ("_id", "question", "answer", "context", "supporting_facts"):
        if field not in record:
            raise fail(field, "missing")
    for field in ("_id", "question", "answer"):
        if not isinstance(record[field], str):
            raise fail(field, f"must be a string, got {type(record[field]).__name__}")
    if not record["_id"].strip():
        raise fail("_id", "is empty")
    if not record["question"].strip():
        raise fail("question", "is empty")
    context = record["context"]
    if not isinstance(context, list) or not context:
        raise fail("context", "must be a non-empty list of [title, [sentences]] pairs")
    sentences_of: dict[str, int] = {}
    for j, item in enumerate(context):
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise fail(f"context[{j}]", f"must be a [title, [sentences]] pair, got {item!r:.80}")
        title, sentences = item
        if not isinstance(title, str):
            raise fail(f"context[{j}][0]", f"title must be a string, got {type(title).__name__}")
        if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
            raise fail(f"context[{j}][1]", "sentences must be a list of strings")
        if strict and title in sentences_of:
            raise fail(f"context[{j}][0]", f"duplicate title {title!r}")
        sentences_of[title] = len(sentences)
    facts = record["supporting_facts"]
    if not isinstance(facts, list):
        raise fail("supporting_facts", "must be a list of [title, sentence_index] pairs")
    for j, fact in enumerate(facts):
        if not isinstance(fact, (list, tuple)) or len(fact) != 2 or not isinstance(fact[0], str) or not _is_int(fact[1]):
            raise fail(f"supporting_facts[{j}]", f"must be a [title, sentence_index] pair, got {fact!r:.80}")
        if strict:
            if fact[0] not in sentences_of:
                raise fail(f"supporting_facts[{j}]", f"title {fact[0]!r} is not in context")
            if not 0 <= fact[1] < sentences_of[fact[0]]:
                raise fail(f"supporting_facts[{j}]", f"sentence {fact[1]} out of range for {fact[0]!r}")
    for field, allowed in (("type", HOTPOTQA_TYPES), ("level", HOTPOTQA_LEVELS)):
        if field in record:
            if record[field] not in allowed:
                raise fail(field, f"must be one of {list(allowed)}, got {record[field]!r}")
        elif strict:
            raise fail(field, "missing")
    if strict:
        if not record["answer"].strip():
            raise fail("answer", "is empty")
        if not facts:
            raise fail("supporting_facts", "is empty")


def load_hotpotqa(source: str | os.PathLike[str] | Sequence[dict] | None = None, *, strict: bool = False) -> list[dict]:
    """Records from a HotpotQA JSON file (a list; ``.jsonl``: one record a line), a list of
    records, or the builtin synthetic set (``None``). Every record is validated.
    """
    if source is None:
        source = builtin_hotpotqa_path()
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise ProbeDataNotFoundError(f"HotpotQA file not found: {str(path)!r}")
        text = path.read_text(encoding="utf-8")
        try:
            if path.suffix == ".jsonl":
                records = [json.loads(line) for line in text.splitlines() if line.strip()]
            else:
                records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProbeDataError(f"{str(path)!r} is not valid JSON: {exc}") from exc
        if not isinstance(records, list):
            raise ProbeDataError(
                f"{str(path)!r}: expected a JSON list of HotpotQA records, got {type(records).__name__}"
            )
        where = repr(str(path))
    elif isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        records = list(source)
        where = "records"
    else:
        raise TypeError(f"expected a path, a list of records or None, got {type(source).__name__}")
    if not records:
        raise ProbeDataError(f"HotpotQA data {where} is empty")
    for index, record in enumerate(records):
        validate_hotpotqa_record(record, index, strict=strict)
    return records


# -- prompts -----------------------------------------------------------------------------------
@dataclass
class HotpotQAPrompt:
    """A prompt built for one record: its text and ids, and what was cut to make it fit."""

    text: str
    ids: list[int]
    templated: bool  # built with the chat template (carries its own special tokens)
    paragraphs_kept: int
    paragraphs_total: int
    truncated: bool  # gold text had to be cut, not just distractors dropped
    shots: int = 0  # worked examples kept (dropped, last first, after the distractors)


def _render_paragraph(title: str, sentences: Sequence[str]) -> str:
    return f"{title}: " + " ".join(s.strip() for s in sentences if s.strip())


def _turn(context: str, question: str) -> str:
    return f"{context}\n\nQuestion: {question.strip()}"


def _shot_context(record: dict) -> str:
    """A few-shot example's paragraphs: only its supporting sentences, so a shot costs ~60 tokens."""
    facts = {(title, idx) for title, idx in record["supporting_facts"]}
    paragraphs = [
        (title, [s for k, s in enumerate(sentences) if (title, k) in facts])
        for title, sentences in record["context"]
    ]
    return "\n".join(_render_paragraph(t, s) for t, s in paragraphs if s)


def _render(
    tokenizer: Any, question: str, context: str, use_chat_template: bool, shots: Sequence[dict] = ()
) -> tuple[str, list[int], bool]:
    """The prompt text and ids. The instruction comes once (the system turn, or the head of a
    plain prompt), then each shot as a question and its answer, then the question to answer."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        turns: list[dict[str, str]] = []
        for shot in shots:
            turns.append({"role": "user", "content": _turn(_shot_context(shot), shot["question"])})
            turns.append({"role": "assistant", "content": shot["answer"]})
        turns.append({"role": "user", "content": _turn(context, question)})
        try:
            text = tokenizer.apply_chat_template(
                [{"role": "system", "content": INSTRUCTION}, *turns], tokenize=False, add_generation_prompt=True
            )
        except Exception:  # noqa: BLE001 - templates without a system role raise their own errors
            turns[0] = {"role": "user", "content": f"{INSTRUCTION}\n\n{turns[0]['content']}"}
            text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        return text, encode(tokenizer, [text], add_special_tokens=False)[0], True
    demos = "".join(f"{_turn(_shot_context(shot), shot['question'])}\nAnswer: {shot['answer']}\n\n" for shot in shots)
    text = f"{INSTRUCTION}\n\n{demos}{_turn(context, question)}\nAnswer:"
    return text, encode(tokenizer, [text])[0], False


def _shot_kind(record: dict) -> str:
    if record.get("type") == "comparison":
        return "yes/no" if normalize_answer(record["answer"]) in ("yes", "no") else "comparison"
    return "bridge"


def few_shot_examples(k: int, scored: dict | None = None, pool: Sequence[dict] | None = None) -> list[dict]:
    """``k`` worked examples for the prompt, taken from ``pool`` (default: the shipped set), never
    the ``scored`` record itself (same ``_id`` or same question).

    Deterministic: the kinds cycle bridge, yes/no comparison, naming comparison, and each kind's
    examples are taken in the pool's order, so every record of a run sees the same shots unless
    one of them is the record being scored (then the next of that kind stands in).
    """
    if k < 0:
        raise ValueError(f"shots must be >= 0, got {k}")
    if k == 0:
        return []
    pool = load_hotpotqa(None) if pool is None else pool
    skip_ids = {scored["_id"]} if scored is not None else set()
    skip_questions = {normalize_answer(scored["question"])} if scored is not None else set()
    by_kind: dict[str, list[dict]] = {kind: [] for kind in _SHOT_KINDS}
    for record in pool:
        if record["_id"] in skip_ids or normalize_answer(record["question"]) in skip_questions:
            continue
        if record["answer"].strip() and record["supporting_facts"]:
            by_kind[_shot_kind(record)].append(record)
    shots: list[dict] = []
    taken = dict.fromkeys(_SHOT_KINDS, 0)
    kinds = [kind for kind in _SHOT_KINDS if by_kind[kind]]
    while len(shots) < k and kinds:
        for kind in list(kinds):
            if len(shots) == k:
                break
            if taken[kind] < len(by_kind[kind]):
                shots.append(by_kind[kind][taken[kind]])
                taken[kind] += 1
            else:
                kinds.remove(kind)
    if len(shots) < k:
        raise ProbeDataError(f"the few-shot pool has {len(shots)} usable examples, fewer than shots={k}")
    return shots


def build_prompt(
    record: dict,
    tokenizer: Any,
    *,
    max_prompt_tokens: int,
    use_chat_template: bool = True,
    shots: Sequence[dict] = (),
) -> HotpotQAPrompt:
    """The question with its paragraphs, after the worked examples ``shots`` (see
    ``few_shot_examples``; as earlier chat turns with a chat template, else as ``Answer:``
    blocks), cut to ``max_prompt_tokens`` tokens. The shots are never cut.

    What goes first: distractor paragraphs (titles without a supporting fact), last ones
    first; then the worked examples, last first; then the non-supporting sentences of gold
    paragraphs; then the tail of what is left.
    Paragraph order is the record's (the official files interleave gold and distractors).
    """
    gold_titles = {title for title, _ in record["supporting_facts"]}
    facts = {(title, idx) for title, idx in record["supporting_facts"]}
    paragraphs = [(title, list(sentences)) for title, sentences in record["context"]]
    total = len(paragraphs)

    def attempt(paras: list[tuple[str, list[str]]]) -> tuple[str, list[int], bool]:
        context = "\n".join(_render_paragraph(t, s) for t, s in paras)
        return _render(tokenizer, record["question"], context, use_chat_template, shots)

    if any(shot["_id"] == record["_id"] for shot in shots):
        raise ValueError(f"HotpotQA record {record['_id']!r} is among its own few-shot examples")
    shots = list(shots)
    text, ids, templated = attempt(paragraphs)
    while len(ids) > max_prompt_tokens:
        distractors = [i for i, (title, _) in enumerate(paragraphs) if title not in gold_titles]
        if distractors:
            del paragraphs[distractors[-1]]
        elif shots:
            shots.pop()
        else:
            break
        text, ids, templated = attempt(paragraphs)
    truncated = False
    if len(ids) > max_prompt_tokens:
        truncated = True
        paragraphs = [
            (title, [s for k, s in enumerate(sentences) if (title, k) in facts] or sentences[:1])
            for title, sentences in paragraphs
        ]
        text, ids, templated = attempt(paragraphs)
    if len(ids) > max_prompt_tokens:
        context = "\n".join(_render_paragraph(t, s) for t, s in paragraphs)
        _, empty_ids, _ = _render(tokenizer, record["question"], "", use_chat_template, shots)
        room = max_prompt_tokens - len(empty_ids)
        if room <= 0:
            raise ProbeError(
                f"HotpotQA record {record['_id']!r}: the question alone takes {len(empty_ids)} tokens, "
                f"more than the {max_prompt_tokens} available; raise max_length"
            )
        context_ids = encode(tokenizer, [context], add_special_tokens=False)[0]
        while len(ids) > max_prompt_tokens and room > 0:
            cut = tokenizer.decode(context_ids[:room], skip_special_tokens=True)
            text, ids, templated = _render(tokenizer, record["question"], cut, use_chat_template, shots)
            room -= max(len(ids) - max_prompt_tokens, 1)
        if len(ids) > max_prompt_tokens:
            raise ProbeError(
                f"HotpotQA record {record['_id']!r}: cannot fit the prompt in {max_prompt_tokens} tokens; "
                "raise max_length"
            )
    return HotpotQAPrompt(text, ids, templated, len(paragraphs), total, truncated, len(shots))


def answer_ids(tokenizer: Any, prompt: HotpotQAPrompt, answer: str) -> list[int]:
    """Token ids of the gold answer as the model would continue ``prompt`` with it.

    Encoded in context (prompt + answer, minus the prompt's ids) so tokenizers that merge across
    the boundary or add a prefix space (SentencePiece) give the ids the model would produce.
    """
    continuation = answer.strip() if prompt.templated else " " + answer.strip()
    full = encode(tokenizer, [prompt.text + continuation], add_special_tokens=not prompt.templated)[0]
    if full[: len(prompt.ids)] == prompt.ids and len(full) > len(prompt.ids):
        return full[len(prompt.ids) :]
    return encode(tokenizer, [continuation], add_special_tokens=False)[0]


# Lead-ins small instruct models put before the answer ("The answer to this question is: 9,984.",
# "Based on the paragraphs, ...", "Answer: ..."). Stripped repeatedly, so they may be chained.
_LEAD_INS = re.compile(
    r"^(?:"
    r"(?:so|thus|therefore)\s*,?\s+"
    r"|(?:based\s+on|according\s+to|from)\s+the\s+(?:given\s+|provided\s+)?"
    r"(?:paragraphs?|text|context|information|passages?)(?:\s+(?:above|below|provided|given))?\s*,\s*"
    r"|(?:the\s+)?(?:final\s+|short\s+|correct\s+)?answer(?:\s+to\s+(?:this|the|your)\s+question)?"
    r"\s*(?:is|would\s+be|:)\s*:?\s*"
    r"|a\s*:\s*"
    r")",
    re.IGNORECASE,
)
_YES_NO_LEAD = re.compile(r"^(yes|no)\b(?P<rest>.*)$", re.IGNORECASE | re.DOTALL)
_YES_NO_QUESTION = re.compile(
    r"^(?:are|is|was|were|do|does|did|can|could|has|have|had|will|would|should)\b", re.IGNORECASE
)
# Where a first clause ends: a relative or subordinate clause after a comma.
_CLAUSE_END = re.compile(
    r",\s+(?:who|which|that|because|since|as|and|but|while|although|whereas|so)\b", re.IGNORECASE
)
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")


def _first_sentence(text: str) -> str:
    """Up to the first full stop that ends a sentence, not one after an abbreviation
    ("St. Louis", "U.S. Army", "Mr. Smith": a word of at most three letters or with inner dots)."""
    for match in _SENTENCE_END.finditer(text):
        word = text[: match.start()].split()[-1] if text[: match.start()].split() else ""
        if (len(word) > 3 and "." not in word) or word.isdigit():
            return text[: match.start()]
    return text


# "Which was founded first, Steihal Brewery or Bilouth Foundry?": the two options after the last comma.
_CHOICE = re.compile(r",\s*([^,?]+?)\s+or\s+([^,?]+?)\s*\?\s*$", re.IGNORECASE)


def choice_options(question: str) -> tuple[str, str] | None:
    """The two options of a choice question ("Who is older, Annie Morton or Terry Richardson?")."""
    match = _CHOICE.search(question.strip())
    return (match.group(1).strip(), match.group(2).strip()) if match else None


def _pick_option(answer: str, options: tuple[str, str]) -> str:
    """The option a sentence names first ("Bilouth Foundry was founded first" -> "Bilouth Foundry"),
    or the answer unchanged when it names neither."""
    text = f" {normalize_answer(answer)} "
    found = [(text.find(f" {normalize_answer(o)} "), o) for o in options if normalize_answer(o)]
    found = [(at, o) for at, o in found if at >= 0]
    return min(found)[1] if found else answer


def is_yes_no_question(question: str) -> bool:
    """A question answered by yes or no ("Are X and Y both ...?"), not a choice ("Is X or Y ...?")."""
    question = question.strip()
    return bool(_YES_NO_QUESTION.match(question)) and not re.search(r"\bor\b", question, re.IGNORECASE)


def extract_answer(generation: str, question: str | None = None) -> str:
    """The short answer in a generation, for the official EM / F1 (which normalise case,
    punctuation and articles themselves).

    The first line that has something left after lead-ins ("The answer to this question is:",
    "Answer:", "Based on the paragraphs, ...") are stripped; of it, the first sentence, then the
    first clause (cut before ", who ...", ", because ..."). A leading "yes" / "no" is the answer
    when punctuation follows it ("No, Scott Derrickson and Ed Wood ... were not." -> "no"), or,
    for a yes/no ``question``, whatever follows it ("Yes they are" -> "yes"). For a choice
    ``question`` ("Which was founded first, A or B?") a sentence that names an option is that
    option, the first one named ("B was founded first, then A" -> "B").
    """
    for line in generation.splitlines():
        line = line.strip().strip("*_`\"' ")
        previous = None
        while line and line != previous:
            previous = line
            line = _LEAD_INS.sub("", line, count=1).strip().strip("*_`\"' ")
        if not line:
            continue
        lead = _YES_NO_LEAD.match(line)
        if lead is not None:
            rest = lead.group("rest")
            if not rest or rest[0] in ",.!;:" or (question is not None and is_yes_no_question(question)):
                return lead.group(1).lower()
        answer = _first_sentence(line)
        options = choice_options(question) if question is not None else None
        if options is not None:
            picked = _pick_option(answer, options)
            if picked is not answer:
                return picked
        answer = _CLAUSE_END.split(answer, maxsplit=1)[0]
        return answer.strip().rstrip(".!?;:,").strip().strip("*_`\"'").strip()
    return ""


@register()
class HotpotQA(Probe):
    """Multi-hop QA; keys ``hotpotqa.em``, ``hotpotqa.f1``, ``hotpotqa.gold_logprob``.

    ``em`` / ``f1``: official HotpotQA answer metrics of greedy answers, averaged over examples.
    The prompt asks for a short answer and shows ``shots`` worked examples first (default 3: a
    bridge question, a yes/no comparison, a naming comparison; taken from the shipped set with
    only their supporting sentences, never the record being scored; ``shots=0``: none). The
    answer is extracted from at most ``max_new_tokens`` generated tokens by ``extract_answer``
    (first line and clause, lead-ins such as "The answer is:" stripped, a leading yes/no for
    yes/no questions); scoring is the official normalisation, unchanged. ``gold_logprob``: the
    gold answer force-decoded after the prompt, mean log-probability per answer token, averaged
    over examples; at small scale EM is noisy, and this continuous score is what a controller
    acts on. Cost per example: one prefill of the prompt (shared by the forced decoding and the
    greedy answer through the KV cache) plus up to ``max_new_tokens`` one-token steps; prompts
    of the builtin set are ~600 tokens with all ten paragraphs, plus ~100 per shot
    (``max_length`` cuts distractors first, trading difficulty for speed). Examples run one at
    a time: no padding, and on CPU batching long prompts gains little. At most
    ``max_examples`` records are used (evenly spaced); a file with more says so in the log.
    """

    name = "hotpotqa"
    cost_rank = 6
    min_examples = 4

    @classmethod
    def for_preset(cls, tokenizer: Any, *, reference: Any = None, teacher: Any = None) -> HotpotQA:
        # Its fewest examples (min_examples): 4 evenly spaced records of the shipped synthetic set.
        records = load_hotpotqa(None)
        few = [records[i] for i in subsample(len(records), cls.min_examples)]
        return cls(few, tokenizer, max_examples=len(few))

    def __init__(
        self,
        path_or_records: str | os.PathLike[str] | Sequence[dict] | None = None,
        tokenizer: Any = None,
        *,
        every: int | None = DefaultEvery(100),
        on_evaluate: bool = True,
        max_examples: int = 32,
        max_new_tokens: int = 16,
        use_chat_template: bool = True,
        max_length: int | None = None,
        shots: int = DEFAULT_SHOTS,
    ) -> None:
        if tokenizer is None:
            raise TypeError("HotpotQA needs the model's tokenizer: HotpotQA(path, tokenizer)")
        self._init_schedule(every, on_evaluate)
        if max_examples < 1 or max_new_tokens < 1:
            raise ValueError("max_examples and max_new_tokens must be >= 1")
        if not isinstance(shots, int) or isinstance(shots, bool) or shots < 0:
            raise ValueError(f"shots must be an int >= 0, got {shots!r}")
        self.tokenizer = tokenizer
        self.records = load_hotpotqa(path_or_records)
        self.max_examples = max_examples
        self.max_new_tokens = max_new_tokens
        self.use_chat_template = use_chat_template
        self.max_length = max_length
        self.shots = shots
        self._shot_pool = load_hotpotqa(None) if shots else []
        self._prompts: dict[tuple[int, int], tuple[HotpotQAPrompt, list[int]]] = {}
        self.last_predictions: list[tuple[str, str]] = []  # (prediction, gold) of the last measure
        self.last_generations: list[str] = []  # the decoded generations the predictions came from
        if len(self.records) > max_examples:
            logger.warning(
                "hotpotqa: scoring %d of the %d records (evenly spaced; the same ones every time); "
                "pass max_examples=%d to score them all",
                max_examples,
                len(self.records),
                len(self.records),
            )

    @property
    def num_examples(self) -> int:
        return min(len(self.records), self.max_examples)

    def shots_for(self, index: int) -> list[dict]:
        """The worked examples shown before record ``index`` (never that record itself)."""
        return few_shot_examples(self.shots, self.records[index], self._shot_pool)

    def _prompt(self, index: int, context: int) -> tuple[HotpotQAPrompt, list[int]]:
        key = (index, context)
        if key not in self._prompts:
            record = self.records[index]
            gold_len = len(encode(self.tokenizer, [" " + record["answer"]], add_special_tokens=False)[0])
            budget = context - max(self.max_new_tokens, gold_len + 2)
            prompt = build_prompt(
                record,
                self.tokenizer,
                max_prompt_tokens=budget,
                use_chat_template=self.use_chat_template,
                shots=self.shots_for(index),
            )
            if prompt.truncated:
                logger.debug("hotpotqa: record %s cut to fit %d tokens", record["_id"], budget)
            ids = answer_ids(self.tokenizer, prompt, record["answer"])
            self._prompts[key] = (prompt, ids[: context - len(prompt.ids)])
        return self._prompts[key]

    def _measure(self, model: Any, *, max_examples: int | None) -> dict[str, float]:
        limit = self.max_examples if max_examples is None else min(max_examples, self.max_examples)
        indices = self._selection(len(self.records), limit)
        context = self.max_length or min(context_length(model, self.tokenizer), DEFAULT_MAX_PROMPT)
        eos = eos_token_ids(model, self.tokenizer)
        predictions, generations, logprobs = [], [], []
        for i in indices:
            prompt, gold = self._prompt(i, context)
            generated, logprob = generate_and_score(
                model, prompt.ids, gold, max_new_tokens=self.max_new_tokens, eos=eos
            )
            generation = self.tokenizer.decode(generated, skip_special_tokens=True)
            generations.append(generation)
            predictions.append(extract_answer(generation, self.records[i]["question"]))
            if not math.isnan(logprob):
                logprobs.append(logprob)
        if not logprobs:
            raise ProbeDataError("no gold answer has a token: gold_logprob is undefined")
        golds = [self.records[i]["answer"] for i in indices]
        self.last_predictions = list(zip(predictions, golds))
        self.last_generations = generations
        em = sum(exact_match_score(p, g) for p, g in self.last_predictions) / len(indices)
        f1 = sum(f1_score(p, g)[0] for p, g in self.last_predictions) / len(indices)
        return {
            "hotpotqa.em": em,
            "hotpotqa.f1": f1,
            "hotpotqa.gold_logprob": sum(logprobs) / len(logprobs),
        }


def _accepts(model: Any, argument: str) -> bool:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return argument in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return False


def _last_logits(output: Any) -> torch.Tensor:
    logits = getattr(output, "logits", None)
    return (logits if logits is not None else output[0]).float()


def generate_and_score(
    model: Any, prompt: list[int], gold: list[int], *, max_new_tokens: int, eos: Sequence[int]
) -> tuple[list[int], float]:
    """Greedy answer ids and the mean log-probability per gold-answer token, sharing one prefill.

    The prompt is encoded once (one example at a time, so no padding). Its KV cache serves both
    the forced decoding of the gold answer (on a copy) and greedy decoding; with
    ``logits_to_keep`` the vocabulary projection is not computed over the whole prompt. Models
    that return no cache are recomputed from scratch at each step instead (same values).
    """
    device = model_device(model)
    tensor = lambda ids: torch.tensor([list(ids)], dtype=torch.long, device=device)  # noqa: E731
    keep = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}
    out = model(input_ids=tensor(prompt), use_cache=True, **keep)
    cache = getattr(out, "past_key_values", None)
    next_logits = _last_logits(out)[0, -1]

    logprob = math.nan
    if gold:
        if len(gold) == 1:
            gold_logits = next_logits[None]
        elif cache is not None:
            scored = model(input_ids=tensor(gold[:-1]), past_key_values=copy.deepcopy(cache), use_cache=True)
            gold_logits = torch.cat([next_logits[None], _last_logits(scored)[0]])
        else:
            full = model(input_ids=tensor(prompt + gold[:-1]), use_cache=False)
            gold_logits = _last_logits(full)[0, len(prompt) - 1 :]
        logp = F.log_softmax(gold_logits, dim=-1)
        target = torch.tensor(gold, device=logp.device)
        logprob = float(logp.gather(-1, target[:, None]).mean())

    generated: list[int] = []
    for step in range(max_new_tokens):
        token = int(next_logits.argmax())
        if token in eos:
            break
        generated.append(token)
        if step == max_new_tokens - 1:
            break
        if cache is not None:
            out = model(input_ids=tensor([token]), past_key_values=cache, use_cache=True)
            cache = getattr(out, "past_key_values", cache)
        else:
            out = model(input_ids=tensor(prompt + generated), use_cache=False)
        next_logits = _last_logits(out)[0, -1]
    return generated, logprob
