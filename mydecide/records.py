"""The decision-record schema every stage shares, and its validation errors (documented in docs/records.md).

A record is one state and one typed question with a gold answer or a soft target. Everything downstream
(scoring, training, evaluation, serving) works on :class:`Record` / :class:`Question`, never on raw JSON.
Targets are always stored as a distribution over the question's options (``set`` questions: one P(label applies)
per label), so hard and soft labels flow through the same code.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from mydecide.errors import UserError
from mydecide.jsonl import value_problem
from mydecide.spans import MAX_SPAN_LABELS, Span, grid_target, span_gold

QuestionType = Literal["choice", "noul", "score", "set", "span"]
QUESTION_TYPES: tuple[str, ...] = ("choice", "noul", "score", "set", "span")

MIN_CHOICE_OPTIONS, MAX_CHOICE_OPTIONS = 2, 255
MIN_SCORE_LEVELS, MAX_SCORE_LEVELS = 2, 10
MAX_SET_LABELS = 255
NOUL_OPTIONS = ("yes", "no")
SOFT_TARGET_TOLERANCE = 1e-3


class RecordError(UserError):
    """A record breaks a schema rule. ``str(err)`` names where (``file:line``) and the rule."""

    def __init__(self, rule: str, where: str | None = None):
        self.rule = rule
        self.where = where
        super().__init__(f"{where}: {rule}" if where else rule)

    def at(self, where: str) -> RecordError:
        return RecordError(self.rule, where)


@dataclass(frozen=True)
class Question:
    """A typed question with its options in the order they are shown.

    ``options`` are the ids answers refer to: choice → option ids; noul → ("yes", "no"); score → ("0", …, "n-1");
    set and span → labels. ``descriptions`` is the text shown beside each option ("" when there is none). ``over``
    (span only) names the state part the spans are located in (None: the default, ``spans.state_part``).
    """

    type: QuestionType
    instructions: str
    options: tuple[str, ...]
    descriptions: tuple[str, ...]
    over: str | None = None

    @property
    def k(self) -> int:
        return len(self.options)

    def to_json(self) -> dict[str, Any]:
        """The wire/record form of the question (inverse of :func:`parse_question`)."""
        criteria: Any
        if self.type == "noul":
            yes, no = self.descriptions
            criteria = {"true": yes, "false": no} if (yes or no) else None
        elif self.type == "score":
            criteria = list(self.descriptions)
        else:
            criteria = dict(zip(self.options, self.descriptions, strict=True))
        out = {"type": self.type, "instructions": self.instructions, "criteria": criteria, "over": self.over}
        return {key: value for key, value in out.items() if value is not None}


@dataclass(frozen=True)
class Record:
    """One decision example. ``target`` is a distribution over ``question.options`` (set: P(yes) per label)."""

    task: str
    state: Any
    question: Question
    target: tuple[float, ...]
    id: str = ""
    lang: str = "en"
    soft: bool = False
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    spans: tuple[Span, ...] = ()  # span questions: the gold spans; ``target`` is then their word × label grid

    @property
    def gold_index(self) -> int:
        """Index of the gold option (argmax of the target; first on ties). Not meaningful for ``set``."""
        return max(range(len(self.target)), key=lambda i: (self.target[i], -i))

    def answer_json(self) -> Any:
        """The hard answer in record form (choice: option id; noul: bool; score: level index; set: labels)."""
        q = self.question
        if q.type == "noul":
            return self.target[0] >= 0.5
        if q.type == "score":
            return self.gold_index
        if q.type == "set":
            return [label for label, p in zip(q.options, self.target, strict=True) if p >= 0.5]
        if q.type == "span":
            return [{"label": s.label, "start": s.start, "end": s.end} for s in self.spans]
        return q.options[self.gold_index]

    def target_json(self) -> Any:
        q = self.question
        if q.type == "noul":
            return self.target[0]
        return dict(zip(q.options, self.target, strict=True))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "task": self.task,
            "lang": self.lang,
            "state": self.state,
            "question": self.question.to_json(),
        }
        if self.soft:
            out["target"] = self.target_json()
        else:
            out["answer"] = self.answer_json()
        if self.meta:
            out["meta"] = self.meta
        return out


# --------------------------------------------------------------------------------------------------- parsing


def _check_text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise RecordError(f"{what} must be a non-empty string")
    return value


def _check_state(state: Any) -> Any:
    if isinstance(state, (str, dict)):
        if not (state.strip() if isinstance(state, str) else state):
            raise RecordError(
                "state must not be empty" if isinstance(state, str) else "state must not be an empty object"
            )
        return state
    if isinstance(state, list):
        if not state or not all(isinstance(s, str) for s in state):
            raise RecordError("state given as a list must be a non-empty list of strings")
        return state
    raise RecordError(f"state must be a string, a JSON object or a list of strings, not {type(state).__name__}")


def parse_question(obj: Any, name: str | None = None) -> Question:
    """Validate one question object (record or wire form) and return a :class:`Question`."""
    label = f"question {name!r}" if name else "question"
    if not isinstance(obj, dict):
        raise RecordError(f"{label} must be an object")
    unknown = set(obj) - {"type", "instructions", "criteria", "over"}
    if unknown:
        raise RecordError(f"{label} has unknown key(s) {sorted(unknown)}")
    qtype = obj.get("type")
    if qtype not in QUESTION_TYPES:
        raise RecordError(f"{label}: type {qtype!r} is not one of {list(QUESTION_TYPES)}")
    if obj.get("over") is not None and (qtype != "span" or not isinstance(obj["over"], str) or not obj["over"]):
        raise RecordError(f"{label}: over (a state part's name, a non-empty string) belongs to span questions only")
    instructions = _check_text(obj.get("instructions"), f"{label}: instructions")
    criteria = obj.get("criteria")

    if qtype == "noul":
        if criteria is None:
            return Question("noul", instructions, NOUL_OPTIONS, ("", ""))
        if not isinstance(criteria, dict) or set(criteria) != {"true", "false"}:
            raise RecordError(f'{label}: noul criteria must be absent, null or {{"true": ..., "false": ...}}')
        yes, no = criteria["true"], criteria["false"]
        if not isinstance(yes, str) or not isinstance(no, str):
            raise RecordError(f"{label}: noul criteria texts must be strings")
        return Question("noul", instructions, NOUL_OPTIONS, (yes, no))

    if qtype == "score":
        if not isinstance(criteria, list) or not all(isinstance(c, str) and c.strip() for c in criteria):
            raise RecordError(f"{label}: score criteria must be a list of level descriptions, lowest first")
        if not MIN_SCORE_LEVELS <= (n := len(criteria)) <= MAX_SCORE_LEVELS:
            raise RecordError(f"{label}: score needs {MIN_SCORE_LEVELS} to {MAX_SCORE_LEVELS} levels, got {n}")
        _check_distinct_levels(criteria, label)
        return Question("score", instructions, tuple(str(i) for i in range(len(criteria))), tuple(criteria))

    # choice, set and span: a map id -> description, or (choice, span) a list of ids
    if isinstance(criteria, list) and qtype in ("choice", "span"):
        if not all(isinstance(c, str) and c.strip() for c in criteria):
            raise RecordError(f"{label}: choice options given as a list must be non-empty strings")
        ids, descriptions = list(criteria), [""] * len(criteria)
    elif isinstance(criteria, dict):
        ids, descriptions = list(criteria), list(criteria.values())
        if not all(isinstance(i, str) and i.strip() for i in ids):
            raise RecordError(f"{label}: option ids must be non-empty strings")
        if not all(isinstance(d, str) for d in descriptions):
            raise RecordError(f"{label}: option descriptions must be strings")
    else:
        form = (
            "a map option_id → description or a list of option ids"
            if qtype == "choice"
            else "a map label → description" + (" or a list of labels" if qtype == "span" else "")
        )
        raise RecordError(f"{label}: {qtype} criteria must be {form}")
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        raise RecordError(f"{label}: duplicate option id(s) {dupes}")
    if qtype == "choice" and not MIN_CHOICE_OPTIONS <= len(ids) <= MAX_CHOICE_OPTIONS:
        raise RecordError(f"{label}: choice needs {MIN_CHOICE_OPTIONS} to {MAX_CHOICE_OPTIONS} options, got {len(ids)}")
    if qtype == "set" and not 1 <= len(ids) <= MAX_SET_LABELS:
        raise RecordError(f"{label}: set needs 1 to {MAX_SET_LABELS} labels, got {len(ids)}")
    if qtype == "span" and not 1 <= len(ids) <= MAX_SPAN_LABELS:
        raise RecordError(f"{label}: span needs 1 to {MAX_SPAN_LABELS} labels, got {len(ids)}")
    return Question(qtype, instructions, tuple(ids), tuple(descriptions), obj.get("over"))  # type: ignore[arg-type]


def _check_distinct_levels(levels: list[str], label: str) -> None:
    """Two score levels that read the same (ignoring case and spacing) are one level shown twice: the model cannot
    tell them apart, and a soft target keyed by the level's text would name both."""
    first: dict[str, int] = {}
    for index, level in enumerate(levels):
        seen = first.setdefault(" ".join(level.split()).casefold(), index)
        if seen != index:
            raise RecordError(
                f"{label}: score levels {seen} and {index} are the same text ({levels[seen]!r}, {level!r}); "
                "each level must read differently"
            )


def _probability(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RecordError(f"{what} must be a number in [0, 1]")
    if not 0.0 <= value <= 1.0:
        raise RecordError(f"{what} must be in [0, 1], got {value}")
    return float(value)


def _option_key(q: Question, key: str) -> int:
    """Resolve a target/answer key to an option index (score accepts the level index or the level text)."""
    if key in q.options:
        return q.options.index(key)
    if q.type == "score" and key in q.descriptions:
        return q.descriptions.index(key)
    raise RecordError(f"target key {key!r} is not one of the options {list(q.options)}")


def hard_target(q: Question, answer: Any) -> tuple[float, ...]:
    """The one-hot (set: multi-hot) target for a gold ``answer``."""
    if q.type == "noul":
        if isinstance(answer, str) and answer.strip().lower() in ("true", "yes", "false", "no"):
            answer = answer.strip().lower() in ("true", "yes")
        if not isinstance(answer, bool):
            raise RecordError(f"noul answer must be true or false, got {answer!r}")
        return (1.0, 0.0) if answer else (0.0, 1.0)
    if q.type == "score":
        if isinstance(answer, str) and answer.strip().isdigit():
            answer = int(answer)
        if isinstance(answer, bool) or not isinstance(answer, int):
            raise RecordError(f"score answer must be a level index 0..{q.k - 1}, got {answer!r}")
        if not 0 <= answer < q.k:
            raise RecordError(f"score answer {answer} is outside the levels 0..{q.k - 1}")
        return tuple(1.0 if i == answer else 0.0 for i in range(q.k))
    if q.type == "set":
        if not isinstance(answer, list) or not all(isinstance(a, str) for a in answer):
            raise RecordError("set answer must be a list of labels")
        unknown = [a for a in answer if a not in q.options]
        if unknown:
            raise RecordError(f"set answer label(s) {unknown} are not among the labels {list(q.options)}")
        return tuple(1.0 if label in answer else 0.0 for label in q.options)
    if not isinstance(answer, str) or answer not in q.options:
        raise RecordError(f"answer {answer!r} is not one of the options {list(q.options)}")
    return tuple(1.0 if o == answer else 0.0 for o in q.options)


def soft_target(q: Question, target: Any) -> tuple[float, ...]:
    """A soft label: choice/score → {option: p} summing to 1; noul → P(yes); set → {label: p} independent."""
    if q.type == "noul":
        if isinstance(target, dict):
            raise RecordError("noul target must be a number P(yes)")
        p = _probability(target, "noul target")
        return (p, 1.0 - p)
    if not isinstance(target, dict) or not target:
        raise RecordError(f"{q.type} target must be a non-empty map option → probability")
    values = [0.0] * q.k
    named: dict[int, Any] = {}  # a score level by its text and by its index: one would overwrite the other
    for key, value in target.items():
        if (index := _option_key(q, str(key))) in named:
            raise RecordError(f"target names level {index} twice ({named[index]!r} and {key!r})")
        named[index], values[index] = key, _probability(value, f"target[{key!r}]")
    if q.type == "set":
        missing = [label for label in q.options if label not in target]
        if missing:
            raise RecordError(f"set target must give a probability for every label; missing {missing}")
        return tuple(values)
    total = sum(values)
    if abs(total - 1.0) > SOFT_TARGET_TOLERANCE:
        raise RecordError(f"{q.type} target probabilities must sum to 1, got {total:.4f}")
    if abs(total - 1.0) <= 1e-12:  # already normalised: dividing again drifts by an ulp on every round trip
        return tuple(values)
    return tuple(v / total for v in values)


RECORD_KEYS = {"id", "task", "lang", "state", "question", "answer", "expected", "target", "meta"}
WIRE_KEYS = {"id", "task", "lang", "state", "questions", "expected", "answers", "target", "model", "meta"}


def stable_id(obj: Any) -> str:
    """A short content hash used as id when a record has none (stable across runs and machines)."""
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def parse_record(obj: Any) -> list[Record]:
    """Validate one JSON object; a multi-question wire record is exploded into one record per question.

    Raises :class:`RecordError` naming the rule (the caller adds ``file:line``).
    """
    if not isinstance(obj, dict):
        raise RecordError(f"a record must be a JSON object, not {type(obj).__name__}")
    problem = value_problem(obj)
    if problem is not None:
        raise RecordError(problem)
    if "questions" in obj:
        return _parse_wire_record(obj)
    unknown = set(obj) - RECORD_KEYS
    if unknown:
        raise RecordError(f"unknown key(s) {sorted(unknown)}")
    task = _check_text(obj.get("task"), "task")
    state = _check_state(obj.get("state"))
    lang = obj.get("lang", "en")
    if not isinstance(lang, str) or not lang:
        raise RecordError("lang must be a non-empty string such as 'en'")
    meta = obj.get("meta") or {}
    if not isinstance(meta, dict):
        raise RecordError("meta must be an object")
    question = parse_question(obj.get("question"))
    spans = span_gold(obj, state, question, RecordError) if question.type == "span" else ()
    target, soft = (grid_target(state, question, spans), False) if question.type == "span" else _gold(obj, question)
    if SOFT_TRAIN_TARGET in meta:
        train_target(question, meta[SOFT_TRAIN_TARGET])
    rid = given_id(obj) or stable_id({k: obj.get(k) for k in ("task", "state", "question")})
    return [Record(task, state, question, target, rid, lang, soft, meta, spans)]


SOFT_TRAIN_TARGET = "soft_target"
"""A ``meta`` key: a label distribution for the record's question beside its hard answer (a score text's raters'
levels, say), in the form of ``target``. ``prepare`` trains on it where the data recipe sets ``augment.soft_targets``;
dev and test keep the hard answer, so every metric is still against the gold label."""


def train_target(question: Question, value: Any) -> tuple[float, ...]:
    """``meta.soft_target`` checked and turned into a target (choice, score and noul questions only)."""
    if question.type not in ("choice", "score", "noul"):
        raise RecordError(
            f"meta.{SOFT_TRAIN_TARGET}: only choice, score and noul questions take one, not {question.type}"
        )
    try:
        return soft_target(question, value)
    except RecordError as err:
        raise RecordError(f"meta.{SOFT_TRAIN_TARGET}: {err}") from None


def given_id(obj: dict[str, Any]) -> str | None:
    """The id a row gives itself, as records carry it (a string; an integer as its decimal digits, so ``7`` and
    ``"7"`` are one id), or None when the row has no ``id`` key.

    Only a string or an integer is an id: ``true`` is not 1 and would come out as ``"True"``, and a number with a
    fraction, null, a list or an object would come out as their Python text. An empty or blank string is refused
    too: it is a missing value (a blank cell), and a made-up id would hide that.
    """
    if "id" not in obj:
        return None
    rid = obj["id"]
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise RecordError(f"id must be a string or an integer, not {json_type(rid)}")
    if isinstance(rid, str) and not rid.strip():
        raise RecordError("id must not be empty (leave the key out and an id is made from task, state and question)")
    return str(rid)


def json_type(value: Any) -> str:
    """How JSON names the type of a parsed value (for messages: ``true`` is a boolean, not a bool)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({json.dumps(value)})"
    if isinstance(value, float):
        return f"a number with a fraction or an exponent ({value!r})"
    names = {list: "a list", dict: "an object"}
    return next((name for kind, name in names.items() if isinstance(value, kind)), type(value).__name__)


def _gold(obj: dict[str, Any], question: Question) -> tuple[tuple[float, ...], bool]:
    has_answer = "answer" in obj and obj["answer"] is not None
    has_expected = "expected" in obj and obj["expected"] is not None
    if has_answer and has_expected:
        raise RecordError("give either answer or its alias expected, not both")
    if has_answer or has_expected:
        if "target" in obj and obj["target"] is not None:
            raise RecordError("give either a hard answer or a soft target, not both")
        return hard_target(question, obj["answer" if has_answer else "expected"]), False
    if "target" in obj and obj["target"] is not None:
        return soft_target(question, obj["target"]), True
    raise RecordError("record has no gold label: give answer (or expected) or a soft target")


def _parse_wire_record(obj: dict[str, Any]) -> list[Record]:
    unknown = set(obj) - WIRE_KEYS
    if unknown:
        raise RecordError(f"unknown key(s) {sorted(unknown)}")
    questions = obj["questions"]
    if not isinstance(questions, dict) or not questions:
        raise RecordError("questions must be a non-empty map name → question")
    expected = obj.get("expected", obj.get("answers"))
    targets = obj.get("target")
    if expected is None and targets is None:
        raise RecordError("multi-question record has no expected answers")
    if expected is not None and not isinstance(expected, dict):
        raise RecordError("expected must be a map question name → answer")
    if targets is not None and not isinstance(targets, dict):
        raise RecordError("target must be a map question name → soft target")
    if not isinstance(obj.get("meta") or {}, dict):
        raise RecordError("meta must be an object")
    base_id = given_id(obj) or stable_id({k: obj.get(k) for k in ("task", "state", "questions")})
    records = []
    for name, qobj in questions.items():
        inner: dict[str, Any] = {
            "task": obj.get("task") or name,
            "state": obj.get("state"),
            "lang": obj.get("lang", "en"),
            "question": qobj,
            "id": f"{base_id}:{name}",
            "meta": {**(obj.get("meta") or {}), "question_name": name},
        }
        if expected is not None and name in expected:
            inner["answer"] = expected[name]
        if targets is not None and name in targets:
            inner["target"] = targets[name]  # given with an answer too: parse_record refuses both
        if "answer" not in inner and "target" not in inner:
            raise RecordError(f"question {name!r} has no expected answer")
        try:
            records.extend(parse_record(inner))
        except RecordError as err:
            raise RecordError(f"question {name!r}: {err.rule}") from None
    for key, given in (("expected", expected), ("target", targets)):
        extra = set(given or {}) - set(questions)
        if extra:
            raise RecordError(f"{key} names unknown question(s) {sorted(extra)}")
    return records
