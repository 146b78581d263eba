"""`mydecide serve` as a real process on a free local port, checked with the third-party `jevbench check`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from mydecide.cli import app

API_KEY = "test-key-123"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `mydecide serve` subprocess with an API key; yields its base URL."""
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "MYDECIDE_API_KEY": API_KEY, "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mydecide.cli",
                "serve",
                "--model",
                str(tiny_llama_dir),
                "--port",
                str(port),
                "--device",
                "cpu",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"mydecide serve exited with {proc.returncode}:\n{log.read_text()}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"mydecide serve did not become healthy in 120 s:\n{log.read_text()}")
            time.sleep(0.3)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_real_server_answers_checks_auth_and_refuses_bad_input(server: str) -> None:
    body = {
        "model": "tiny",
        "state": "The checkout page fails.",
        "questions": {"down": {"type": "noul", "instructions": "Is a production system down?"}},
    }
    r = httpx.post(f"{server}/v1/systemone", json=body, timeout=30)
    assert r.status_code == 401
    auth = {"Authorization": f"Bearer {API_KEY}"}
    r = httpx.post(f"{server}/v1/systemone", json=body, headers=auth, timeout=30)
    assert r.status_code == 200 and 0 < r.json()["answers"]["down"]["noul"] < 1
    r = httpx.post(f"{server}/v1/systemone", content=b'{"state": ', headers=auth, timeout=30)
    assert r.status_code == 400 and "invalid JSON" in r.json()["error"]


def test_jevbench_check_passes_against_the_real_server(server: str) -> None:
    pytest.importorskip("jevbench")
    env = {**os.environ, "JEVBENCH_API_KEY": API_KEY}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "jevbench",
            "check",
            "--url",
            f"{server}/v1/systemone",
            "--model",
            "tiny",
            "--api-key-env",
            "JEVBENCH_API_KEY",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    print(result.stdout, result.stderr)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "jevbench check: OK" in result.stdout


def test_serve_refuses_to_expose_without_an_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MYDECIDE_API_KEY", raising=False)
    result = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0"])
    assert result.exit_code == 2 and "set --api-key (or MYDECIDE_API_KEY)" in result.output


def test_serve_names_a_missing_model_or_adapter_before_starting(tiny_llama_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "--model", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "no such model directory" in result.output
    result = CliRunner().invoke(app, ["serve", "--model", str(tiny_llama_dir), "--adapter", str(tmp_path)])
    assert result.exit_code == 2 and "not a LoRA adapter directory" in result.output


def test_predict_answers_a_request_file_like_the_server(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from mydecide.modeling import load_model
    from mydecide.serving.app import create_app

    body = {
        "model": "m",
        "state": "The invoice was charged twice.",
        "questions": {
            "team": {
                "type": "choice",
                "instructions": "Which team?",
                "criteria": {"billing": "Money", "engineering": "Bugs"},
            },
            "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "medium", "high"]},
        },
    }
    request = tmp_path / "request.json"
    request.write_text(json.dumps(body))
    temperatures = tmp_path / "temperatures.json"
    temperatures.write_text(json.dumps({"types": {"choice": {"temperature": 2.0}}}))
    result = CliRunner().invoke(
        app, ["predict", "--model", str(tiny_llama_dir), "--temperatures", str(temperatures), str(request)]
    )
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout[result.stdout.index("{") :])

    def temperature(qtype: str, k: int) -> float:
        return 2.0 if qtype == "choice" else 1.0

    with TestClient(create_app(load_model(str(tiny_llama_dir), device="cpu"), temperature=temperature)) as c:
        served = c.post("/v1/systemone", json=body).json()
    assert printed["usage"] == served["usage"]
    for name in body["questions"]:
        got, expected = printed["answers"][name]["probabilities"], served["answers"][name]["probabilities"]
        assert list(got) == list(expected)
        assert list(got.values()) == pytest.approx(list(expected.values()), abs=1e-5)

    request.write_text('{"state": "x", "questions": {"q": {"type": "noul", "instructions": "y?"}, "q": {}}}')
    result = CliRunner().invoke(app, ["predict", "--model", str(tiny_llama_dir), str(request)])
    assert result.exit_code == 2 and "request.json: invalid JSON: duplicate key 'q'" in result.output
