"""Near dedup and decontamination of records whose content is in the question (yes/no trivia, claims, a short state
and a question per record): a copy whose question was edited is found, a record asking another question is kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prepare_builders import NOUL, make, sentence, write_jsonl

from mydecide.config import DataRecipe
from mydecide.data.decontaminate import EvalIndex, EvalItem, read_eval_jsonl
from mydecide.data.lookalikes import small_edit
from mydecide.data.near_dedup import CONTENT_ROWS, Decisions, near_duplicates
from mydecide.data.prepare import prepare

TRIVIA = "Answer from general knowledge."
PASSAGE = sentence(77, 80)


def decisions(pairs: list[tuple[str, str]], kind: str = "noul") -> Decisions:
    return Decisions.of([state for state, _ in pairs], [(kind, question) for _, question in pairs])


def removed(pairs: list[tuple[str, str]]) -> dict[int, int]:
    return {i: m.kept for i, m in near_duplicates([], decisions=decisions(pairs)).items()}


def test_a_question_asked_of_few_records_is_content_and_one_asked_of_many_is_an_instruction() -> None:
    rows = [(sentence(k, 12), "Is a production system down?") for k in range(CONTENT_ROWS + 1)]
    rows += [(sentence(50, 12), "is a production system DOWN")]  # the same instruction, case and "?" aside
    rows += [(TRIVIA, "Is the Nile the longest river in Africa?"), (TRIVIA, "Is Lima the capital of Peru?")]
    found = decisions(rows)
    assert found.content.tolist() == [False] * (CONTENT_ROWS + 2) + [True, True]
    assert len(set(found.groups[: CONTENT_ROWS + 2].tolist())) == 1  # compared with each other, by state
    assert found.groups[-1] == found.groups[-2] != found.groups[0]
    assert found.texts[0] == rows[0][0] and found.texts[-1] == f"{TRIVIA}\nIs Lima the capital of Peru?"
    # another question type is another group
    assert decisions(rows[-2:], "choice").groups.tolist() == [0, 0]


QUESTION = "Is the Nile the longest river in Africa?"


@pytest.mark.parametrize(
    "copy",
    [
        (TRIVIA, "is the nile the longest river in africa"),  # case, and the "?" lost
        (TRIVIA, "Is the Nile really the longest river in Africa?"),  # gained a word
        (TRIVIA, "Is the Nile the longest river in Africa? Answer yes or no."),  # an appended phrase
        ("Answer from general knowledge only.", QUESTION),  # the state edited, the question the same
        ("answer from general knowledge please", "Is the Nile the longest river in africa"),  # both edited
        (PASSAGE, "Is the Nile the longest river in Africa"),  # a long state, the question lost its "?"
        ("Answer from general knowlege.", "Is the Nile the longest river in Africa"),  # a typo in the state
    ],
)
def test_a_copy_with_an_edited_question_is_a_near_duplicate(copy: tuple[str, str]) -> None:
    state = PASSAGE if copy[0] == PASSAGE else TRIVIA
    rows = [(state, QUESTION), (TRIVIA, "Was the Eiffel Tower built before 1900?"), copy]
    assert removed(rows) == {2: 0}


@pytest.mark.parametrize(
    "state, a, b",
    [
        ("The box holds 7 apples.", "Is it above 5?", "Is it above 50?"),  # a number
        (TRIVIA, "Is Lima the capital of Peru?", "Is Lima not the capital of Peru?"),  # a negation
        (TRIVIA, "Is the Nile longer than the Amazon?", "Isn't the Nile longer than the Amazon?"),
        (TRIVIA, "Is Lima the capital of Peru?", "Is Quito the capital of Peru?"),  # a name
        (TRIVIA, "Was the Eiffel Tower built before 1900?", "Was the Eiffel Tower built after 1900?"),  # a word
        (PASSAGE, "Is it above 5?", "Is it above 50?"),  # the same long state
        (PASSAGE, "Who wrote this text?", "When was this text written?"),  # another question about it
    ],
)
def test_records_asking_another_question_about_one_state_are_kept(state: str, a: str, b: str) -> None:
    assert removed([(state, a), (state, b)]) == {}


def test_a_long_question_asked_of_few_records_does_not_merge_their_different_short_states() -> None:
    claim = "Is the following request something our support team can resolve within one working day? " * 3
    rows = [("reset my password", claim), ("close my account forever", claim), ("reset my pasword", claim)]
    assert removed(rows) == {2: 0}  # the typo is a copy; the other request is another decision


def test_records_whose_question_is_an_instruction_are_compared_by_state_as_before() -> None:
    instruction = "Does this text ask for something? " * 6  # a long instruction shared by many rows
    states = ["add milk to my list", "add eggs to my list", "call Anna on speaker", "play jazz in the kitchen"]
    rows = [(s, instruction) for s in states] + [("add milk to my list!", instruction.upper())]
    assert removed(rows) == {4: 0}


def test_small_edits() -> None:
    assert small_edit("Is it above 5?", "is it really above 5")
    assert small_edit("Is Paris in France?", "Is Paris in France? Answer yes or no.")
    assert small_edit("Is Paris in France?", "Is Pariss in France?")  # a typo is not a replaced word
    assert not small_edit("Is it red?", "Is it blue?", replaced=False)
    assert small_edit("Is it red?", "Is it blue?")  # states may have a word replaced
    assert not small_edit("reset my password", "close my account forever")
    assert not small_edit("yes", "no")  # too little is kept


def test_prepare_removes_a_question_edited_copy_and_keeps_the_look_alikes(tmp_path: Path) -> None:
    trivia = [
        ("Is Lima the capital of Peru?", True),
        ("Is the Nile the longest river in Africa?", True),
        ("Was the Eiffel Tower built before 1900?", True),
        ("Is the Amazon above 5000 km long?", True),
    ]
    rows = [make(k, state=TRIVIA, question={**NOUL, "instructions": q}, answer=a) for k, (q, a) in enumerate(trivia)]
    rows += [make(10 + k, question=NOUL) for k in range(20)]  # a shared instruction: compared by state
    rows.append(make(90, state=TRIVIA, question={**NOUL, "instructions": "is lima the capital of peru"}))
    rows.append(make(91, state=TRIVIA, question={**NOUL, "instructions": "Is Quito the capital of Peru?"}))
    rows.append(make(92, state=TRIVIA, question={**NOUL, "instructions": "Is the Amazon above 500 km long?"}))
    rows.append(make(93, state=TRIVIA, question={**NOUL, "instructions": "Is Lima not the capital of Peru?"}))
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    recipe = DataRecipe.model_validate(
        {"sources": [{"kind": "jsonl", "path": str(source)}], "split": {"dev_fraction": 0}}
    )
    manifest = prepare(recipe, tmp_path / "out")
    rejects = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").open(encoding="utf-8")]
    assert [(r["id"], r["step"], r["matched"]["id"]) for r in rejects] == [("r90", "near_dedup", "r0")]
    assert manifest["conservation"]["removed"] == 1


def test_decontamination_finds_an_eval_item_whose_content_is_in_the_question(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "eval.jsonl",
        [
            {"id": "e-nile", "state": TRIVIA, "question": {"type": "noul", "instructions": QUESTION}},
            {"id": "e-lima", "state": TRIVIA, "question": {"type": "noul", "instructions": "Is Lima in Peru?"}},
        ],
    )
    items, _ = read_eval_jsonl(path)
    assert [(i.question, i.type) for i in items] == [(QUESTION, "noul"), ("Is Lima in Peru?", "noul")]
    index = EvalIndex(items)
    rows = [
        (TRIVIA, "is the nile really the longest river in africa"),  # the item, its question edited
        (TRIVIA, "Is Quito in Peru?"),  # a look-alike: another name
        (TRIVIA, "Was the Eiffel Tower built before 1900?"),  # another question with the same state
    ]
    found = index.match(decisions(rows).texts)
    assert [(f.method, f.item_id) if f else None for f in found] == [("near", "e-nile"), None, None]
    # before, only states were compared: the generic state matched every row, whatever its question
    before = EvalIndex([EvalItem(i.file, i.id, i.text) for i in items]).match([state for state, _ in rows])
    assert all(f is not None and f.method == "exact" for f in before)


def test_prepare_decontaminates_a_question_edited_copy_of_an_eval_item(tmp_path: Path) -> None:
    rows = [make(k, question=NOUL) for k in range(10)]
    rows.append(make(50, state=TRIVIA, question={**NOUL, "instructions": "Is the Nile the longest river in Africa"}))
    rows.append(make(51, state=TRIVIA, question={**NOUL, "instructions": "Is the Nile the longest river in Asia?"}))
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    evals = write_jsonl(
        tmp_path / "eval.jsonl",
        [{"id": "e1", "state": TRIVIA, "question": {"type": "noul", "instructions": QUESTION}}],
    )
    recipe = DataRecipe.model_validate(
        {
            "sources": [{"kind": "jsonl", "path": str(source)}],
            "decontaminate_against": [str(evals)],
            "split": {"dev_fraction": 0},
        }
    )
    prepare(recipe, tmp_path / "out")
    rejects = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").open(encoding="utf-8")]
    assert [(r["id"], r["step"], r["matched"]["eval_id"]) for r in rejects] == [("r50", "decontaminate", "e1")]


def test_a_shared_generic_state_and_question_template_are_not_a_13_word_copy_of_another_question() -> None:
    quiz = "General knowledge quiz, round one."
    items = [
        EvalItem("eval.jsonl", "e-flight", quiz, "Is the flight from Austin to Nairobi longer than 8 hours?", "noul")
    ]
    rows = [
        (quiz, "Is the flight from Austin to Nairobi longer than 6 hours?"),  # another number: another question
        (quiz, "is the flight from Austin to Nairobi longer than 8 hours"),  # the item
    ]
    found = EvalIndex(items).match(decisions(rows).texts)
    assert [(f.method, f.item_id) if f else None for f in found] == [None, ("near", "e-flight")]
