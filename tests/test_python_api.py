"""The Python API (mydecide.api): ``DecisionModel.predict`` answers every question type as the server does (to 1e-6,
through the FastAPI app), its answers are typed, and ``import mydecide`` loads no model library until an API name
is used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.evaluation.test_evaluation import make_adapter
from tests.test_question_types import QUESTIONS, source_rows


def test_predict_equals_the_servers_answers_for_every_question_type(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    import mydecide
    from mydecide.calibration.temperatures import load_temperatures
    from mydecide.modeling import load_model
    from mydecide.serving.app import create_app

    adapter = make_adapter(tiny_llama_dir, tmp_path / "adapter")
    temperatures = tmp_path / "temperatures.json"
    fitted = {"choice": 0.7, "noul": 1.6, "score": 1.3, "set": 0.9, "span": 1.2}
    temperatures.write_text(json.dumps({"types": {t: {"temperature": v} for t, v in fitted.items()}}))
    decider = mydecide.DecisionModel.load(adapter, temperatures=temperatures, device="cpu")
    served = load_model(str(tiny_llama_dir), str(adapter), device="cpu")
    states = [row["state"] for row in source_rows()[::8]]  # one state of each type's records
    with TestClient(create_app(served, temperature=load_temperatures(temperatures), warm_up=False)) as client:
        for state in states:
            response = client.post("/v1/systemone", json={"state": state, "questions": QUESTIONS})
            assert response.status_code == 200, response.text
            wire = response.json()
            predicted = decider.predict(state, QUESTIONS)
            assert predicted.input_tokens == wire["usage"]["input_tokens"]
            for name, answer in wire["answers"].items():
                got = predicted[name]
                assert type(got).__name__ == f"{name.capitalize()}Answer" and got.type == answer["type"]
                for key, value in answer.items():
                    if key == "spans":
                        mine = [vars(s) for s in got.spans]  # type: ignore[attr-defined]
                        assert [s.pop("probability") for s in mine] == pytest.approx(
                            [s.pop("probability") for s in value], abs=1e-6
                        )
                        assert mine == value
                    elif key != "type":
                        assert getattr(got, key) == pytest.approx(value, abs=1e-6), (name, key)
    assert predicted["noul"].probabilities["no"] == pytest.approx(1 - predicted["noul"].noul)  # type: ignore[attr-defined]


def test_a_question_the_server_refuses_is_a_user_error_naming_it(tiny_llama_dir: Path, tmp_path: Path) -> None:
    import mydecide
    from mydecide.errors import UserError

    decider = mydecide.DecisionModel.load(None, model=str(tiny_llama_dir), device="cpu")
    with pytest.raises(UserError, match="bad"):
        decider.predict("a state", {"bad": {"type": "choice", "instructions": "Which?", "criteria": ["only"]}})


def test_importing_mydecide_loads_no_model_library_until_an_api_name_is_used() -> None:
    code = (
        "import sys, mydecide\n"
        "heavy = [m for m in ('torch', 'transformers', 'peft', 'pydantic') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert callable(mydecide.prepare) and 'pydantic' in sys.modules and 'torch' not in sys.modules\n"
        "try:\n    mydecide.nothing\nexcept AttributeError as err:\n    print(err)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "module 'mydecide' has no attribute 'nothing'"
