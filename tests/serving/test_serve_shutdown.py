"""SIGTERM drains: a request in flight when the server is told to stop still gets its answer, not a 500."""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from mydecide.serving.batching import Scorer

BODY = {"state": "The checkout fails.", "questions": {"q": {"type": "noul", "instructions": "Is it down?"}}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sigterm_mid_request_drains_it(tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The request takes 6 s, longer than uvicorn's old 5 s graceful-shutdown cut: it must still answer 200."""
    import uvicorn

    from mydecide.modeling import load_model
    from mydecide.serving.app import create_app
    from mydecide.serving.server import server_config

    real = Scorer.score
    slow = threading.Event()

    def score(self: Scorer, prompts: list[Any]) -> Any:
        if slow.is_set():
            time.sleep(6.0)
        return real(self, prompts)

    monkeypatch.setattr(Scorer, "score", score)
    port = free_port()
    app = create_app(load_model(str(tiny_llama_dir), device="cpu"), request_timeout_s=20.0)
    server = uvicorn.Server(server_config(app, "127.0.0.1", port, request_timeout_s=20.0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)

    slow.set()
    result: dict[str, Any] = {}

    def send() -> None:
        try:
            result["response"] = httpx.post(f"http://127.0.0.1:{port}/v1/systemone", json=BODY, timeout=60)
        except httpx.HTTPError as err:  # a dropped connection is as bad as a 500
            result["error"] = repr(err)

    client = threading.Thread(target=send)
    client.start()
    time.sleep(1.0)  # the request is in the scorer now
    server.handle_exit(signal.SIGTERM, None)  # what uvicorn's SIGTERM handler calls
    client.join(60)
    thread.join(60)
    assert "error" not in result, result.get("error")
    response = result["response"]
    assert response.status_code == 200, response.text
    assert 0 < response.json()["answers"]["q"]["noul"] < 1
    assert not thread.is_alive()  # and then the server stopped
