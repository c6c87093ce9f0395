"""HotpotQA: official answer metrics, the format and its errors, the shipped set, prompts, the probe."""

from __future__ import annotations

import copy
import json
import math

import pytest

from actuator.agents.probes import (
    HotpotQA,
    HotpotQAFormatError,
    ProbeDataError,
    ProbeDataNotFoundError,
    ProbeError,
    build_prompt,
    builtin_hotpotqa_path,
    exact_match_score,
    f1_score,
    generate_synthetic_hotpotqa,
    load_hotpotqa,
    normalize_answer,
    validate_hotpotqa_record,
)
from actuator.agents.probes import _hotpotqa


# -- official normalisation and metrics ------------------------------------------------------
@pytest.mark.parametrize(
    "raw,normalised",
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  an   apple a day ", "apple day"),
        ("Theatre of the Absurd", "theatre of absurd"),  # articles only as whole words
        ("U.S.A.", "usa"),
        ("rock-n-roll", "rocknroll"),  # punctuation removed, not replaced by a space
        ("A", ""),
    ],
)
def test_normalize_answer(raw, normalised):
    assert normalize_answer(raw) == normalised


def test_exact_match_after_normalisation():
    assert exact_match_score("the Eiffel  tower.", "Eiffel Tower") == 1.0
    assert exact_match_score("Eiffel", "Eiffel Tower") == 0.0


def test_f1_partial_overlap():
    f1, precision, recall = f1_score("Eiffel Tower in Paris", "the Eiffel Tower")
    assert (precision, recall) == (0.5, 1.0)
    assert f1 == pytest.approx(2 / 3)


def test_f1_counts_repeated_tokens_once_per_match():
    f1, precision, recall = f1_score("paris paris", "paris")
    assert (precision, recall) == (0.5, 1.0)


@pytest.mark.parametrize(
    "prediction,gold,f1",
    [
        ("yes", "no", 0.0),
        ("Yes.", "yes", 1.0),
        ("yes it is", "yes", 0.0),  # gold is yes/no and the normalised strings differ: zero
        ("yes", "yes sir", 0.0),  # prediction is yes/no and differs: zero (plain F1 would be 2/3)
        ("noanswer", "Paris", 0.0),
        ("no answer", "noanswer", 0.0),
    ],
)
def test_f1_yes_no_noanswer_as_official(prediction, gold, f1):
    assert f1_score(prediction, gold)[0] == f1


def test_empty_prediction_scores_zero_f1():
    assert f1_score("", "Paris") == (0.0, 0.0, 0.0)
    assert exact_match_score("the", "") == 1.0  # both normalise to "" (as the official script)


# -- the shipped synthetic set -----------------------------------------------------------------
def test_builtin_set_follows_the_official_format():
    path = builtin_hotpotqa_path()
    assert path.is_file() and path.name.endswith(".json")
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(raw, list) and len(raw) >= 50
    for index, record in enumerate(raw):
        validate_hotpotqa_record(record, index, strict=True)
        assert set(record) == {"_id", "question", "answer", "context", "supporting_facts", "type", "level"}
        assert len(record["_id"]) == 24 and int(record["_id"], 16) >= 0
        assert len(record["context"]) == 10
        gold = {title for title, _ in record["supporting_facts"]}
        assert len(gold) == 2  # two hops
        if record["answer"] not in ("yes", "no"):
            # answerable from the gold paragraphs
            gold_text = " ".join(" ".join(s) for t, s in record["context"] if t in gold)
            assert record["answer"].replace(" River", "") in gold_text
    assert {r["type"] for r in raw} == {"bridge", "comparison"}
    assert {"yes", "no"} <= {r["answer"] for r in raw}
    assert len({r["_id"] for r in raw}) == len(raw)


def test_builtin_set_is_what_the_generator_makes():
    assert load_hotpotqa() == generate_synthetic_hotpotqa()
    assert generate_synthetic_hotpotqa(3, 2, seed=7) == generate_synthetic_hotpotqa(3, 2, seed=7)


# -- loading errors ------------------------------------------------------------------------------
@pytest.fixture
def records():
    return copy.deepcopy(load_hotpotqa()[:3])


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ProbeDataNotFoundError, match="nope.json"):
        load_hotpotqa(tmp_path / "nope.json")
    with pytest.raises(FileNotFoundError):
        HotpotQA(tmp_path / "nope.json", object())


def test_empty_and_invalid_files(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    with pytest.raises(ProbeDataError, match="empty"):
        load_hotpotqa(empty)
    broken = tmp_path / "broken.json"
    broken.write_text("[{")
    with pytest.raises(ProbeDataError, match="not valid JSON"):
        load_hotpotqa(broken)
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"data": []}')
    with pytest.raises(ProbeDataError, match="JSON list"):
        load_hotpotqa(wrong)


def test_loads_files_and_jsonl(tmp_path, records):
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(records))
    assert load_hotpotqa(path) == records
    assert load_hotpotqa(str(path)) == records
    lines = tmp_path / "dev.jsonl"
    lines.write_text("\n".join(json.dumps(r) for r in records))
    assert load_hotpotqa(lines) == records


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda r: r.pop("answer"), "answer"),
        (lambda r: r.__setitem__("question", 3), "question"),
        (lambda r: r.__setitem__("context", []), "context"),
        (lambda r: r["context"].__setitem__(4, ["Title only"]), "context[4]"),
        (lambda r: r["context"][2].__setitem__(1, "not a list"), "context[2][1]"),
        (lambda r: r["supporting_facts"].__setitem__(1, ["Title", "0"]), "supporting_facts[1]"),
        (lambda r: r.__setitem__("type", "multi"), "type"),
        (lambda r: r.__setitem__("level", "extreme"), "level"),
    ],
)
def test_malformed_record_names_record_and_field(tmp_path, records, mutate, field):
    mutate(records[2])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(records))
    with pytest.raises(HotpotQAFormatError) as info:
        load_hotpotqa(path)
    assert info.value.index == 2 and info.value.field == field
    assert "record 2" in str(info.value) and records[2]["_id"] in str(info.value) and repr(field) in str(info.value)


def test_strict_validation_checks_supporting_facts_point_into_context(records):
    records[0]["supporting_facts"][0] = ["No Such Title", 0]
    load_hotpotqa(records)  # official files have such quirks: loading tolerates them
    with pytest.raises(HotpotQAFormatError, match="not in context"):
        load_hotpotqa(records, strict=True)


def test_type_and_level_are_optional_when_loading(records):
    for record in records:
        del record["type"], record["level"]
    assert len(load_hotpotqa(records)) == 3


# -- prompts ---------------------------------------------------------------------------------
def _gold_titles(record):
    return {title for title, _ in record["supporting_facts"]}


def test_prompt_keeps_everything_when_it_fits(char_tokenizer, records):
    prompt = build_prompt(records[0], char_tokenizer, max_prompt_tokens=100_000, use_chat_template=False)
    assert prompt.paragraphs_kept == prompt.paragraphs_total == 10 and not prompt.templated
    assert all(title in prompt.text for title, _ in records[0]["context"])
    assert prompt.text.endswith("Answer:") and len(prompt.ids) == len(char_tokenizer(prompt.text).input_ids)


def test_prompt_drops_distractors_before_gold(char_tokenizer, records):
    record = records[0]
    full = build_prompt(record, char_tokenizer, max_prompt_tokens=100_000, use_chat_template=False)
    budget = len(full.ids) - 300  # a bit more than two paragraphs' worth of characters
    prompt = build_prompt(record, char_tokenizer, max_prompt_tokens=budget, use_chat_template=False)
    assert len(prompt.ids) <= budget and 2 <= prompt.paragraphs_kept < 10 and not prompt.truncated
    for title in _gold_titles(record):
        assert title in prompt.text
    assert record["question"] in prompt.text


def test_prompt_cuts_gold_text_last(char_tokenizer, records):
    record = records[1]
    prompt = build_prompt(record, char_tokenizer, max_prompt_tokens=330, use_chat_template=False)
    assert len(prompt.ids) <= 330 and prompt.truncated and prompt.paragraphs_kept == 2
    assert record["question"] in prompt.text
    with pytest.raises(ProbeError, match="raise max_length"):
        build_prompt(record, char_tokenizer, max_prompt_tokens=20, use_chat_template=False)


def test_prompt_uses_the_chat_template(chat_tokenizer, records):
    prompt = build_prompt(records[0], chat_tokenizer, max_prompt_tokens=100_000)
    # the instruction is the system turn, the question the one user turn
    assert prompt.templated and prompt.text.startswith("<system>Answer the question") and prompt.text.endswith("<assistant>")
    assert prompt.text.count("<user>") == 1
    # the template's text is tokenised without adding a second BOS
    assert prompt.ids == chat_tokenizer(prompt.text, add_special_tokens=False).input_ids


def test_gold_answer_ids_follow_the_prompt(char_tokenizer, chat_tokenizer, records):
    for tokenizer, prefix in ((char_tokenizer, " "), (chat_tokenizer, "")):
        prompt = build_prompt(records[0], tokenizer, max_prompt_tokens=100_000, use_chat_template=True)
        ids = _hotpotqa.answer_ids(tokenizer, prompt, records[0]["answer"])
        assert tokenizer.decode(ids) == prefix + records[0]["answer"]


@pytest.mark.parametrize(
    "generation,answer",
    [
        ("Paris\nThe question asks", "Paris"),
        ("\n Answer: Paris.", "Paris"),
        ("The answer is yes", "yes"),
        ("", ""),
        ("\n\n", ""),
        # SmolLM2-135M-Instruct's answers on real dev-distractor records (issue 18)
        ("No, Scott Derrickson and Ed Wood of the same nationality were not.", "no"),
        ("The answer to this question is: 9,984.", "9,984"),
        # lead-ins, chained or alone on their line; the first sentence and clause
        ("Based on the paragraphs, the answer is Greenwich Village, New York City.", "Greenwich Village, New York City"),
        ("The answer is:\nChief of Protocol", "Chief of Protocol"),
        ("Terry Richardson, who was born in 1965.", "Terry Richardson"),
        ("**YG Entertainment**. The group was formed in 2013.", "YG Entertainment"),
        ("U.S. Army. It was founded in 1775.", "U.S. Army"),  # not cut after an abbreviation
        ("St. Louis", "St. Louis"),
        ("Yes.", "yes"),
        ("No Doubt", "No Doubt"),  # a band, not a "no": nothing marks it as a yes/no answer
    ],
)
def test_extract_answer(generation, answer):
    assert _hotpotqa.extract_answer(generation) == answer


def test_extract_answer_maps_the_yes_no_lead_of_yes_no_questions_only():
    yes_no = "Are Local H and For Against both from the United States?"
    assert _hotpotqa.extract_answer("Yes they are both American bands", yes_no) == "yes"
    assert _hotpotqa.extract_answer("no they are not", "Were X and Y of the same nationality?") == "no"
    # a choice between two names is not a yes/no question
    choice = "Is Local H or For Against older?"
    assert _hotpotqa.extract_answer("No Doubt is older", choice) == "No Doubt is older"
    assert _hotpotqa.extract_answer("Yes they are both American bands", None) == "Yes they are both American bands"
    assert _hotpotqa.is_yes_no_question(yes_no) and not _hotpotqa.is_yes_no_question(choice)
    assert not _hotpotqa.is_yes_no_question("Who is older, Annie Morton or Terry Richardson?")


@pytest.mark.parametrize(
    "generation,question,answer",
    [
        ("Bilouth Foundry was founded first. It was established by Gousim",
         "Which was founded first, Steihal Brewery or Bilouth Foundry?", "Bilouth Foundry"),
        ("terry Richardson is older than shirley temple", "Who is older, Annie Morton or Terry Richardson?",
         "Terry Richardson"),
        # both named: the first one named is the answer
        ("Heikai has a larger population than Tosten", "Which city has a larger population, Tosten or Heikai?",
         "Heikai"),
        # neither named: the extracted sentence as it is
        ("Pkaem Brewery was founded first", "Which was founded first, Dremer Press or Pakum Brewery?",
         "Pkaem Brewery was founded first"),
    ],
)
def test_extract_answer_names_the_option_of_a_choice_question(generation, question, answer):
    assert _hotpotqa.extract_answer(generation, question) == answer


def test_choice_options():
    assert _hotpotqa.choice_options("Who is older, Annie Morton or Terry Richardson?") == ("Annie Morton", "Terry Richardson")
    assert _hotpotqa.choice_options("Are Local H and For Against both from the United States?") is None
    assert _hotpotqa.choice_options("Is Local H or For Against older?") is None  # no comma: not parsed


def test_extraction_lifts_the_official_scores_of_the_reported_answers():
    """The metric stays the official one: extraction only hands it the answer inside the sentence."""
    reported = [
        ("No, Scott Derrickson and Ed Wood of the same nationality were not.", "no"),
        ("The answer to this question is: 9,984.", "9,984"),
    ]
    assert sum(exact_match_score(raw, gold) for raw, gold in reported) == 0.0
    assert all(exact_match_score(_hotpotqa.extract_answer(raw), gold) == 1.0 for raw, gold in reported)


# -- few-shot examples -------------------------------------------------------------------------
def test_few_shot_examples_cover_the_three_answer_shapes():
    shots = _hotpotqa.few_shot_examples(3)
    assert [s["type"] for s in shots] == ["bridge", "comparison", "comparison"]
    assert shots[1]["answer"] in ("yes", "no") and shots[2]["answer"] not in ("yes", "no")
    assert _hotpotqa.few_shot_examples(0) == []
    with pytest.raises(ValueError, match="shots"):
        _hotpotqa.few_shot_examples(-1)
    with pytest.raises(ProbeDataError, match="fewer than shots=4"):
        _hotpotqa.few_shot_examples(4, pool=shots[:3])


def test_few_shot_examples_never_include_the_scored_record(char_tokenizer):
    shipped = load_hotpotqa()
    default = _hotpotqa.few_shot_examples(3)
    probe = HotpotQA(None, char_tokenizer, max_examples=len(shipped), shots=3)
    replaced = 0
    for index, record in enumerate(shipped):
        shots = probe.shots_for(index)
        assert len(shots) == 3
        assert record["_id"] not in {s["_id"] for s in shots}
        assert normalize_answer(record["question"]) not in {normalize_answer(s["question"]) for s in shots}
        replaced += shots != default
        prompt, _ = probe._prompt(index, 100_000)
        # the scored question appears once (its own turn), never as a worked example
        assert prompt.text.count(record["question"]) == 1
        assert prompt.text.rindex(record["question"]) > max(prompt.text.index(s["question"]) for s in shots)
    assert replaced == 3  # each default shot is itself scored once, and then replaced
    # a copy of a shot under another id is still recognised by its question
    twin = copy.deepcopy(default[0])
    twin["_id"] = "f" * 24
    assert default[0]["question"] not in {s["question"] for s in _hotpotqa.few_shot_examples(3, twin)}
    with pytest.raises(ValueError, match="among its own few-shot examples"):
        build_prompt(default[0], char_tokenizer, max_prompt_tokens=100_000, shots=default)


def test_shots_zero_is_the_plain_prompt(char_tokenizer, records):
    plain = HotpotQA(records, char_tokenizer, shots=0)._prompt(0, 100_000)[0]
    shot = HotpotQA(records, char_tokenizer)._prompt(0, 100_000)[0]
    assert plain.text == build_prompt(records[0], char_tokenizer, max_prompt_tokens=100_000).text
    assert "Answer:" not in plain.text[: plain.text.index("Question:")]
    assert shot.text.count("\nAnswer: ") == 3 and shot.text.endswith(plain.text[plain.text.index(records[0]["context"][0][0]):])
    with pytest.raises(ValueError, match="shots"):
        HotpotQA(records, char_tokenizer, shots=-1)


def test_max_examples_says_when_it_subsamples(char_tokenizer, caplog):
    with caplog.at_level("WARNING", logger="actuator.agents"):
        HotpotQA(None, char_tokenizer, max_examples=32)
    assert "scoring 32 of the 80 records" in caplog.text and "max_examples=80" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="actuator.agents"):
        HotpotQA(None, char_tokenizer, max_examples=80)
    assert "scoring" not in caplog.text


# -- the probe -------------------------------------------------------------------------------
def test_probe_on_a_tiny_model_gives_finite_values(tiny_model, chat_tokenizer):
    probe = HotpotQA(None, chat_tokenizer, max_examples=4, max_new_tokens=4, max_length=256)
    tiny_model.train()
    values = probe.measure(tiny_model)
    assert set(values) == {"hotpotqa.em", "hotpotqa.f1", "hotpotqa.gold_logprob"}
    assert 0.0 <= values["hotpotqa.em"] <= values["hotpotqa.f1"] + 1e-12 <= 1.0 + 1e-12
    assert math.isfinite(values["hotpotqa.gold_logprob"]) and values["hotpotqa.gold_logprob"] < 0
    assert len(probe.last_predictions) == 4 and tiny_model.training


def test_uniform_model_gold_logprob_is_minus_log_vocab(fixed_lm, char_tokenizer):
    import torch

    probe = HotpotQA(None, char_tokenizer, max_examples=3, max_new_tokens=2, max_length=2048)
    values = probe.measure(fixed_lm(torch.zeros(128)))
    assert values["hotpotqa.gold_logprob"] == pytest.approx(-math.log(128), rel=1e-6)


def test_em_and_f1_of_perfect_and_partial_answers(monkeypatch, fixed_lm, char_tokenizer, records):
    import torch

    probe = HotpotQA(records, char_tokenizer, max_new_tokens=2, max_length=4096)
    golds = [r["answer"] for r in records]

    def answers(replies):
        replies = iter(replies)
        return lambda model, prompt, gold, **kwargs: (
            char_tokenizer(next(replies), add_special_tokens=False).input_ids,
            -1.0,
        )

    monkeypatch.setattr(_hotpotqa, "generate_and_score", answers([f"The {g}." for g in golds]))
    values = probe.measure(fixed_lm(torch.zeros(128)))
    assert values == {"hotpotqa.em": 1.0, "hotpotqa.f1": 1.0, "hotpotqa.gold_logprob": -1.0}
    monkeypatch.setattr(_hotpotqa, "generate_and_score", answers([golds[0], "wrong", "noanswer"]))
    values = probe.measure(fixed_lm(torch.zeros(128)))
    assert values["hotpotqa.em"] == pytest.approx(1 / 3) and values["hotpotqa.f1"] == pytest.approx(1 / 3)


def test_shared_prefill_matches_generate_and_a_full_forward(tiny_model, char_tokenizer, table_lm):
    import torch

    from actuator.agents.probes import _common

    prompt = char_tokenizer("Question: where? Answer:").input_ids
    gold = char_tokenizer(" Tor Osk", add_special_tokens=False).input_ids
    for model in (tiny_model, table_lm(torch.randn(128, 128, generator=torch.Generator().manual_seed(0)))):
        with torch.no_grad():
            generated, logprob = _hotpotqa.generate_and_score(model, prompt, gold, max_new_tokens=6, eos=[2])
            expected = _common.greedy_generate(model, char_tokenizer, [prompt], max_new_tokens=6, batch_size=1)
            logits = model(input_ids=torch.tensor([prompt + gold])).logits[0, len(prompt) - 1 : -1]
        assert char_tokenizer.decode(generated, skip_special_tokens=True).strip() == expected[0]
        by_hand = torch.log_softmax(logits.double(), -1)[torch.arange(len(gold)), torch.tensor(gold)].mean()
        assert logprob == pytest.approx(float(by_hand), rel=1e-5)


def test_probe_caps_examples(char_tokenizer):
    probe = HotpotQA(None, char_tokenizer, max_examples=5)
    assert probe.num_examples == 5
    with pytest.raises(TypeError, match="tokenizer"):
        HotpotQA()


def test_prompt_drops_distractors_then_shots_before_gold(char_tokenizer, records):
    shots = _hotpotqa.few_shot_examples(3, records[0])
    full = build_prompt(records[0], char_tokenizer, max_prompt_tokens=100_000, use_chat_template=False, shots=shots)
    assert full.shots == 3 and full.paragraphs_kept == 10
    gold_only = [p for p in records[0]["context"] if p[0] in _gold_titles(records[0])]
    # exactly the room of the gold paragraphs without shots: every distractor and every shot must go
    budget = len(build_prompt(dict(records[0], context=gold_only), char_tokenizer, max_prompt_tokens=100_000,
                              use_chat_template=False).ids)
    prompt = build_prompt(records[0], char_tokenizer, max_prompt_tokens=budget, use_chat_template=False, shots=shots)
    assert prompt.shots == 0 and prompt.paragraphs_kept == len(gold_only) and not prompt.truncated
    one_shot = len(build_prompt(dict(records[0], context=gold_only), char_tokenizer, max_prompt_tokens=100_000,
                                use_chat_template=False, shots=shots[:1]).ids)
    prompt = build_prompt(records[0], char_tokenizer, max_prompt_tokens=one_shot, use_chat_template=False, shots=shots)
    assert prompt.shots == 1 and prompt.paragraphs_kept == len(gold_only)
    assert shots[0]["question"] in prompt.text and shots[1]["question"] not in prompt.text
