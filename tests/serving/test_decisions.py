"""POST /v1/decisions (OpenAI's Decisions API in vLLM's shape), GET /v1/models, /openapi.json and vLLM's extra keys
on /v1/systemone, on the tiny model."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mydecide.prompt import RenderConfig

fastapi_testclient = pytest.importorskip("fastapi.testclient")
TestClient = fastapi_testclient.TestClient

STATE = "The package arrived with a broken screen."
# a Decisions request as vLLM's docs (docs/serving/online_serving/decisions.md) send it, with its System One twin
DECISIONS: dict[str, Any] = {
    "model": "tiny",
    "input": STATE,
    "questions": [
        {"type": "predicate", "name": "damaged", "instructions": "Does the customer report a damaged item?"},
        {
            "type": "choice",
            "name": "department",
            "instructions": "Which department should handle this complaint?",
            "choices": [{"value": "returns", "description": "Refunds and exchanges"}, {"value": "billing"}],
        },
        {
            "type": "score",
            "instructions": "How severe is the damage?",
            "levels": [{"label": "cosmetic"}, {"label": "broken", "description": "it does not work"}],
        },
        {"type": "choice", "instructions": "Is it covered?", "choices": [{"value": True}, {"value": False}]},
    ],
}
SYSTEMONE: dict[str, Any] = {
    "model": "tiny",
    "state": STATE,
    "questions": {
        "damaged": {"type": "noul", "instructions": "Does the customer report a damaged item?"},
        "department": {
            "type": "choice",
            "instructions": "Which department should handle this complaint?",
            "criteria": {"returns": "Refunds and exchanges", "billing": ""},
        },
        "severity": {
            "type": "score",
            "instructions": "How severe is the damage?",
            "criteria": ["cosmetic", "broken: it does not work"],
        },
        "covered": {"type": "choice", "instructions": "Is it covered?", "criteria": ["true", "false"]},
    },
}


@pytest.fixture(scope="module")
def model(tiny_llama_dir: Path):
    from mydecide.modeling import load_model

    return load_model(str(tiny_llama_dir), render=RenderConfig(option_form="letters"), device="cpu")


def temperature(qtype: str, k: int) -> float:
    return {"choice": 2.0, "noul": 0.5, "score": 1.5}.get(qtype, 1.0)


@pytest.fixture(scope="module")
def app(model):
    from mydecide.serving.app import create_app

    return create_app(model, model_name="tiny", temperature=temperature, warm_up=False)


@pytest.fixture(scope="module")
def client(app):
    with TestClient(app) as c:
        yield c


def post(client, url: str, body: Any):
    return client.post(url, content=json.dumps(body), headers={"content-type": "application/json"})


def test_decisions_and_systemone_give_the_same_calibrated_probabilities(client) -> None:
    decision = post(client, "/v1/decisions", DECISIONS)
    jev = post(client, "/v1/systemone", SYSTEMONE)
    assert decision.status_code == 200 and jev.status_code == 200, (decision.text, jev.text)
    answers, jev_answers = decision.json()["answers"], jev.json()["answers"]
    assert [a["type"] for a in answers] == ["predicate", "choice", "score", "choice"]
    assert [a["name"] for a in answers] == ["damaged", "department", None, None]

    assert answers[0]["probability"] == pytest.approx(jev_answers["damaged"]["noul"], abs=1e-6)
    for got, name in ((answers[1], "department"), (answers[3], "covered")):
        expected = list(jev_answers[name]["probabilities"].values())
        probs = [p["probability"] for p in got["probabilities"]]
        assert probs == pytest.approx(expected, abs=1e-6)
        assert got["confidence"] == pytest.approx(max(expected), abs=1e-6)
    assert [p["value"] for p in answers[1]["probabilities"]] == ["returns", "billing"]
    assert [p["value"] for p in answers[3]["probabilities"]] == [True, False]  # booleans stay booleans
    assert answers[3]["choice"] is (answers[3]["probabilities"][0]["probability"] >= 0.5)

    severity = jev_answers["severity"]
    assert answers[2]["score"] == pytest.approx(severity["score"], abs=1e-6)
    assert [(p["value"], p["label"]) for p in answers[2]["probabilities"]] == [(0, "cosmetic"), (1, "broken")]
    assert [p["probability"] for p in answers[2]["probabilities"]] == pytest.approx(
        list(severity["probabilities"].values()), abs=1e-6
    )
    usage = decision.json()["usage"]
    assert usage["input_tokens"] == jev.json()["usage"]["input_tokens"] == usage["total_tokens"] > 0
    assert usage["output_tokens"] == 0 and usage["output_tokens_details"] == {"reasoning_tokens": 0}


def test_decisions_input_messages_are_joined_like_vllm(client) -> None:
    messages = [
        {"role": "user", "content": "The package arrived."},
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "The screen"}, {"type": "input_text", "text": "is broken."}],
        },
    ]
    question = DECISIONS["questions"][0]
    as_messages = post(client, "/v1/decisions", {"model": "tiny", "input": messages, "questions": [question]}).json()
    as_text = post(
        client,
        "/v1/decisions",
        {"model": "tiny", "input": "The package arrived.\n\nThe screen\nis broken.", "questions": [question]},
    ).json()
    assert as_messages["answers"][0]["probability"] == pytest.approx(as_text["answers"][0]["probability"], abs=1e-9)


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (
            {**DECISIONS, "model": "other"},
            404,
            "model 'other' is not served here; this server serves 'tiny' (serve --name sets it)",
        ),
        ({**DECISIONS, "temperature": 0}, 422, "invalid request: temperature: Extra inputs are not permitted"),
        (
            {**DECISIONS, "questions": []},
            422,
            "invalid request: questions: List should have at least 1 item after validation, not 0",
        ),
        (
            {**DECISIONS, "questions": [{"type": "choice", "instructions": "x", "choices": [{"value": "a"}]}]},
            422,
            "invalid request: questions.0.choice.choices: List should have at least 2 items after validation, not 1",
        ),
        (
            {
                **DECISIONS,
                "questions": [{"type": "choice", "instructions": "x", "choices": [{"value": "true"}, {"value": True}]}],
            },
            422,
            "question 'questions[0]': choice values must be distinct as text: a string 'true' and the boolean true "
            "are one option here",
        ),
        (
            {**DECISIONS, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            422,
            "input: images are not supported; send text parts (input_text) only",
        ),
        (
            {**DECISIONS, "input": [{"role": "system", "content": "x"}]},
            422,
            "invalid request: input.0.role: Input should be 'user'",
        ),
        ({**DECISIONS, "input": " "}, 422, "state must not be empty"),
    ],
)
def test_decisions_refusals_are_one_line(client, body: dict[str, Any], status: int, message: str) -> None:
    response = post(client, "/v1/decisions", body)
    assert (response.status_code, response.json()) == (status, {"error": message})


def test_decisions_body_is_strict_json(client) -> None:
    raw = '{"model": "tiny", "model": "tiny", "input": "x", "questions": []}'
    response = client.post("/v1/decisions", content=raw)
    assert (response.status_code, response.json()) == (400, {"error": "invalid JSON: duplicate key 'model'"})


def test_models_lists_the_served_model(client) -> None:
    listing = client.get("/v1/models").json()
    assert listing["object"] == "list" and len(listing["data"]) == 1
    assert {k: v for k, v in listing["data"][0].items() if k != "created"} == {
        "id": "tiny",
        "object": "model",
        "owned_by": "mydecide",
    }
    assert abs(listing["data"][0]["created"] - time.time()) < 3600


def test_models_and_decisions_need_the_api_key(model) -> None:
    from mydecide.serving.app import create_app

    with TestClient(create_app(model, model_name="tiny", api_key="k3y", warm_up=False)) as c:
        assert c.get("/v1/models").status_code == 401
        assert post(c, "/v1/decisions", DECISIONS).status_code == 401
        assert c.get("/v1/models", headers={"authorization": "Bearer k3y"}).status_code == 200
        assert c.get("/openapi.json").status_code == 200  # the schema is public, like vLLM's


@pytest.mark.parametrize(
    ("extra", "status", "message"),
    [
        ({"seed": 3, "priority": 1, "request_id": "r-1"}, 200, None),
        ({"chat_template_kwargs": {"enable_thinking": False}}, 200, None),
        ({"chat_template_kwargs": {}}, 200, None),
        (
            {"chat_template_kwargs": {"enable_thinking": True}},
            422,
            'chat_template_kwargs may only be {} or {"enable_thinking": false}: every prompt is rendered with '
            "thinking off and the template the adapter was trained with (docs/wire.md, vLLM keys)",
        ),
        (
            {"instructions": "Be strict."},
            422,
            "instructions (a vLLM request key) is not accepted: it would change every prompt; put the context in the "
            "state (docs/wire.md, vLLM keys)",
        ),
        ({"seed": "3"}, 422, "seed must be an integer or null"),
        ({"stream": True}, 422, "unknown top-level key(s) ['stream']; the keys are model, state and questions"),
    ],
)
def test_vllm_keys_on_systemone(client, extra: dict[str, Any], status: int, message: str | None) -> None:
    plain = post(client, "/v1/systemone", SYSTEMONE).json()
    response = post(client, "/v1/systemone", {**SYSTEMONE, **extra})
    assert response.status_code == status
    if message is None:
        assert response.json() == plain  # accepted and ignored: the same answers
    else:
        assert response.json() == {"error": message}


def test_noul_detail_adds_probabilities_and_confidence(model, client) -> None:
    from mydecide.serving.app import create_app

    plain = post(client, "/v1/systemone", SYSTEMONE).json()["answers"]["damaged"]
    assert set(plain) == {"type", "noul"}  # the default is unchanged
    with TestClient(create_app(model, model_name="tiny", temperature=temperature, noul_detail=True)) as c:
        detailed = post(c, "/v1/systemone", SYSTEMONE).json()["answers"]["damaged"]
    p = plain["noul"]
    assert detailed["noul"] == pytest.approx(p, abs=1e-9)
    assert detailed["probabilities"] == pytest.approx({"yes": p, "no": 1 - p}, abs=1e-9)
    assert detailed["confidence"] == pytest.approx(abs(2 * p - 1), abs=1e-9)


def test_openapi_is_valid_and_describes_real_answers(client) -> None:
    """/openapi.json: every schema in it is a valid JSON Schema (2020-12, OpenAPI 3.1's dialect), and the requests and
    answers above validate against the schemas it publishes for their paths."""
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    schema = client.get("/openapi.json").json()
    assert schema["openapi"].startswith("3.1")
    assert set(schema["paths"]) == {"/health", "/v1/systemone", "/v1/decisions", "/v1/models"}
    for component in schema["components"]["schemas"].values():
        Draft202012Validator.check_schema(component)
    registry = Registry().with_resource(
        "urn:openapi", Resource.from_contents({**schema, "$schema": Draft202012Validator.META_SCHEMA["$id"]})
    )

    def validate(instance: Any, ref: str) -> None:
        Draft202012Validator({"$ref": "urn:openapi" + ref}, registry=registry).validate(instance)

    def body_ref(path: str) -> str:
        return schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"][1:]

    def answer_ref(path: str, method: str = "post") -> str:
        return schema["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"][1:]

    validate(DECISIONS, "#" + body_ref("/v1/decisions"))
    validate(SYSTEMONE, "#" + body_ref("/v1/systemone"))
    validate(post(client, "/v1/decisions", DECISIONS).json(), "#" + answer_ref("/v1/decisions"))
    validate(post(client, "/v1/systemone", SYSTEMONE).json(), "#" + answer_ref("/v1/systemone"))
    validate(client.get("/v1/models").json(), "#" + answer_ref("/v1/models", "get"))
    with pytest.raises(Exception, match="'type': 'noul'} is not valid under any of the given schemas"):
        validate(
            {"model": "m", "answers": {"q": {"type": "noul"}}, "usage": {"input_tokens": 1, "output_tokens": 0}},
            "#" + answer_ref("/v1/systemone"),
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def live_url(app) -> Iterator[str]:
    """The app under uvicorn on a free local port, in a thread of this process."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


def test_the_openai_client_asks_decisions_and_lists_models(live_url: str, client) -> None:
    openai = pytest.importorskip("openai")
    sdk = openai.OpenAI(base_url=f"{live_url}/v1", api_key="unused", max_retries=0)
    decision = sdk.decisions.create(model="tiny", input=STATE, questions=DECISIONS["questions"])
    expected = post(client, "/v1/decisions", DECISIONS).json()
    assert decision.model == "tiny"
    assert [a.model_dump() for a in decision.answers] == expected["answers"]
    assert decision.usage.total_tokens == expected["usage"]["total_tokens"]
    assert [m.id for m in sdk.models.list()] == ["tiny"]
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        sdk.decisions.create(model="tiny", input=STATE, questions=DECISIONS["questions"], extra_body={"top_p": 1})
    assert refused.value.response.json() == {"error": "invalid request: top_p: Extra inputs are not permitted"}
