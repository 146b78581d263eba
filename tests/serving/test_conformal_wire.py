"""A served answer's optional ``set`` and ``act`` (docs/wire.md#sets-and-auto-act), through the HTTP API on a tiny
model; without a conformal section in temperatures.json the response is byte for byte what it was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mydecide.calibration.conformal_table import ActRule, ConformalTable, SetRule, SpanRule
from mydecide.calibration.temperatures import TemperatureTable
from mydecide.prompt import RenderConfig
from mydecide.records import parse_question
from mydecide.serving.response import set_and_act

fastapi_testclient = pytest.importorskip("fastapi.testclient")
TestClient = fastapi_testclient.TestClient

BODY: dict[str, Any] = {
    "state": "Checkout returns HTTP 500 for every customer since 09:10.",
    "questions": {
        "team": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "engineering", "support"]},
        "outage": {"type": "noul", "instructions": "Is a production system down?"},
        "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["no", "soon", "today", "now", "now!"]},
        "labels": {"type": "set", "instructions": "Which labels?", "criteria": {"bug": "A defect", "refund": "Money"}},
    },
}
CONFORMAL = ConformalTable(
    sets={
        "choice": SetRule("lac", 0.7, 0.1, 100),  # every option with p ≥ 0.3, and the top one
        "noul": SetRule("lac", 0.4, 0.1, 100),  # yes when P(yes) ≥ 0.6, no when P(no) ≥ 0.6
        "score": SetRule("ordinal_aps", 0.5, 0.1, 100),
        "set": SetRule("lac", 0.99, 0.1, 200),  # every label {yes, no} unless one side is below 0.01
    },
    acts={"choice": ActRule(None, 0.05, 0.1, 100), "noul": ActRule(0.0, 0.05, 0.1, 100)},
)


@pytest.fixture(scope="module")
def model(tiny_llama_dir: Path):
    from mydecide.modeling import load_model

    return load_model(
        str(tiny_llama_dir), render=RenderConfig(option_form="letters", score_form="letters"), device="cpu"
    )


def _post(model, temperature: Any) -> bytes:
    from mydecide.serving.app import create_app

    with TestClient(create_app(model, model_name="tiny", temperature=temperature)) as client:
        response = client.post("/v1/systemone", content=json.dumps(BODY), headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    return response.content


def test_a_served_answer_carries_set_and_act(model) -> None:
    plain = json.loads(_post(model, TemperatureTable({})))
    table = TemperatureTable({}, conformal=CONFORMAL)
    answers = json.loads(_post(model, table))["answers"]
    team = answers["team"]
    expected = [o for o, p in team["probabilities"].items() if p >= 0.3 or o == team["choice"]]
    assert team["set"] == expected and team["act"] == "escalate"  # no threshold passed on dev: always escalate
    p_yes = answers["outage"]["noul"]
    assert answers["outage"]["set"] == [v for v, p in (("yes", p_yes), ("no", 1 - p_yes)) if p >= 0.6] or (
        answers["outage"]["set"] == ["yes" if p_yes >= 0.5 else "no"]
    )
    assert answers["outage"]["act"] == "auto"
    low, high = answers["urgency"]["set"]["low"], answers["urgency"]["set"]["high"]
    top = max(answers["urgency"]["probabilities"], key=answers["urgency"]["probabilities"].get)
    assert low <= int(top) <= high
    assert "act" not in answers["urgency"]  # no auto-act rule for score questions in this table
    assert set(answers["labels"]["set"]) == {"bug", "refund"}
    # everything else is what a client without the new fields reads
    for name, answer in answers.items():
        assert {k: v for k, v in answer.items() if k not in ("set", "act")} == plain["answers"][name]


def test_without_a_conformal_section_the_response_is_byte_for_byte_unchanged(model) -> None:
    plain = _post(model, None)
    assert _post(model, TemperatureTable({})) == plain  # T = 1 both: the bytes of a server without temperatures
    assert all(not {"set", "act"} & set(a) for a in json.loads(plain)["answers"].values())


def test_a_span_set_is_its_spans_at_the_bounded_thresholds() -> None:
    question = parse_question({"type": "span", "instructions": "PII?", "criteria": {"EMAIL": "e-mail"}}, "q")
    probs = np.array([0.1, 0.35, 0.9])  # three words, one label
    rule = ConformalTable(span=SpanRule((("EMAIL", 0.3),), 0.5, 0.1, 40))
    got = set_and_act(question, probs, rule, "Mail anna today", None)
    assert got == {"set": [{"label": "EMAIL", "start": 5, "end": 15, "text": "anna today", "probability": 0.625}]}
