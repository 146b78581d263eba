"""Span questions on the wire: in /v1/systemone and predict beside other types, the same answers mixed or alone, and
422s that name the rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mydecide.prompt import RenderConfig, SpanWindows
from mydecide.serving.request import RequestError, parse_request
from mydecide.serving.response import answer_request
from mydecide.spans import state_part

fastapi_testclient = pytest.importorskip("fastapi.testclient")

STATE = {
    "request": "Please mail Anna about the refund.",
    "answer": "Anna Berg (anna.berg@example.se) asked for a refund of order 1234; the checkout page shows an error "
    "for every customer since this morning, says Omar Lind from support. 李小龙 😀 agreed.",
}
SPAN = {
    "type": "span",
    "instructions": "Which pieces of text are personal data?",
    "criteria": {"PERSON": "a person's name", "EMAIL": "an e-mail address"},
}
NOUL = {"type": "noul", "instructions": "Is it about a refund?"}
CHOICE = {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "engineering", "support"]}


@pytest.fixture(scope="module", params=["letters", "head"])
def model(tiny_llama_dir: Path, request: pytest.FixtureRequest):
    """Both span reads; the head with random word weights (a trained one's are not zero either)."""
    import torch

    from mydecide.modeling import load_model
    from mydecide.scoring.span_head import attach_span_head

    render = RenderConfig(span=SpanWindows(window_tokens=16, overlap_tokens=4, read=request.param))  # several windows
    loaded = load_model(str(tiny_llama_dir), render=render, device="cpu")
    if request.param == "head":
        torch.manual_seed(0)
        torch.nn.init.normal_(attach_span_head(loaded.lm, bias=-1.0).word.weight, std=0.5)
    return loaded


def answers(model: Any, questions: dict[str, Any], state: Any = STATE) -> dict[str, Any]:
    return answer_request(model, parse_request({"state": state, "questions": questions}))["answers"]


def test_a_span_answer_is_the_same_mixed_with_choice_and_noul_questions_or_alone(model: Any) -> None:
    alone = answers(model, {"pii": SPAN})["pii"]
    mixed = answers(model, {"team": CHOICE, "pii": SPAN, "refund": NOUL})
    assert alone["type"] == "span" and set(alone) == {"type", "noul", "spans"}
    assert mixed["pii"]["noul"] == pytest.approx(alone["noul"], abs=1e-5)
    assert [(s["label"], s["start"], s["end"]) for s in mixed["pii"]["spans"]] == [
        (s["label"], s["start"], s["end"]) for s in alone["spans"]
    ]
    for got, want in zip(mixed["pii"]["spans"], alone["spans"], strict=True):
        assert got["probability"] == pytest.approx(want["probability"], abs=1e-5)
    # and the other questions answer as they do without the span question
    without = answers(model, {"team": CHOICE, "refund": NOUL})
    assert mixed["refund"]["noul"] == pytest.approx(without["refund"]["noul"], abs=1e-6)
    assert mixed["team"]["probabilities"] == pytest.approx(without["team"]["probabilities"], abs=1e-6)


def test_the_order_a_client_lists_span_labels_in_changes_no_answer(model: Any) -> None:
    labels = {**SPAN["criteria"], "PHONE": "a phone number"}
    shuffled = dict(reversed(labels.items()))
    a = answers(model, {"pii": {**SPAN, "criteria": labels}, "refund": NOUL})["pii"]
    b = answers(model, {"pii": {**SPAN, "criteria": shuffled}, "refund": NOUL})["pii"]
    assert abs(a["noul"] - b["noul"]) <= 1e-6
    assert [(s["label"], s["start"], s["end"]) for s in a["spans"]] == [
        (s["label"], s["start"], s["end"]) for s in b["spans"]
    ]
    assert all(abs(x["probability"] - y["probability"]) <= 1e-6 for x, y in zip(a["spans"], b["spans"], strict=True))


def test_span_answers_carry_exact_offsets_text_and_the_contract_fields(model: Any) -> None:
    from mydecide.scoring.engine import score_questions
    from mydecide.serving.response import span_answer

    request = parse_request({"state": STATE, "questions": {"pii": SPAN}})
    question = request.questions["pii"]
    (grid,) = score_questions(model, [(STATE, question)])
    part = state_part(STATE, None)
    # the random tiny model says yes to about half the words: every span it makes must hold its exact text
    answer = span_answer(part, question, 1 / (1 + np.exp(-grid)))
    assert answer["noul"] == pytest.approx(float(np.max(1 / (1 + np.exp(-grid)))))
    for span in answer["spans"]:
        assert set(span) == {"label", "start", "end", "text", "probability"}
        assert part[span["start"] : span["end"]] == span["text"] and 0.5 <= span["probability"] <= 1.0
    assert answer["spans"] and answer["spans"] == sorted(answer["spans"], key=lambda s: (s["start"], s["label"]))


def test_the_server_answers_span_questions_and_refuses_bad_ones_with_a_422(model: Any) -> None:
    from mydecide.serving.app import create_app

    body = {"state": STATE, "questions": {"pii": {**SPAN, "over": "answer"}, "refund": NOUL}}
    with fastapi_testclient.TestClient(create_app(model, model_name="tiny")) as client:

        def post(payload: dict[str, Any]) -> Any:
            return client.post(
                "/v1/systemone", content=json.dumps(payload), headers={"content-type": "application/json"}
            )

        ok = post(body)
        assert ok.status_code == 200, ok.text
        got = ok.json()["answers"]
        direct = answers(model, body["questions"])
        assert got["pii"]["noul"] == pytest.approx(direct["pii"]["noul"], abs=1e-5)
        assert [s["start"] for s in got["pii"]["spans"]] == [s["start"] for s in direct["pii"]["spans"]]
        assert ok.json()["usage"]["input_tokens"] > 0

        bad = {
            "over": ({**SPAN, "over": "context"}, "over part 'context' is not in the state; its text parts are"),
            "labels": ({**SPAN, "criteria": {}}, "span needs 1 to 32 labels, got 0"),
            "noul over": ({**NOUL, "over": "answer"}, "belongs to span questions only"),
        }
        for question, rule in bad.values():
            response = post({"state": STATE, "questions": {"pii": question}})
            assert response.status_code == 422 and rule in response.json()["error"], response.text
            assert "question 'pii'" in response.json()["error"]


def test_parse_request_refuses_a_span_over_plain_text_with_a_named_part() -> None:
    with pytest.raises(RequestError, match="question 'pii': over names the part 'answer', but the state is plain"):
        parse_request({"state": "Anna Berg", "questions": {"pii": {**SPAN, "over": "answer"}}})


def test_predict_answers_a_span_request_file(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from mydecide.cli import app

    request = tmp_path / "request.json"
    request.write_text(json.dumps({"state": STATE, "questions": {"pii": SPAN, "refund": NOUL}}), encoding="utf-8")
    result = CliRunner().invoke(app, ["predict", str(request), "--model", str(tiny_llama_dir), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    response = json.loads(result.stdout)
    assert response["answers"]["pii"]["type"] == "span" and 0.0 <= response["answers"]["pii"]["noul"] <= 1.0


def test_concurrent_requests_with_span_questions_get_the_answers_they_get_alone(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mydecide.serving import response
    from mydecide.serving.batching import BatchOptions, Scorer

    bodies = [
        {"state": STATE, "questions": {"pii": SPAN, "refund": NOUL}},
        {"state": "Omar Lind mailed omar@example.com about the invoice.", "questions": {"pii": SPAN}},
        {"state": "The checkout page is down.", "questions": {"team": CHOICE}},
    ]
    parsed = [parse_request(b) for b in bodies]
    alone = [answer_request(model, p) for p in parsed]
    calls: list[int] = []
    read = response.read_sequences
    monkeypatch.setattr(response, "read_sequences", lambda m, seqs: calls.append(len(seqs)) or read(m, seqs))
    scorer = Scorer(model, BatchOptions(window_ms=50))
    futures = [scorer.submit(p) for p in parsed]  # queued before the worker starts: one micro-batch
    scorer.start()
    try:
        batched = [f.result(timeout=60) for f in futures]
    finally:
        scorer.stop()
    assert scorer.stats.batches == 1 and len(calls) == 1  # both requests' span sequences read in one call
    for a, b in zip(alone, batched, strict=True):
        for name, answer in a["answers"].items():
            if answer["type"] == "span":
                assert b["answers"][name]["noul"] == pytest.approx(answer["noul"], abs=1e-5)
                assert [s["start"] for s in b["answers"][name]["spans"]] == [s["start"] for s in answer["spans"]]
        assert b["usage"] == a["usage"]
