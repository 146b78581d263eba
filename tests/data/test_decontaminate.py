"""Decontamination: exact, near and 13-gram overlaps with an eval file are found and name the eval item."""

from __future__ import annotations

from pathlib import Path

import pytest
from prepare_builders import sentence, write_jsonl

from mydecide.data.decontaminate import EvalIndex, EvalItem, read_eval_jsonl
from mydecide.data.dedup import Shingling

EVAL = [EvalItem("eval.jsonl", f"e{i}", sentence(100 + i, 40)) for i in range(5)]


def test_each_check_reports_the_matched_eval_item() -> None:
    near = EVAL[1].text.split()
    near[20] = "changed"  # one edit in 40 words: Jaccard 31/41 ≈ 0.76
    passage = EVAL[2].text.split()[10:23]  # 13 words of item e2 inside an otherwise new text
    texts = [
        "  " + EVAL[0].text.upper() + " ",  # exact after normalisation
        " ".join(near),
        sentence(1, 30) + " " + " ".join(passage) + " " + sentence(2, 30),
        sentence(3, 40),  # clean
    ]
    found = EvalIndex(EVAL, threshold=0.7).match(texts)
    assert [(f.method, f.item_id) if f else None for f in found] == [
        ("exact", "e0"),
        ("near", "e1"),
        ("ngram", "e2"),
        None,
    ]
    assert found[1] is not None and 0.7 <= (found[1].similarity or 0) < 1.0
    assert found[2] is not None and found[2].shared == " ".join(passage).lower()
    assert found[0] is not None and found[0].to_json() == {
        "method": "exact",
        "eval_file": "eval.jsonl",
        "eval_id": "e0",
    }


def test_twelve_shared_words_are_not_a_13gram_overlap() -> None:
    passage = EVAL[3].text.split()[5:17]  # 12 words only
    text = sentence(4, 30) + " " + " ".join(passage) + " " + sentence(5, 30)
    assert EvalIndex(EVAL, exact=False, near=False).match([text]) == [None]
    longer = sentence(4, 30) + " " + " ".join(EVAL[3].text.split()[5:18]) + " " + sentence(5, 30)
    hit = EvalIndex(EVAL, exact=False, near=False).match([longer])[0]
    assert hit is not None and (hit.method, hit.item_id) == ("ngram", "e3")


def test_checks_can_be_turned_off() -> None:
    index = EvalIndex(EVAL, exact=False, near=False, overlap_words=0)
    assert index.match([EVAL[0].text]) == [None]


def test_read_eval_jsonl_takes_states_and_ids_and_lists_unusable_lines(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "lockbox.jsonl",
        [
            {"id": "case-1", "state": "first state", "questions": {}},
            {"state": ["a", "list", "state"]},
            "{not json",
            {"id": "x", "question": {}},
        ],
    )
    items, problems = read_eval_jsonl(path)
    assert [(i.id, i.text) for i in items] == [("case-1", "first state"), ("lockbox.jsonl:2", "a\nlist\nstate")]
    assert [p.split(":")[:2] for p in problems] == [["lockbox.jsonl", "3"], ["lockbox.jsonl", "4"]]
    with pytest.raises(FileNotFoundError, match=r"missing\.jsonl"):
        read_eval_jsonl(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="no eval item"):
        read_eval_jsonl(write_jsonl(tmp_path / "empty.jsonl", [{"id": 1}]))


def test_short_contaminated_texts_are_found() -> None:
    items = [
        *EVAL,
        EvalItem("eval.jsonl", "short", "the checkout page crashes when I pay with a gift card"),
        EvalItem("eval.jsonl", "alarm", "set an alarm for 7 am"),
    ]
    texts = [
        "The checkout page crashes when I pay with a giftcard!",  # an edited copy of an 11-word item
        "Hi all, quick one: the checkout page crashes when I pay with a gift card. It started after the "
        "release on Monday and blocks every order paid that way. Thanks, Anna",  # inside a longer text
        "set an alarm for 9 pm",
    ]  # a look-alike with another slot value: clean
    # word 5-gram shingles and the 13-gram check alone (the defaults before) find neither
    before = EvalIndex(items, shingling=Shingling("word", 5), threshold=0.8, whole_min_words=0).match(texts)
    assert before == [None, None, None]
    found = EvalIndex(items).match(texts)
    assert [(f.method, f.item_id) if f else None for f in found] == [("near", "short"), ("contained", "short"), None]
    assert found[1] is not None and found[1].shared == "the checkout page crashes when i pay with a gift card"
