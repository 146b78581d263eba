"""Jev ``/v1/systemone`` requests and responses (SPEC §8), shared by ``predict`` and ``serve``.

``parse_request`` validates a request body and names the question and the rule on any problem;
``answer_request`` scores every question of one request (sharing the state's computation) and builds the response.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mydecide.prompting import MAX_LETTER_OPTIONS
from mydecide.records import (
    MAX_SCORE_LEVELS,
    MIN_CHOICE_OPTIONS,
    MIN_SCORE_LEVELS,
    Question,
    RecordError,
    parse_question,
)

if TYPE_CHECKING:
    import numpy as np

    from mydecide.modeling import LoadedModel

TemperatureFn = Callable[[str, int], float]


class RequestError(ValueError):
    """A malformed request; the message names the question (when there is one) and the rule."""


@dataclass(frozen=True)
class Limits:
    """Configurable request limits (documented in the README)."""

    max_questions: int = 32
    max_state_chars: int = 100_000
    max_body_bytes: int = 1_000_000
    min_choice_options: int = MIN_CHOICE_OPTIONS
    max_choice_options: int = MAX_LETTER_OPTIONS  # 26 until more than 26 options are supported
    min_score_levels: int = MIN_SCORE_LEVELS
    max_score_levels: int = MAX_SCORE_LEVELS


@dataclass(frozen=True)
class Request:
    model: str
    state: Any
    questions: dict[str, Question]


def state_size(state: Any) -> int:
    import json

    return len(state) if isinstance(state, str) else len(json.dumps(state, ensure_ascii=False))


def parse_request(body: Any, limits: Limits = Limits()) -> Request:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    unknown = set(body) - {"model", "state", "questions"}
    if unknown:
        raise RequestError(f"unknown top-level key(s) {sorted(unknown)}")
    model = body.get("model", "")
    if not isinstance(model, str):
        raise RequestError("model must be a string")
    state = body.get("state")
    if state is None:
        raise RequestError("state is required")
    if isinstance(state, str):
        if not state.strip():
            raise RequestError("state must not be empty")
    elif isinstance(state, list):
        if not state or not all(isinstance(s, str) for s in state):
            raise RequestError("state given as a list must be a non-empty list of strings")
    elif not isinstance(state, dict) or not state:
        raise RequestError("state must be a non-empty string, JSON object or list of strings")
    if state_size(state) > limits.max_state_chars:
        raise RequestError(f"state is longer than the limit of {limits.max_state_chars} characters")
    questions = body.get("questions")
    if not isinstance(questions, dict) or not questions:
        raise RequestError("questions must be a non-empty object mapping a name to a question")
    if len(questions) > limits.max_questions:
        raise RequestError(f"{len(questions)} questions exceed the limit of {limits.max_questions} per request")
    parsed: dict[str, Question] = {}
    for name, obj in questions.items():
        if not name.strip():
            raise RequestError("question names must be non-empty")
        try:
            question = parse_question(obj, name)
        except RecordError as err:
            raise RequestError(str(err)) from None
        if question.type == "choice" and not limits.min_choice_options <= question.k <= limits.max_choice_options:
            raise RequestError(f"question {name!r}: choice needs {limits.min_choice_options} to "
                               f"{limits.max_choice_options} options on this server, got {question.k}")
        if question.type == "score" and not limits.min_score_levels <= question.k <= limits.max_score_levels:
            raise RequestError(f"question {name!r}: score needs {limits.min_score_levels} to "
                               f"{limits.max_score_levels} levels on this server, got {question.k}")
        parsed[name] = question
    return Request(model, state, parsed)


def jev_confidence(p_max: float, k: int) -> float:
    """Jev's confidence: (K·p_max − 1)/(K − 1), 0 at the uniform distribution and 1 at certainty."""
    return (k * p_max - 1.0) / (k - 1.0)


def build_answer(question: Question, probs: np.ndarray) -> dict[str, Any]:
    """The Jev answer object for one question from its probabilities (canonical option order)."""
    p = [float(x) for x in probs]
    if question.type == "noul":
        return {"type": "noul", "noul": p[0]}
    if question.type == "set":
        probabilities = dict(zip(question.options, p, strict=True))
        return {"type": "set", "probabilities": probabilities,
                "selected": [label for label, v in probabilities.items() if v >= 0.5]}
    best = max(range(len(p)), key=p.__getitem__)
    confidence = jev_confidence(p[best], len(p))
    if question.type == "score":
        return {"type": "score", "score": sum(i * v for i, v in enumerate(p)), "confidence": confidence,
                "probabilities": {str(i): v for i, v in enumerate(p)},
                "legend": {str(i): d for i, d in enumerate(question.descriptions)}}
    return {"type": "choice", "choice": question.options[best], "confidence": confidence,
            "probabilities": dict(zip(question.options, p, strict=True))}


def answer_request(model: LoadedModel, request: Request, temperature: TemperatureFn | None = None,
                   *, shared_prefix: bool = True, model_name: str | None = None) -> dict[str, Any]:
    """Score every question of one request (one shared state prefix) and build the Jev response."""
    from mydecide.modeling import score_questions, to_probabilities

    names = list(request.questions)
    items = [(request.state, request.questions[n]) for n in names]
    logits = score_questions(model, items, shared_prefix=shared_prefix)
    answers = {}
    for name, (_, question), z in zip(names, items, logits, strict=True):
        t = temperature(question.type, question.k) if temperature else 1.0
        answers[name] = build_answer(question, to_probabilities(question.type, z, t))
    return {"model": model_name or request.model or model.name, "answers": answers,
            "usage": {"input_tokens": input_tokens(model, items, shared_prefix), "output_tokens": 0}}


def input_tokens(model: LoadedModel, items: list[tuple[Any, Question]], shared_prefix: bool) -> int:
    """Tokens actually processed: the state prefix once per request when shared, else once per prompt."""
    from mydecide.prompting import question_units

    prompts = [model.renderer.render(s, u) for s, q in items for u in question_units(q)]
    if shared_prefix:
        return len(prompts[0].prefix) + sum(len(p.suffix) for p in prompts)
    return sum(len(p) for p in prompts)
