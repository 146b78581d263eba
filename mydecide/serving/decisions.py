"""``POST /v1/decisions`` (OpenAI's Decisions API as vLLM serves it) in terms of ``/v1/systemone``.

A Decisions request becomes the System One request with the same state and questions (:func:`systemone_body`), so it
goes through the same checks and limits and gets the same calibrated probabilities; its answer is then written in the
Decisions shape (:func:`decisions_response`). The mapping, question by question:

- ``input``: a string is the state as it is; user messages are joined by a blank line, the text parts of one
  message by a newline (as vLLM joins them);
- ``predicate`` → ``noul`` without criteria; ``probability`` = P(yes);
- ``choice`` → ``choice`` with criteria ``{value: description}`` (a boolean value is the id ``true`` / ``false``);
  the answer gives the values back as sent (a boolean stays one);
- ``score`` → ``score`` with one level per ``levels`` entry, ``label`` or ``label: description``;
- ``confidence`` is the chosen option's calibrated probability (vLLM multiplies it by the labels' mass over the
  vocabulary, which a per-option read does not have).
"""

from __future__ import annotations

import json
from typing import Any

from mydecide.serving.request import RequestError
from mydecide.serving.schemas import (
    ChoiceQuestion,
    DecisionQuestion,
    DecisionsRequest,
    InputMessage,
    PredicateQuestion,
)


def first_error(err: Any) -> str:
    """One line for a pydantic ``ValidationError``: its most specific error (the longest location: in a union, the
    branch that came closest), ``where: message``."""
    errors = err.errors()
    if not errors:
        return "invalid request"
    best = max(errors, key=lambda e: len(e.get("loc", ())))
    loc = best.get("loc", ())
    where = ".".join(str(part) for part in loc if not str(part).startswith(("str", "list[", "function")))
    return f"{where}: {best.get('msg', 'invalid')}" if where else str(best.get("msg", "invalid"))


def parse_decisions(body: Any) -> DecisionsRequest:
    """A decoded body as a :class:`DecisionsRequest`, or a :class:`RequestError` in one line."""
    from pydantic import ValidationError

    if isinstance(body, dict) and isinstance(body.get("input"), list):
        for message in body["input"]:
            parts = message.get("content") if isinstance(message, dict) else None
            if isinstance(parts, list) and any(isinstance(p, dict) and p.get("type") == "input_image" for p in parts):
                raise RequestError("input: images are not supported; send text parts (input_text) only")
    try:
        return DecisionsRequest.model_validate(body)
    except ValidationError as err:
        raise RequestError(f"invalid request: {first_error(err)}") from None


def input_state(value: str | list[InputMessage]) -> str:
    if isinstance(value, str):
        return value
    return "\n\n".join(
        m.content if isinstance(m.content, str) else "\n".join(part.text for part in m.content) for m in value
    )


def question_key(index: int) -> str:
    """The System One name of the question at ``index``: the one its errors name."""
    return f"questions[{index}]"


def option_id(value: str | bool) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def systemone_question(question: DecisionQuestion) -> dict[str, Any]:
    if isinstance(question, PredicateQuestion):
        return {"type": "noul", "instructions": question.instructions}
    if isinstance(question, ChoiceQuestion):
        ids = [option_id(c.value) for c in question.choices]
        if len(set(ids)) != len(ids):
            raise RequestError(
                "choice values must be distinct as text: a string 'true' and the boolean true are one option here"
            )
        criteria = {i: c.description for i, c in zip(ids, question.choices, strict=True)}
        return {"type": "choice", "instructions": question.instructions, "criteria": criteria}
    levels = [f"{lv.label}: {lv.description}" if lv.description else lv.label for lv in question.levels]
    return {"type": "score", "instructions": question.instructions, "criteria": levels}


def systemone_body(request: DecisionsRequest) -> dict[str, Any]:
    """The System One request body that asks ``request``'s questions about its input."""
    questions = {}
    for i, question in enumerate(request.questions):
        try:
            questions[question_key(i)] = systemone_question(question)
        except RequestError as err:
            raise RequestError(f"question {question_key(i)!r}: {err}") from None
    return {"model": request.model, "state": input_state(request.input), "questions": questions}


def decisions_answer(question: DecisionQuestion, answer: dict[str, Any]) -> dict[str, Any]:
    if isinstance(question, PredicateQuestion):
        return {"type": "predicate", "name": question.name, "probability": answer["noul"]}
    probabilities = list(answer["probabilities"].values())  # in the request's option order
    best = max(range(len(probabilities)), key=probabilities.__getitem__)
    if isinstance(question, ChoiceQuestion):
        return {
            "type": "choice",
            "name": question.name,
            "choice": question.choices[best].value,
            "probabilities": [
                {"value": c.value, "probability": p} for c, p in zip(question.choices, probabilities, strict=True)
            ],
            "confidence": probabilities[best],
        }
    return {
        "type": "score",
        "name": question.name,
        "score": answer["score"],
        "probabilities": [
            {"value": i, "label": level.label, "probability": p}
            for i, (level, p) in enumerate(zip(question.levels, probabilities, strict=True))
        ],
        "confidence": probabilities[best],
    }


def decisions_response(request: DecisionsRequest, systemone: dict[str, Any]) -> dict[str, Any]:
    """The Decisions answer to ``request`` from the System One answer to :func:`systemone_body`'s request."""
    answers = [decisions_answer(q, systemone["answers"][question_key(i)]) for i, q in enumerate(request.questions)]
    tokens = systemone["usage"]["input_tokens"]
    return {
        "model": systemone["model"],
        "answers": answers,
        "usage": {
            "input_tokens": tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": tokens,
        },
    }


def with_noul_detail(response: dict[str, Any]) -> dict[str, Any]:
    """``response`` with every noul answer also carrying ``probabilities`` {yes, no} and ``confidence`` (Jev's
    (K·p_max − 1)/(K − 1) at K = 2: |2p − 1|), as vLLM's noul answers do (``serve noul_detail=true``)."""
    for answer in response["answers"].values():
        if answer.get("type") == "noul":
            p = answer["noul"]
            answer["probabilities"] = {"yes": p, "no": 1.0 - p}
            answer["confidence"] = abs(2.0 * p - 1.0)
    return response
