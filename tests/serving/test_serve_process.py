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
from contextlib import contextmanager
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


@contextmanager
def serving(model_dir: Path, log: Path, *options: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """A `mydecide serve` subprocess on a free local port, once /health answers; yields its base URL and stops it
    with SIGINT."""
    port = free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mydecide.cli",
                "serve",
                "--model",
                str(model_dir),
                "--port",
                str(port),
                "--device",
                "cpu",
                *options,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})},
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


@pytest.fixture(scope="module")
def server(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `mydecide serve` subprocess with an API key; yields its base URL."""
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with serving(tiny_llama_dir, log, "--name", "tiny", env={"MYDECIDE_API_KEY": API_KEY}) as url:
        yield url


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

    model = load_model(str(tiny_llama_dir), device="cpu")
    with TestClient(create_app(model, model_name="m", temperature=temperature)) as c:
        served = c.post("/v1/systemone", json=body).json()
    assert printed["usage"] == served["usage"]
    for name in body["questions"]:
        got, expected = printed["answers"][name]["probabilities"], served["answers"][name]["probabilities"]
        assert list(got) == list(expected)
        assert list(got.values()) == pytest.approx(list(expected.values()), abs=1e-5)

    request.write_text('{"state": "x", "questions": {"q": {"type": "noul", "instructions": "y?"}, "q": {}}}')
    result = CliRunner().invoke(app, ["predict", "--model", str(tiny_llama_dir), str(request)])
    assert result.exit_code == 2 and "request.json: invalid JSON: duplicate key 'q'" in result.output


# ------------------------------------------------------------------------------------------------ slow clients


@pytest.fixture(scope="module")
def slow_server(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `mydecide serve` subprocess with one-second header and body timeouts."""
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with serving(tiny_llama_dir, log, "--header-timeout", "1", "--body-timeout", "1") as url:
        yield url


def drip(url: str, first: bytes, piece: bytes, pieces: int = 100) -> bytes:
    """Send ``first``, then ``piece`` whenever the server has said nothing for 0.2 s, until it closes the connection;
    return all it answered. Fails when the connection is still open after ``pieces`` pieces (20 s or more: twenty
    times the timeouts)."""
    host, port = url.removeprefix("http://").split(":")
    received = b""
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(first)
        conn.settimeout(0.2)
        sent = 0
        while sent < pieces:
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                try:
                    conn.sendall(piece)
                except (BrokenPipeError, ConnectionResetError):
                    return received
                sent += 1
                continue
            except ConnectionResetError:
                return received
            if not chunk:
                return received
            received += chunk
    pytest.fail(f"the connection is still open after {pieces} pieces; the server answered {received[:300]!r}")


HEAD = b"POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


def test_a_client_dripping_header_lines_gets_a_408_and_is_disconnected(slow_server: str) -> None:
    answer = drip(slow_server, HEAD, b"X-Slow: one more line\r\n")
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert (
        b"connection: close" in answer.lower() and b"the request line and headers did not arrive within 1 s" in answer
    )


def test_a_connection_that_sends_nothing_is_closed_without_an_answer(slow_server: str) -> None:
    assert drip(slow_server, b"", b"") == b""


def test_a_client_dripping_the_body_gets_a_408_and_is_disconnected(slow_server: str) -> None:
    answer = drip(slow_server, HEAD + b"Content-Length: 1000\r\n\r\n{", b" ")
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"connection: close" in answer.lower() and b"the body did not arrive within 1 s" in answer


def test_a_body_still_dripping_after_an_early_answer_is_cut_off(slow_server: str) -> None:
    """The app answers a wrong path without reading the body; the client goes on sending it: the connection closes."""
    answer = drip(slow_server, HEAD.replace(b"/v1/systemone", b"/v1/other") + b"Content-Length: 1000\r\n\r\n{", b" ")
    assert answer.startswith(b"HTTP/1.1 404 "), answer


def test_a_prompt_client_is_answered_on_the_slow_server_and_may_keep_its_connection(slow_server: str) -> None:
    body = {"state": "The checkout page fails.", "questions": {"q": {"type": "noul", "instructions": "Down?"}}}
    with httpx.Client(base_url=slow_server, timeout=30) as client:
        for _ in range(2):  # the second request on the kept-alive connection
            r = client.post("/v1/systemone", json=body)
            assert r.status_code == 200 and 0 < r.json()["answers"]["q"]["noul"] < 1
        assert client.post("/v1/systemone/", json=body).status_code == 200


@pytest.mark.parametrize(
    "raw",
    [
        HEAD + b"Content-Length: abc\r\n\r\n{}",
        HEAD + b"Content-Length: -1\r\n\r\n{}",
        b"\x16\x03\x01 this is not HTTP at all\r\n\r\n",
        HEAD + b"X-Big: " + b"a" * 200_000 + b"\r\n\r\n",
    ],
    ids=["length-abc", "length-negative", "garbage-line", "headers-too-big"],
)
def test_bytes_that_are_not_http_get_a_json_400_and_a_close(slow_server: str, raw: bytes) -> None:
    """Below the app, uvicorn refuses what h11 cannot parse; its answer has the app's form: {"error": ...}, 400."""
    answer = drip(slow_server, raw, b"", pieces=50)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer
    assert b"connection: close" in head.lower() and b"content-type: application/json" in head.lower()
    assert json.loads(body) == {"error": "not a well-formed HTTP/1.1 request (invalid http request received)"}


def test_serve_runs_uvicorn_with_the_request_deadlines() -> None:
    from mydecide.serving.connections import RequestDeadlines
    from mydecide.serving.server import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, server_config

    protocol = server_config(object(), "127.0.0.1", 0, request_timeout_s=5.0).http
    assert issubclass(protocol, RequestDeadlines)
    assert (protocol.header_timeout_s, protocol.body_timeout_s) == (HEADER_TIMEOUT_S, BODY_TIMEOUT_S) == (10.0, 30.0)
    protocol = server_config(object(), "127.0.0.1", 0, request_timeout_s=5.0, header_timeout_s=2, body_timeout_s=3).http
    assert (protocol.header_timeout_s, protocol.body_timeout_s) == (2, 3)
