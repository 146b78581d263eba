"""The /v1/systemone app on a tiny model: the Jev response contract, malformed requests, auth, batching."""

from __future__ import annotations

import json
import logging
import math
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mydecide.config import Limits
from mydecide.prompt import RenderConfig
from mydecide.records import parse_question
from mydecide.serving.batching import BatchOptions, Scorer
from mydecide.serving.request import parse_request
from mydecide.serving.response import answer_request

fastapi_testclient = pytest.importorskip("fastapi.testclient")
TestClient = fastapi_testclient.TestClient

URL = "/v1/systemone"
STATE = "Checkout returns HTTP 500 for every customer since 09:10."
QUESTIONS: dict[str, Any] = {
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this ticket?",
        "criteria": {
            "billing": "Charges, invoices and refunds",
            "engineering": "Bugs, errors and outages",
            "support": "How-to and account questions",
        },
    },
    "plain": {"type": "choice", "instructions": "Which word fits?", "criteria": ["refund", "outage"]},
    "outage": {"type": "noul", "instructions": "Is a production system down?"},
    "outage_null": {"type": "noul", "instructions": "Is a production system down?", "criteria": None},
    "outage_texts": {
        "type": "noul",
        "instructions": "Is a production system down?",
        "criteria": {"true": "Customers cannot pay", "false": "Everything works"},
    },
    "urgency": {
        "type": "score",
        "instructions": "How urgent is this?",
        "criteria": ["not urgent", "soon", "today", "blocking"],
    },
    "labels": {
        "type": "set",
        "instructions": "Which labels apply?",
        "criteria": {"bug": "A defect", "billing": "About money", "outage": "A system is down"},
    },
}


@pytest.fixture(scope="module")
def model(tiny_llama_dir: Path):
    from mydecide.modeling import load_model

    return load_model(
        str(tiny_llama_dir), render=RenderConfig(option_form="letters", score_form="letters"), device="cpu"
    )


@pytest.fixture(scope="module")
def client(model):
    from mydecide.serving.app import create_app

    with TestClient(create_app(model, model_name="tiny")) as c:
        yield c


def post(client, body: Any, headers: dict[str, str] | None = None):
    return client.post(URL, content=json.dumps(body), headers={"content-type": "application/json", **(headers or {})})


def direct_logits(model, state: Any, question: dict[str, Any]) -> np.ndarray:
    from mydecide.scoring.engine import score_questions

    return score_questions(model, [(state, parse_question(question, "q"))], shared_prefix=False)[0]


# ----------------------------------------------------------------------------------------------- the contract


def test_a_request_for_another_model_is_refused_never_answered_by_this_one(client) -> None:
    r = post(client, {"model": "my-decider", "state": STATE, "questions": QUESTIONS})
    assert r.status_code == 404
    assert r.json() == {
        "error": "model 'my-decider' is not served here; this server serves 'tiny' (serve --name sets it)"
    }
    assert post(client, {"model": "", "state": STATE, "questions": QUESTIONS}).json()["model"] == "tiny"


def test_response_contract_for_every_question_type(client, model) -> None:
    r = post(client, {"model": "tiny", "state": STATE, "questions": QUESTIONS})
    assert r.status_code == 200, r.text
    out = r.json()
    assert set(out) == {"model", "answers", "usage"}
    assert out["model"] == "tiny"
    assert list(out["answers"]) == list(QUESTIONS)
    answers = out["answers"]

    for name in ("team", "plain"):
        a = answers[name]
        options = list(QUESTIONS[name]["criteria"])
        assert set(a) == {"type", "choice", "confidence", "probabilities"} and a["type"] == "choice"
        assert list(a["probabilities"]) == options
        p = np.array(list(a["probabilities"].values()))
        assert p.sum() == pytest.approx(1.0, abs=1e-9) and (p > 0).all()
        assert a["choice"] == options[int(p.argmax())]
        assert a["confidence"] == pytest.approx((len(p) * p.max() - 1) / (len(p) - 1), abs=1e-12)
        z = direct_logits(model, STATE, QUESTIONS[name])
        assert p == pytest.approx(np.exp(z - z.max()) / np.exp(z - z.max()).sum(), abs=1e-5)

    for name in ("outage", "outage_null", "outage_texts"):
        a = answers[name]
        assert set(a) == {"type", "noul"} and a["type"] == "noul"
        z = direct_logits(model, STATE, QUESTIONS[name])  # (yes, no)
        assert a["noul"] == pytest.approx(1 / (1 + math.exp(z[1] - z[0])), abs=1e-5)
    assert answers["outage"]["noul"] == pytest.approx(answers["outage_null"]["noul"], abs=1e-6)

    a = answers["urgency"]
    assert set(a) == {"type", "score", "confidence", "probabilities", "legend"}
    assert list(a["probabilities"]) == ["0", "1", "2", "3"]
    assert a["legend"] == {"0": "not urgent", "1": "soon", "2": "today", "3": "blocking"}
    p = np.array(list(a["probabilities"].values()))
    assert p.sum() == pytest.approx(1.0, abs=1e-9)
    assert a["score"] == pytest.approx(float((np.arange(4) * p).sum()), abs=1e-12)
    assert a["confidence"] == pytest.approx((4 * p.max() - 1) / 3, abs=1e-12)

    a = answers["labels"]
    assert a["type"] == "set" and list(a["probabilities"]) == ["bug", "billing", "outage"]
    assert all(0 < v < 1 for v in a["probabilities"].values())
    assert a["selected"] == [k for k, v in a["probabilities"].items() if v >= 0.5]

    # usage counts the tokens processed: the state prefix once, then every question's suffix (a set: per label)
    from mydecide.scoring.engine import question_prompts

    parsed = parse_request({"state": STATE, "questions": QUESTIONS})
    prompts, _ = question_prompts(model, [(STATE, q) for q in parsed.questions.values()])
    assert len(prompts) == len(QUESTIONS) - 1 + 3
    expected = len(prompts[0].prefix) + sum(len(p.suffix) for p in prompts)
    assert out["usage"] == {"input_tokens": expected, "output_tokens": 0}


def test_model_name_defaults_to_the_served_name_and_state_forms(client) -> None:
    for state in (STATE, {"ticket": 42, "text": STATE}, ["line one", "line two"]):
        r = post(client, {"state": state, "questions": {"q": QUESTIONS["outage"]}})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "tiny"


def test_noul_with_empty_criteria_object_is_read_as_absent(client) -> None:
    empty = {**QUESTIONS["outage"], "criteria": {}}
    a = post(client, {"state": STATE, "questions": {"q": empty}}).json()["answers"]["q"]["noul"]
    b = post(client, {"state": STATE, "questions": {"q": QUESTIONS["outage"]}}).json()["answers"]["q"]["noul"]
    assert a == pytest.approx(b, abs=1e-9)


def test_temperatures_are_applied_per_type(model) -> None:
    from mydecide.serving.app import create_app

    def temperature(qtype: str, k: int) -> float:
        return {"choice": 2.0, "noul": 0.5}.get(qtype, 1.0)

    body = {"state": STATE, "questions": {"team": QUESTIONS["team"], "outage": QUESTIONS["outage"]}}
    with TestClient(create_app(model, temperature=temperature)) as c:
        out = post(c, body).json()["answers"]
    z = direct_logits(model, STATE, QUESTIONS["team"]) / 2.0
    expected = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    assert list(out["team"]["probabilities"].values()) == pytest.approx(expected, abs=1e-5)
    z = direct_logits(model, STATE, QUESTIONS["outage"])
    assert out["outage"]["noul"] == pytest.approx(1 / (1 + math.exp((z[1] - z[0]) / 0.5)), abs=1e-5)


def test_health_and_model_loaded_in_the_lifespan_not_before(model) -> None:
    from mydecide.serving.app import create_app

    calls: list[int] = []

    def loader():
        calls.append(1)
        return model

    app = create_app(loader, model_name="lazy")
    assert calls == []  # building the app loads nothing
    with TestClient(app) as c:
        assert calls == [1]
        r = c.get("/health")
        assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["model"] == "lazy"
    assert calls == [1]


def test_requests_are_logged_without_state_contents(client, caplog: pytest.LogCaptureFixture) -> None:
    secret = "Customer card number 4111 1111 1111 1111"
    with caplog.at_level(logging.INFO, logger="mydecide.serve"):
        post(client, {"state": secret, "questions": {"a": QUESTIONS["outage"], "b": QUESTIONS["team"]}})
        post(client, {"state": secret, "questions": []})
    lines = [r.getMessage() for r in caplog.records if r.name == "mydecide.serve"]
    assert any(line.startswith("POST /v1/systemone 200 ") and line.endswith("questions=2") for line in lines)
    assert any(line.startswith("POST /v1/systemone 422 ") for line in lines)
    assert not any("4111" in line or "card" in line for line in caplog.text.splitlines())


# --------------------------------------------------------------------------------------- malformed requests

CHOICE = QUESTIONS["team"]
NOUL = QUESTIONS["outage"]


def body(questions: Any = None, **top: Any) -> bytes:
    obj = {"state": STATE, "questions": {"q": NOUL} if questions is None else questions, **top}
    return json.dumps(obj).encode()


def choice_with(n: int) -> dict[str, Any]:
    return {"type": "choice", "instructions": "Pick one.", "criteria": {f"o{i}": f"option {i}" for i in range(n)}}


MALFORMED: list[tuple[str, bytes, int, str]] = [
    ("invalid JSON", b'{"state": "x", "questions": ', 400, "invalid JSON"),
    ("empty body", b"", 400, "invalid JSON"),
    ("not UTF-8", b'{"state": "\xff\xfe", "questions": {}}', 400, "UTF-8"),
    ("NaN", b'{"state": "x", "questions": {"q": {"type": "score", "instructions": NaN}}}', 400, "NaN"),
    (
        "duplicate question name",
        b'{"state": "x", "questions": {"q": {"type": "noul", "instructions": "a?"}, '
        b'"q": {"type": "noul", "instructions": "b?"}}}',
        400,
        "duplicate key 'q'",
    ),
    ("nested too deeply", b'{"state": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "nested too deeply"),
    ("body is a list", b"[1, 2]", 422, "must be a JSON object"),
    ("unknown top-level key", body(stream=True), 422, "unknown top-level key(s) ['stream']"),
    ("model not a string", body(model=7), 422, "model must be a string"),
    ("state missing", json.dumps({"questions": {"q": NOUL}}).encode(), 422, "state is required"),
    ("state empty", json.dumps({"state": " ", "questions": {"q": NOUL}}).encode(), 422, "state must not be empty"),
    ("state a number", json.dumps({"state": 3, "questions": {"q": NOUL}}).encode(), 422, "state must be"),
    ("state list of numbers", json.dumps({"state": [1, 2], "questions": {"q": NOUL}}).encode(), 422, "list of strings"),
    (
        "state too long",
        json.dumps({"state": "x" * 100_001, "questions": {"q": NOUL}}).encode(),
        422,
        "limit of 100000 characters",
    ),
    ("questions missing", json.dumps({"state": STATE}).encode(), 422, "questions must be a non-empty object"),
    ("questions empty", body({}), 422, "questions must be a non-empty object"),
    ("questions a list", body([NOUL]), 422, "questions must be a non-empty object"),
    ("question not an object", body({"q": "yes?"}), 422, "question 'q' must be an object"),
    (
        "unknown question type",
        body({"q": {"type": "multi", "instructions": "x?"}}),
        422,
        "question 'q': type 'multi' is not one of",
    ),
    ("type missing", body({"q": {"instructions": "x?"}}), 422, "question 'q': type None"),
    ("instructions missing", body({"q": {"type": "noul"}}), 422, "question 'q': instructions"),
    ("instructions a number", body({"q": {"type": "noul", "instructions": 5}}), 422, "question 'q': instructions"),
    ("unknown question key", body({"q": {**NOUL, "weight": 2}}), 422, "question 'q' has unknown key(s) ['weight']"),
    ("choice with one option", body({"q": choice_with(1)}), 422, "question 'q': choice needs 2 to 255 options, got 1"),
    ("choice with 256 options", body({"q": choice_with(256)}), 422, "question 'q': choice needs 2 to 255"),
    ("choice duplicate ids", body({"q": {**CHOICE, "criteria": ["a", "a"]}}), 422, "duplicate option id(s) ['a']"),
    ("choice criteria a number", body({"q": {**CHOICE, "criteria": 3}}), 422, "question 'q': choice criteria"),
    (
        "choice description not text",
        body({"q": {**CHOICE, "criteria": {"a": 1, "b": 2}}}),
        422,
        "option descriptions must be strings",
    ),
    (
        "score with one level",
        body({"q": {"type": "score", "instructions": "x?", "criteria": ["low"]}}),
        422,
        "question 'q': score needs 2 to 10 levels",
    ),
    (
        "score with 11 levels",
        body({"q": {"type": "score", "instructions": "x?", "criteria": list("abcdefghijk")}}),
        422,
        "question 'q': score needs 2 to 10 levels, got 11",
    ),
    (
        "score criteria a map",
        body({"q": {"type": "score", "instructions": "x?", "criteria": {"a": "b"}}}),
        422,
        "question 'q': score criteria must be a list",
    ),
    ("noul criteria a string", body({"q": {**NOUL, "criteria": "yes"}}), 422, "question 'q': noul criteria"),
    ("noul criteria half", body({"q": {**NOUL, "criteria": {"true": "up"}}}), 422, "question 'q': noul criteria"),
    (
        "set with no labels",
        body({"q": {"type": "set", "instructions": "x?", "criteria": {}}}),
        422,
        "question 'q': set needs 1 to 255 labels",
    ),
    ("too many questions", body({f"q{i}": NOUL for i in range(33)}), 422, "33 questions exceed the limit of 32"),
    (
        "too many prompts",
        body(
            {
                name: {"type": "set", "instructions": "x?", "criteria": {f"l{i}": "" for i in range(200)}}
                for name in ("a", "b", "big")
            }
        ),
        422,
        "question 'big': the request needs more than 512 scored prompts",
    ),
    ("empty question name", body({" ": NOUL}), 422, "question names must be non-empty"),
    (
        "lone surrogate",
        b'{"state": "bad \\ud800 text", "questions": {"q": {"type": "noul", "instructions": "x?"}}}',
        422,
        "lone surrogate",
    ),
    (
        "oversized body",
        json.dumps({"state": "x" * 1_000_001, "questions": {"q": NOUL}}).encode(),
        413,
        "exceeds the limit of 1000000 bytes",
    ),
]


@pytest.mark.parametrize(("case", "raw", "status", "message"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_request_gets_a_4xx_naming_the_rule(client, case: str, raw: bytes, status: int, message: str) -> None:
    r = client.post(URL, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == status, (case, r.text)
    out = r.json()
    assert set(out) == {"error"} and message in out["error"], (case, out)


def test_enough_malformed_cases_and_the_server_still_answers_afterwards(client) -> None:
    assert len(MALFORMED) >= 20
    r = post(client, {"state": STATE, "questions": {"q": NOUL}})
    assert r.status_code == 200


def test_body_size_is_checked_on_the_bytes_received_without_content_length(client) -> None:
    chunk = b" " * 65536

    def chunks():  # no Content-Length: sent chunked, so only the received size can trip the limit
        yield b'{"state": "x", "questions": {"q": {"type": "noul", "instructions": "x?"}}'
        for _ in range(20):
            yield chunk
        yield b"}"

    r = client.post(URL, content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "exceeds the limit of 1000000 bytes" in r.json()["error"]


def test_unknown_route_and_wrong_method_answer_json_errors(client) -> None:
    r = client.get(URL)
    assert r.status_code == 405 and "GET is not allowed" in r.json()["error"]
    r = client.post("/v1/other", content=b"{}")
    assert r.status_code == 404 and "POST /v1/systemone" in r.json()["error"]


def test_a_trailing_slash_is_the_same_endpoint_not_a_redirect(client) -> None:
    """A 307 would make the client send its POST body again (or drop it): both spellings answer the same."""
    body = {"state": STATE, "questions": {"q": NOUL}}
    plain, slashed = post(client, body), client.post(URL + "/", json=body, follow_redirects=False)
    assert plain.status_code == slashed.status_code == 200, slashed.text
    assert slashed.json() == plain.json()
    assert client.post(URL + "/", content=b"{").status_code == 400  # the same checks, too
    health = client.get("/health/", follow_redirects=False)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    r = client.get(URL + "/", follow_redirects=False)
    assert r.status_code == 405 and "GET is not allowed" in r.json()["error"]
    r = client.post(URL + "//", content=b"{}", follow_redirects=False)
    assert r.status_code == 404 and "POST /v1/systemone" in r.json()["error"]


def test_a_request_whose_client_has_gone_is_taken_off_the_queue(model) -> None:
    """Abandoned requests were scored minutes after their clients left, starving new ones (issue 64): a client that
    closes its connection while its request waits gets its request cancelled, and the scorer then skips it."""
    import asyncio
    from concurrent.futures import Future

    from mydecide.serving.app import create_app

    app = create_app(model, warm_up=False)
    waiting: list[Future] = []
    with TestClient(app):  # runs the lifespan: the scorer is there
        scorer = app.state.scorer
        scorer.submit = lambda request: waiting.append(Future()) or waiting[-1]  # a queue that never moves
        body = json.dumps({"state": STATE, "questions": {"q": NOUL}}).encode()
        sent: list[dict] = []

        async def call() -> None:
            messages = [{"type": "http.request", "body": body, "more_body": False}]

            async def receive() -> dict:
                if messages:
                    return messages.pop(0)
                await asyncio.sleep(0.2)  # the client waits a little, then hangs up
                return {"type": "http.disconnect"}

            async def send(message: dict) -> None:
                sent.append(message)

            headers = [(b"host", b"localhost"), (b"content-type", b"application/json")]
            scope = {"type": "http", "http_version": "1.1", "method": "POST", "path": URL, "raw_path": URL.encode(),
                     "root_path": "", "scheme": "http", "query_string": b"", "headers": headers,
                     "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "app": app}  # fmt: skip
            await asyncio.wait_for(app(scope, receive, send), 10)

        asyncio.run(call())
    assert len(waiting) == 1 and waiting[0].cancelled()
    assert sent[0]["status"] == 499
    assert not waiting[0].set_running_or_notify_cancel()  # what the scorer asks before scoring a job: skip it


def test_a_full_queue_answers_503(model) -> None:
    from mydecide.serving.app import create_app

    with TestClient(create_app(model, batching=BatchOptions(max_pending=0))) as c:
        r = post(c, {"state": STATE, "questions": {"q": NOUL}})
    assert r.status_code == 503 and r.headers["retry-after"] == "1" and "busy" in r.json()["error"]


def test_limits_are_configurable(model) -> None:
    from mydecide.serving.app import create_app

    limits = Limits(max_questions=2, max_state_chars=10, max_body_bytes=300)
    with TestClient(create_app(model, limits=limits)) as c:
        r = post(c, {"state": "x" * 11, "questions": {"q": NOUL}})
        assert r.status_code == 422 and "limit of 10 characters" in r.json()["error"]
        r = post(c, {"state": "x", "questions": {"a": NOUL, "b": NOUL, "c": NOUL}})
        assert r.status_code == 422 and "3 questions exceed the limit of 2" in r.json()["error"]
        r = post(c, {"state": "x", "questions": {"q": {**NOUL, "instructions": "y" * 400}}})
        assert r.status_code == 413


# ---------------------------------------------------------------------------------------------------- auth


def test_bearer_token_is_required_when_an_api_key_is_set(model) -> None:
    from mydecide.serving.app import create_app

    request = {"state": STATE, "questions": {"q": NOUL}}
    with TestClient(create_app(model, api_key="s3cret-key")) as c:
        r = post(c, request)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert "missing Authorization" in r.json()["error"]
        r = post(c, request, headers={"authorization": "Bearer wrong-key"})
        assert r.status_code == 401 and r.json() == {"error": "invalid API key"}
        r = post(c, request, headers={"authorization": "Basic s3cret-key"})
        assert r.status_code == 401 and "Bearer" in r.json()["error"]
        r = c.post(URL, content=b"not json", headers={"authorization": "Bearer s3cret-ke"})
        assert r.status_code == 401  # authentication comes before reading the body
        r = c.post(URL, content=json.dumps(request), headers={"authorization": "Bearer s3cret-key"})
        assert r.status_code == 200 and "q" in r.json()["answers"]
        assert c.get("/health").status_code == 200  # the health check stays open for probes


# ----------------------------------------------------------------------------------------- batch independence


def probabilities(answer: dict[str, Any]) -> list[float]:
    return [answer["noul"]] if answer["type"] == "noul" else list(answer["probabilities"].values())


def test_an_answer_does_not_depend_on_the_other_questions(client) -> None:
    alone = post(client, {"state": STATE, "questions": {"team": CHOICE}}).json()["answers"]["team"]
    crowd = post(client, {"state": STATE, "questions": QUESTIONS}).json()["answers"]["team"]
    reordered = dict(reversed(list(QUESTIONS.items())))
    last = post(client, {"state": STATE, "questions": reordered}).json()["answers"]["team"]
    assert probabilities(crowd) == pytest.approx(probabilities(alone), abs=1e-5)
    assert probabilities(last) == pytest.approx(probabilities(alone), abs=1e-5)


REQUESTS = [
    {"state": STATE, "questions": {"team": CHOICE, "outage": NOUL}},
    {"state": "Short.", "questions": {"urgency": QUESTIONS["urgency"]}},
    {
        "state": {"ticket": 7, "text": "The invoice was charged twice and the customer wants a refund."},
        "questions": {"team": CHOICE, "labels": QUESTIONS["labels"]},
    },
    {"state": ["line one " * 30, "line two"], "questions": {"outage": NOUL, "plain": QUESTIONS["plain"]}},
    {"state": STATE, "questions": {"outage": NOUL}},  # the same state as the first request
]


@pytest.mark.parametrize(
    ("shared_prefix", "packing"), [(True, True), (True, False), (False, False)], ids=["packed", "kv-cache", "unshared"]
)
def test_a_micro_batch_of_requests_answers_each_as_if_alone(
    tiny_model_dir: Path, shared_prefix: bool, packing: bool
) -> None:
    from mydecide.modeling import load_model

    model = load_model(str(tiny_model_dir), device="cpu")
    parsed = [parse_request(r) for r in REQUESTS]
    alone = [answer_request(model, p, shared_prefix=False, batch_size=1) for p in parsed]

    # queued before the worker starts, so the worker takes them all into one micro-batch
    scorer = Scorer(model, BatchOptions(shared_prefix=shared_prefix, packing=packing, window_ms=50))
    futures = [scorer.submit(p) for p in parsed]
    scorer.start()
    assert scorer.packed == (packing and "llama" in str(tiny_model_dir))  # the hybrid Qwen3.5 cannot pack
    try:
        batched = [f.result(timeout=60) for f in futures]
    finally:
        scorer.stop()
    assert scorer.stats.batches == 1 and scorer.stats.largest_batch == len(REQUESTS)
    for a, b in zip(alone, batched, strict=True):
        assert list(a["answers"]) == list(b["answers"])
        for name in a["answers"]:
            assert probabilities(b["answers"][name]) == pytest.approx(probabilities(a["answers"][name]), abs=1e-4)


def test_concurrent_http_requests_get_the_answers_they_get_alone(model) -> None:
    from mydecide.serving.app import create_app

    app = create_app(model, batching=BatchOptions(window_ms=100))
    with TestClient(app) as c:
        alone = [post(c, r).json() for r in REQUESTS]
        results: dict[int, Any] = {}
        barrier = threading.Barrier(len(REQUESTS))

        def send(i: int) -> None:
            barrier.wait(30)
            results[i] = post(c, REQUESTS[i]).json()

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(REQUESTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        stats = app.state.scorer.stats
    assert stats.requests == 1 + 2 * len(REQUESTS)  # warm-up + alone + concurrent
    assert stats.largest_batch >= 2  # within a 100 ms window, concurrent requests share a forward pass
    for i, expected in enumerate(alone):
        for name, answer in expected["answers"].items():
            got = results[i]["answers"][name]
            assert probabilities(got) == pytest.approx(probabilities(answer), abs=1e-4)
        assert results[i]["usage"] == expected["usage"]


def test_baseline_gives_the_same_answers_as_shared_prefix_batching(model) -> None:
    from mydecide.serving.app import create_app

    request = {"state": STATE, "questions": QUESTIONS}
    with TestClient(create_app(model)) as fast, TestClient(create_app(model, batching=BatchOptions.baseline())) as slow:
        a, b = post(fast, request).json(), post(slow, request).json()
    for name in QUESTIONS:
        assert probabilities(a["answers"][name]) == pytest.approx(probabilities(b["answers"][name]), abs=1e-4)
    assert a["usage"]["input_tokens"] < b["usage"]["input_tokens"]  # the state is processed once, not 9 times


def test_a_failing_request_does_not_fail_the_others_in_its_batch(model, monkeypatch: pytest.MonkeyPatch) -> None:
    import mydecide.serving.batching as batching

    real = batching.render_request

    def render(model, request, **kwargs):
        if request.state == "boom":
            raise RuntimeError("cannot render")
        return real(model, request, **kwargs)

    monkeypatch.setattr(batching, "render_request", render)
    scorer = Scorer(model, BatchOptions(window_ms=50))
    good = scorer.submit(parse_request(REQUESTS[0]))
    bad = scorer.submit(parse_request({"state": "boom", "questions": {"q": NOUL}}))
    scorer.start()
    try:
        assert set(good.result(timeout=60)["answers"]) == {"team", "outage"}
        with pytest.raises(RuntimeError, match="cannot render"):
            bad.result(timeout=60)
    finally:
        scorer.stop()
    assert scorer.stats.failures == 1


def test_an_internal_error_is_a_json_500_and_the_server_goes_on(model, monkeypatch: pytest.MonkeyPatch) -> None:
    import mydecide.serving.batching as batching
    from mydecide.serving.app import create_app

    real = batching.render_request

    def render(model, request, **kwargs):
        if request.state == "boom":
            raise RuntimeError("cannot render")
        return real(model, request, **kwargs)

    monkeypatch.setattr(batching, "render_request", render)
    with TestClient(create_app(model), raise_server_exceptions=False) as c:
        r = post(c, {"state": "boom", "questions": {"q": NOUL}})
        assert r.status_code == 500 and r.json() == {"error": "internal error while scoring (see the server log)"}
        assert post(c, {"state": STATE, "questions": {"q": NOUL}}).status_code == 200
