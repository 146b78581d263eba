"""The wire formats as pydantic models, published at ``/openapi.json`` (docs/wire.md).

``/v1/systemone`` (Jev's System One) is validated by ``serving.request.parse_request`` on a strictly decoded body
(the models here describe it; a test checks real answers against them); ``/v1/decisions`` (OpenAI's Decisions API,
in the shape vLLM serves it: vllm-project/vllm ``docs/serving/online_serving/decisions.md`` and
``vllm/entrypoints/openai/decisions/protocol.py``) is validated by :class:`DecisionsRequest` after the same strict
decoding, then translated to a System One request (``serving.decisions``) so that both score the same way.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Open(BaseModel):
    """An answer object: clients must accept keys added later (a newer server's optional fields)."""

    model_config = ConfigDict(extra="allow")


# --- /v1/systemone -------------------------------------------------------------------------------------------------


class SystemOneQuestion(Closed):
    """One question; the rules per type are docs/records.md's (question types)."""

    type: Literal["choice", "noul", "score", "set", "span"]
    instructions: str = ""
    criteria: dict[str, str | None] | list[str] | None = Field(
        None,
        description="choice, set, span: option id → description (choice, span: or a list of ids); score: the level "
        "descriptions, lowest first; noul: absent, null, {} or {true: …, false: …}",
    )
    over: str | None = Field(None, description="span only: the state part the question is asked over")


class SystemOneRequest(Closed):
    model: str = ""
    state: str | list[str] | dict[str, Any]
    questions: dict[str, SystemOneQuestion] = Field(description="question name → question, answered in this order")
    seed: int | None = Field(None, description="vLLM's label-draw seed: accepted and ignored (no label draw here)")
    priority: int | None = Field(None, description="vLLM's scheduling priority: accepted and ignored")
    request_id: str | None = Field(None, description="vLLM's request id: accepted and ignored")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="only {} or {enable_thinking: false}, what every prompt is rendered with; others are a 422"
    )


class ChoiceAnswer(Open):
    type: Literal["choice"]
    choice: str
    confidence: float
    probabilities: dict[str, float]


class NoulAnswer(Open):
    type: Literal["noul"]
    noul: float = Field(description="P(yes)")
    probabilities: dict[str, float] | None = Field(None, description="{yes, no}, with serve noul_detail=true")
    confidence: float | None = Field(None, description="|2·noul − 1|, with serve noul_detail=true")


class ScoreAnswer(Open):
    type: Literal["score"]
    score: float
    confidence: float
    probabilities: dict[str, float]
    legend: dict[str, str]


class SetAnswer(Open):
    type: Literal["set"]
    probabilities: dict[str, float]
    selected: list[str]


class Span(Closed):
    label: str
    start: int
    end: int
    text: str
    probability: float


class SpanAnswer(Open):
    type: Literal["span"]
    noul: float
    spans: list[Span]


SystemOneAnswer = Annotated[
    ChoiceAnswer | NoulAnswer | ScoreAnswer | SetAnswer | SpanAnswer, Field(discriminator="type")
]


class SystemOneUsage(Closed):
    input_tokens: int
    output_tokens: int


class SystemOneResponse(Closed):
    model: str
    answers: dict[str, SystemOneAnswer]
    usage: SystemOneUsage


# --- /v1/decisions -------------------------------------------------------------------------------------------------


class InputText(Closed):
    type: Literal["input_text"]
    text: StrictStr


class InputMessage(Closed):
    role: Literal["user"]
    content: StrictStr | list[InputText]
    type: Literal["message"] = "message"


class DecisionQuestionBase(Closed):
    instructions: StrictStr
    name: StrictStr | None = None


class PredicateQuestion(DecisionQuestionBase):
    type: Literal["predicate"]


class ChoiceOption(Closed):
    value: StrictStr | StrictBool
    description: StrictStr = ""


class ChoiceQuestion(DecisionQuestionBase):
    type: Literal["choice"]
    choices: list[ChoiceOption] = Field(min_length=2)


class ScoreLevel(Closed):
    label: StrictStr
    description: StrictStr = ""


class ScoreQuestion(DecisionQuestionBase):
    type: Literal["score"]
    levels: list[ScoreLevel] = Field(min_length=2)


DecisionQuestion = Annotated[PredicateQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")]


class DecisionsRequest(Closed):
    model: StrictStr
    input: StrictStr | list[InputMessage] = Field(description="text, or user messages (joined by blank lines)")
    questions: list[DecisionQuestion] = Field(min_length=1)
    safety_identifier: StrictStr | None = Field(None, max_length=128, description="accepted; never logged")
    prompt_cache_key: StrictStr | None = Field(None, description="accepted and ignored")


class PredicateAnswer(Closed):
    type: Literal["predicate"] = "predicate"
    name: str | None
    probability: float


class ChoiceProbability(Closed):
    value: str | bool
    probability: float


class DecisionChoiceAnswer(Closed):
    type: Literal["choice"] = "choice"
    name: str | None
    choice: str | bool
    probabilities: list[ChoiceProbability]
    confidence: float = Field(description="the chosen value's (calibrated) probability")


class ScoreProbability(Closed):
    value: int
    label: str
    probability: float


class DecisionScoreAnswer(Closed):
    type: Literal["score"] = "score"
    name: str | None
    score: float
    probabilities: list[ScoreProbability]
    confidence: float = Field(description="the most probable level's (calibrated) probability")


DecisionAnswer = Annotated[PredicateAnswer | DecisionChoiceAnswer | DecisionScoreAnswer, Field(discriminator="type")]


class InputTokensDetails(Closed):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(Closed):
    reasoning_tokens: int = 0


class DecisionsUsage(Closed):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class DecisionsResponse(Closed):
    model: str
    answers: list[DecisionAnswer]
    usage: DecisionsUsage


# --- /v1/models, /health, errors -------------------------------------------------------------------------------


class ModelCard(Closed):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "mydecide"


class ModelList(Closed):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(Closed):
    error: str = Field(description="one line naming what is wrong (the question, the key) and the rule")


REQUEST_BODIES: dict[str, type[BaseModel]] = {
    "/v1/systemone": SystemOneRequest,
    "/v1/decisions": DecisionsRequest,
}
"""The request body of each POST path: the app reads and checks bodies itself (strict JSON, size limits), so
FastAPI does not see them; :func:`openapi_schema` adds them to the published schema."""


def openapi_schema(app: Any) -> dict[str, Any]:
    """The app's OpenAPI document, with the request bodies of :data:`REQUEST_BODIES` and their models added."""
    from fastapi.openapi.utils import get_openapi
    from pydantic.json_schema import models_json_schema

    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    _, defs = models_json_schema(
        [(model, "validation") for model in REQUEST_BODIES.values()], ref_template="#/components/schemas/{model}"
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, model_schema in defs.get("$defs", {}).items():
        components.setdefault(name, model_schema)
    for path, model in REQUEST_BODIES.items():
        operation = schema["paths"][path]["post"]
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    return schema
