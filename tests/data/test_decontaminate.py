"""Decontamination: exact, near and 13-gram overlaps with an eval file are found and name the eval item."""

from __future__ import annotations

from pathlib import Path

import pytest
from prepare_builders import sentence, write_jsonl

from mydecide.data.decontaminate import EvalIndex, EvalItem, read_eval_jsonl
from mydecide.data.shingles import Shingling

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


SHORT_ITEMS = [
    EvalItem("eval.jsonl", "review", "Strange and beautiful film."),
    EvalItem("eval.jsonl", "intent", "what currency do they use in Chile?"),
    EvalItem("eval.jsonl", "alarm", "set an alarm for 6 pm"),
    EvalItem("eval.jsonl", "lights", "turn the office lights on"),
]


@pytest.mark.parametrize(
    "row, item, method, shared",
    [
        ("Strange and beautiful spying film.", "review", "edit", "one word inserted"),
        ("turn the office Tsai's lights on", "lights", "edit", "one word inserted"),  # a word of two tokens
        ("what currency do use in Chile?", "intent", "edit", "one word left out"),
        ("Strange and beuatiful film.", "review", "edit", "one word misspelt"),
        ("Hi, Strange and beautiful film.\n\nKind regards,\nPriya Shah", "review", "edit", "words around it"),
        ("set an alarm for 6 pm\n\nSent from my iPhone", "alarm", "contained", "set an alarm for 6 pm"),
    ],
)
def test_short_contaminated_rows_are_caught(row: str, item: str, method: str, shared: str) -> None:
    items = [*EVAL, *SHORT_ITEMS]
    # the rows share under 70% of their character 5-grams with the item, and are too short for the 13-gram and
    # the containment of 8+ words: the checks before (short_edits off) miss them
    assert EvalIndex(items, short_edits=False, whole_min_words=8).match([row]) == [None]
    hit = EvalIndex(items, whole_min_words=8).match([row])[0]
    assert hit is not None and (hit.method, hit.item_id, hit.shared) == (method, item, shared)


def test_short_look_alikes_of_eval_items_stay_clean() -> None:
    rows = [
        "set an alarm for 9 pm",  # another slot value
        "set an alarm for 7 pm\n\nSent from my iPhone",  # another slot value, with a sign-off
        "turn the office lights off",  # a switch swapped
        "what currency do they use in Peru?",  # another country
        "what currency do they use in Peru?\n\nThanks, Anna",  # another country, with a sign-off
    ]
    assert EvalIndex([*EVAL, *SHORT_ITEMS], whole_min_words=8).match(rows) == [None] * len(rows)


def test_a_short_item_inside_a_row_counts_unless_the_phrase_is_common() -> None:
    items = [
        *EVAL,
        EvalItem("eval.jsonl", "rare", "But its message is abstinence"),
        EvalItem("eval.jsonl", "common", "thank you so much for your help"),
    ]
    rows = [
        f"{sentence(7, 25)} But its message is abstinence, and {sentence(8, 20)}",
        *(f"{sentence(20 + k, 15)} Thank you so much for your help! {sentence(40 + k, 10)}" for k in range(4)),
    ]
    found = EvalIndex(items, whole_min_words=8).match(rows)
    assert found[0] is not None and (found[0].method, found[0].item_id) == ("contained", "rare")
    assert found[1:] == [None] * 4  # inside four rows: a turn of phrase, not a copied item
    alone = EvalIndex(items, whole_min_words=8).match(rows[:2])  # inside one row only: a copy
    assert alone[1] is not None and alone[1].item_id == "common"
