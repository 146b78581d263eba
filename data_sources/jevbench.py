"""JevBench cases (System One wire format): one record per question of each case, with its gold answer.

A JevBench case file (``cases.jsonl``, as shipped in the ``jevbench`` package's suites and written by
``jevbench datagen``) holds one case per line: ``{"id", "state", "questions": {key: {"type", "instructions",
"criteria"}}, "domain", "source", ...}``. Its gold answers are kept apart, in ``gold.jsonl`` (``{"id", "gold":
{key: answer}}``, answers ``true``/``false`` for a noul, an option key for a choice, a level index for a
score, or ``"unknown"`` when the text does not settle the question); give that file with the ``gold`` option.
A case may also carry its answers inline as ``expected`` (or ``gold``): ``{key: answer}``, as wire-format
records do.

Each question becomes one record: task ``jevbench_<domain>``, id ``jevbench-<case id>-<question key>``, lang
``en``, meta ``{"case", "question_key", "domain"}``; all questions of a case share its line in ``_where``. A
question without a gold answer, with an ``unknown`` one, or with one that is not among its options is an error
row (counted, never dropped silently). The public suites ship without gold answers, so on them every question
is such a row: they are for decontamination and coherence tests, not for training. With no path the cases of
``suite`` (default ``jevbench-240``) are read from an installed ``jevbench`` package.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from data_sources._files import Row, capped, error_row, existing, iter_jsonl, package_file

UNKNOWN = ("unknown", "__unknown__")


def read_gold(path: str) -> dict[str, dict[str, Any]]:
    """``{case id: {question key: answer}}`` from a JevBench ``gold.jsonl``; ValueError naming file:line."""
    gold: dict[str, dict[str, Any]] = {}
    for where, row, error in iter_jsonl(existing(path)):
        if error is not None:
            raise ValueError(f"{where}: {error}")
        if "id" not in row or not isinstance(row.get("gold"), dict):
            raise ValueError(f"{where}: a gold line needs 'id' and a 'gold' object {{question key: answer}}")
        gold[str(row["id"])] = row["gold"]
    return gold


def suite_cases(suite: str) -> Path:
    """The ``cases.jsonl`` of a suite of the installed ``jevbench`` package (FileNotFoundError otherwise)."""
    if package_file("jevbench", "__init__.py") is None:
        raise FileNotFoundError("the jevbench source needs a path: the jevbench package is not installed")
    path = package_file("jevbench", f"suites/{suite}/cases.jsonl")
    if path is None:
        raise FileNotFoundError(f"the installed jevbench package has no suite {suite!r} (no cases.jsonl)")
    return path


def answer_of(question: Mapping[str, Any], value: Any) -> Any:
    """A gold value checked against its question (ValueError naming the rule); noul → bool, score → index."""
    qtype = question.get("type")
    criteria = question.get("criteria")
    if isinstance(value, str) and value in UNKNOWN:
        raise ValueError("gold answer is 'unknown': the text does not settle the question")
    if qtype == "noul":
        if isinstance(value, bool):
            return value
        raise ValueError(f"noul gold answer must be true or false, got {value!r}")
    if qtype == "score":
        levels = criteria if isinstance(criteria, list) else []
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(levels):
            return value
        raise ValueError(f"score gold answer must be a level index 0..{len(levels) - 1}, got {value!r}")
    if qtype == "choice":
        if isinstance(criteria, Mapping) and value in criteria:
            return value
        raise ValueError(f"choice gold answer {value!r} is not one of the options {list(criteria or [])}")
    raise ValueError(f"question type {qtype!r} is not noul, choice or score")


def _records(rows: Iterable[Row], gold: Mapping[str, Mapping[str, Any]]) -> Iterator[dict[str, Any]]:
    for where, case, error in rows:
        if error is not None:
            yield error_row(where, error, case)
            continue
        questions = case.get("questions")
        if "id" not in case or "state" not in case or not isinstance(questions, dict) or not questions:
            yield error_row(where, "a case needs 'id', 'state' and a non-empty 'questions' object", case)
            continue
        case_id, domain = str(case["id"]), str(case.get("domain") or "cases")
        answers = case.get("expected") or case.get("gold") or gold.get(case_id) or {}
        for key, question in questions.items():
            raw = {"case": case_id, "question_key": key, "question": question, "gold": answers.get(key)}
            if not isinstance(question, dict):
                yield error_row(where, f"question {key!r} is not an object", raw)
                continue
            if key not in answers:
                yield error_row(where, f"question {key!r} has no gold answer (give the gold.jsonl file)", raw)
                continue
            try:
                answer = answer_of(question, answers[key])
            except ValueError as err:
                yield error_row(where, f"question {key!r}: {err}", raw)
                continue
            yield {
                "id": f"jevbench-{case_id}-{key}",
                "task": f"jevbench_{domain}",
                "lang": "en",
                "state": case["state"],
                "question": dict(question),
                "answer": answer,
                "meta": {"case": case_id, "question_key": key, "domain": domain},
                "_where": where,
            }


def convert(
    path: str | None = None,
    *,
    limit: int | None = None,
    seed: int = 13,
    gold: str | None = None,
    suite: str = "jevbench-240",
) -> Iterator[dict[str, Any]]:
    """Yield one record (or error row) per question of every case in ``path`` (no randomness)."""
    cases = suite_cases(suite) if path is None else existing(path)
    answers = read_gold(gold) if gold is not None else {}
    return capped(_records(iter_jsonl(cases), answers), limit)
