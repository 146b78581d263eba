"""The command line: `--help` never imports torch, every verb has help, `predict` answers a request file with
probabilities that sum to one, and bad input gives one line on stderr and exit code 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mydecide.cli import app

VERBS = ["prepare", "train", "calibrate", "evaluate", "predict", "serve", "merge", "export-vllm", "push"]
HEAVY = ["torch", "transformers", "peft", "accelerate", "datasets", "scipy", "matplotlib", "fastapi"]

REQUEST: dict[str, Any] = {
    "model": "my-decider",
    "state": "Checkout returns HTTP 500 for every customer since 09:10.",
    "questions": {
        "team": {
            "type": "choice",
            "instructions": "Which team should handle this ticket?",
            "criteria": {
                "billing": "Charges, invoices and refunds",
                "engineering": "Bugs, errors and outages",
                "support": "How-to and account questions",
            },
        },
        "outage": {"type": "noul", "instructions": "Is a production system down?"},
        "urgency": {
            "type": "score",
            "instructions": "How urgent is it?",
            "criteria": ["not urgent", "soon", "today", "blocking"],
        },
        "labels": {
            "type": "set",
            "instructions": "Which labels apply?",
            "criteria": {"bug": "Something is broken", "refund": "Money back requested"},
        },
    },
}


def test_help_imports_no_heavy_package() -> None:
    # a fresh interpreter: the root help and every verb's help, then list what got imported
    script = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from mydecide.cli import app\n"
        f"for args in [['--help'], *[[v, '--help'] for v in {VERBS!r}]]:\n"
        "    result = CliRunner().invoke(app, args)\n"
        "    assert result.exit_code == 0, (args, result.output)\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_installed_entry_point_shows_help() -> None:
    exe = Path(sys.executable).parent / "mydecide"
    if not exe.is_file():
        pytest.skip("the mydecide entry point is not installed next to this interpreter")
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Usage: mydecide" in out.stdout
    for verb in VERBS:
        assert verb in out.stdout


@pytest.mark.parametrize("verb", VERBS)
def test_each_verb_has_help(verb: str) -> None:
    result = CliRunner().invoke(app, [verb, "--help"])
    assert result.exit_code == 0, result.output
    assert f"Usage: mydecide {verb}" in result.output


def _write(tmp_path: Path, body: Any, name: str = "request.json") -> Path:
    path = tmp_path / name
    path.write_text(body if isinstance(body, str) else json.dumps(body), encoding="utf-8")
    return path


def test_predict_prints_a_jev_response(tiny_llama_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["predict", "--model", str(tiny_llama_dir), str(_write(tmp_path, REQUEST))])
    assert result.exit_code == 0, result.output
    response = json.loads(result.stdout)
    assert response["model"] == "my-decider"
    answers = response["answers"]
    assert list(answers) == ["team", "outage", "urgency", "labels"]
    team, outage, urgency, labels = (answers[n] for n in answers)

    assert team["type"] == "choice" and list(team["probabilities"]) == ["billing", "engineering", "support"]
    assert sum(team["probabilities"].values()) == pytest.approx(1.0, abs=1e-9)
    best = max(team["probabilities"], key=team["probabilities"].get)
    assert team["choice"] == best
    assert team["confidence"] == pytest.approx((3 * team["probabilities"][best] - 1) / 2)

    assert outage["type"] == "noul" and 0.0 < outage["noul"] < 1.0

    assert urgency["type"] == "score" and list(urgency["probabilities"]) == ["0", "1", "2", "3"]
    assert sum(urgency["probabilities"].values()) == pytest.approx(1.0, abs=1e-9)
    assert urgency["score"] == pytest.approx(sum(int(k) * v for k, v in urgency["probabilities"].items()))
    assert urgency["legend"] == {"0": "not urgent", "1": "soon", "2": "today", "3": "blocking"}

    assert labels["type"] == "set" and list(labels["probabilities"]) == ["bug", "refund"]
    assert all(0.0 < p < 1.0 for p in labels["probabilities"].values())
    assert response["usage"]["output_tokens"] == 0 and response["usage"]["input_tokens"] > 0


def test_predict_keeps_the_servers_body_limit_unless_raised(tmp_path: Path) -> None:
    """predict read any file whole; it now stops, as the server does, past limits.max_body_bytes (issue 64)."""
    request = _write(tmp_path, {**REQUEST, "state": "x" * 2_000})
    command = ["predict", str(request), "limits.max_body_bytes=1000", "--model", str(tmp_path / "absent")]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: {request}: larger than the limit of 1000 bytes a request body may have; raise it with "
        "limits.max_body_bytes=N"
    )
    raised = CliRunner().invoke(app, [*command[:2], "limits.max_body_bytes=100000", *command[3:]])
    assert "larger than the limit" not in raised.output and "absent" in raised.output  # then the model is looked for


def test_predict_without_shared_prefix_gives_the_same_answers(tiny_qwen_dir: Path, tmp_path: Path) -> None:
    path = str(_write(tmp_path, REQUEST))
    shared = CliRunner().invoke(app, ["predict", "--model", str(tiny_qwen_dir), path])
    alone = CliRunner().invoke(app, ["predict", "--model", str(tiny_qwen_dir), "--no-shared-prefix", path])
    assert shared.exit_code == 0 and alone.exit_code == 0, shared.output + alone.output
    a, b = json.loads(shared.stdout)["answers"], json.loads(alone.stdout)["answers"]
    for name in ("team", "urgency", "labels"):
        for option, p in a[name]["probabilities"].items():
            assert b[name]["probabilities"][option] == pytest.approx(p, abs=1e-4)
    assert b["outage"]["noul"] == pytest.approx(a["outage"]["noul"], abs=1e-4)
    # one prompt per question processes the state once per question: more input tokens
    assert json.loads(alone.stdout)["usage"]["input_tokens"] > json.loads(shared.stdout)["usage"]["input_tokens"]


# the message may name the request file first; it must name the question and the rule
AT = r"^error: (\S*request\.json: )?"
BAD_REQUESTS = [
    ("{not json", r"^error: \S*request\.json: invalid JSON.*Expecting property name enclosed in double quotes"),
    (
        {**REQUEST, "questions": {"team": {**REQUEST["questions"]["team"], "criteria": ["billing"]}}},
        AT + r"question 'team': choice needs 2 to 255 options, got 1$",
    ),
    (
        {**REQUEST, "questions": {"urgency": {**REQUEST["questions"]["urgency"], "type": "rank"}}},
        AT + r"question 'urgency': type 'rank' is not one of \['choice', 'noul', 'score', 'set', 'span'\]$",
    ),
    ({"questions": REQUEST["questions"]}, AT + r"state is required$"),
    ([1, 2], AT + r"the request body must be a JSON object$"),
]


@pytest.mark.parametrize(("body", "pattern"), BAD_REQUESTS, ids=["json", "one-option", "type", "state", "list"])
def test_a_bad_request_file_gives_one_line_and_exit_code_2(
    body: Any, pattern: str, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    result = CliRunner().invoke(app, ["predict", "--model", str(tiny_llama_dir), str(_write(tmp_path, body))])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert re.search(pattern, lines[0]), lines[0]


def test_missing_files_and_models_give_one_line_and_exit_code_2(tiny_llama_dir: Path, tmp_path: Path) -> None:
    missing = CliRunner().invoke(app, ["predict", "--model", str(tiny_llama_dir), str(tmp_path / "nope.json")])
    assert missing.exit_code == 2
    assert missing.stderr.strip() == f"error: {tmp_path / 'nope.json'}: no such request file"
    no_model = CliRunner().invoke(
        app, ["predict", "--model", str(tmp_path / "no-model"), str(_write(tmp_path, REQUEST))]
    )
    assert no_model.exit_code == 2
    assert no_model.stderr.strip().splitlines() == [f"error: {tmp_path / 'no-model'}: no such model directory"]
