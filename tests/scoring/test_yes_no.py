"""A yes / no question asked as a choice or a two-level score is read and calibrated as the noul it is
(mydecide/scoring/yes_no.py): the same probability through the HTTP API, the same training unit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mydecide.calibration.temperatures import TemperatureTable
from mydecide.prompt import RenderConfig
from mydecide.records import Record, parse_question
from mydecide.scoring.yes_no import family, yes_no_view

fastapi_testclient = pytest.importorskip("fastapi.testclient")

ASKED = "Does the customer ask for a refund?"


def q(spec: dict[str, Any]):
    return parse_question({"instructions": ASKED} | spec, "q")


@pytest.mark.parametrize(
    ("spec", "yes"),
    [
        ({"type": "choice", "criteria": {"yes": "Yes", "no": "No"}}, 0),
        ({"type": "choice", "criteria": {"no": "No", "yes": "Yes"}}, 1),
        ({"type": "choice", "criteria": ["yes", "no"]}, 0),
        ({"type": "choice", "criteria": {"a": "Yes.", "b": "no"}}, 0),  # by description, punctuation ignored
        ({"type": "choice", "criteria": {"TRUE": "", "False": ""}}, 0),
        ({"type": "choice", "criteria": {"yes": "No", "no": "Yes"}}, 1),  # the descriptions decide, not the ids
        ({"type": "score", "criteria": ["No", "Yes"]}, 1),
        ({"type": "score", "criteria": ["False", "True"]}, 1),
        ({"type": "score", "criteria": ["yes", "no"]}, 0),
    ],
)
def test_a_yes_and_a_no_are_viewed_as_the_noul(spec: dict[str, Any], yes: int) -> None:
    question = q(spec)
    view = yes_no_view(question)
    assert view is not None and view[1] == yes
    assert view[0] == q({"type": "noul"})  # exactly the noul a client sends without criteria
    assert family(question) == "noul"


@pytest.mark.parametrize(
    "spec",
    [
        {"type": "noul"},
        {"type": "choice", "criteria": {"yes": "Yes", "no": "Not at all"}},
        {"type": "choice", "criteria": ["yes", "maybe"]},
        {"type": "choice", "criteria": ["yes", "no", "unsure"]},
        {"type": "choice", "criteria": ["yes", "yes please"]},
        {"type": "score", "criteria": ["low", "high"]},
        {"type": "set", "criteria": {"yes": "", "no": ""}},
    ],
)
def test_other_questions_keep_their_reading(spec: dict[str, Any]) -> None:
    question = q(spec)
    assert yes_no_view(question) is None and family(question) == question.type


@pytest.fixture(scope="module", params=["per_option", "letters"])
def model(request: pytest.FixtureRequest, tiny_llama_dir: Path):
    from mydecide.modeling import load_model

    form = request.param
    return load_model(str(tiny_llama_dir), render=RenderConfig(option_form=form, score_form=form), device="cpu")


def test_the_three_forms_get_one_answer_through_the_api(model) -> None:
    from mydecide.serving.app import create_app

    body = {
        "state": "I was charged twice. Please refund the second payment by Friday.",
        "questions": {
            "noul": {"type": "noul", "instructions": ASKED},
            "choice": {"type": "choice", "instructions": ASKED, "criteria": {"no": "No", "yes": "Yes"}},
            "score": {"type": "score", "instructions": ASKED, "criteria": ["False", "True"]},
            "other": {"type": "choice", "instructions": ASKED, "criteria": {"yes": "Yes", "maybe": "Maybe"}},
        },
    }
    table = TemperatureTable({"choice": 3.0, "noul": 0.5, "score": 2.0})  # the noul's T must be the one used
    with fastapi_testclient.TestClient(create_app(model, model_name="tiny", temperature=table)) as client:
        answers = client.post("/v1/systemone", json=body).json()["answers"]
        alone = client.post("/v1/systemone", json=body | {"questions": {"noul": body["questions"]["noul"]}}).json()
    p_yes = alone["answers"]["noul"]["noul"]  # P(yes)
    assert answers["noul"]["noul"] == pytest.approx(p_yes, abs=1e-6)
    assert answers["choice"]["probabilities"]["yes"] == pytest.approx(p_yes, abs=1e-6)
    assert answers["choice"]["probabilities"]["no"] == pytest.approx(1 - p_yes, abs=1e-6)
    assert list(answers["choice"]["probabilities"]) == ["no", "yes"]  # the client's option order
    assert answers["score"]["probabilities"]["1"] == pytest.approx(p_yes, abs=1e-6)
    assert abs(answers["other"]["probabilities"]["yes"] - p_yes) > 1e-6  # not a yes / no question: its own read


def test_training_shows_a_yes_no_choice_as_the_noul(model) -> None:
    from mydecide.training.batches import record_units

    noul = Record("t", "A state.", q({"type": "noul"}), (1.0, 0.0))
    choice = Record("t", "A state.", q({"type": "choice", "criteria": {"no": "No", "yes": "Yes"}}), (0.0, 1.0))
    [as_noul] = record_units(model.renderer, noul, 0, (0, 1))
    [as_choice] = record_units(model.renderer, choice, 0, (1, 0))
    assert as_choice.prompts == as_noul.prompts and as_choice.target == (1.0, 0.0)
    assert not as_choice.yes_no and not as_choice.is_score
    assert json.dumps(choice.question.to_json()) != json.dumps(noul.question.to_json())
