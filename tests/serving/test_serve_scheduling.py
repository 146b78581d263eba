"""One large (allowed) request cannot hold small ones back: the worker scores it in slices and answers the requests
that arrive meanwhile between two slices. Measured on a tiny model."""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mydecide.config import Limits
from mydecide.serving.batching import BatchOptions, Scorer
from mydecide.serving.request import parse_request
from mydecide.serving.response import render_request

fastapi_testclient = pytest.importorskip("fastapi.testclient")
TestClient = fastapi_testclient.TestClient

URL = "/v1/systemone"
WORDS = "The checkout page returns an error for every customer since this morning. "
SMALL = {"state": "The invoice was charged twice.", "questions": {"q": {"type": "noul", "instructions": "Refund?"}}}


def large_request(labels: int = 85) -> dict[str, Any]:
    """About 31k input tokens on the tiny tokenizer: under every default limit, several seconds of work."""
    return {
        "state": WORDS * 60,
        "questions": {
            "labels": {
                "type": "set",
                "instructions": (WORDS * 20)[:800],
                "criteria": {f"label {i}": "" for i in range(labels)},
            }
        },
    }


@pytest.fixture(scope="module")
def model(tiny_llama_dir: Path):
    from mydecide.modeling import load_model

    return load_model(str(tiny_llama_dir), device="cpu")


def test_the_large_request_is_allowed_by_the_default_limits(model) -> None:
    parsed = parse_request(large_request())
    tokens = render_request(model, parsed).plan.tokens()
    assert 25_000 < tokens <= Limits().max_input_tokens
    assert tokens > 2 * BatchOptions().slice_tokens  # so it takes several slices


def test_small_requests_keep_their_latency_while_a_large_one_is_in_flight(model) -> None:
    from mydecide.serving.app import create_app

    with TestClient(create_app(model)) as c:
        small_alone = []
        for _ in range(3):
            started = time.perf_counter()
            assert c.post(URL, json=SMALL).status_code == 200
            small_alone.append(time.perf_counter() - started)

        large: dict[str, float] = {}

        def send_large() -> None:
            started = time.perf_counter()
            r = c.post(URL, json=large_request())
            large["status"] = r.status_code
            large["latency"] = time.perf_counter() - started
            large["done"] = time.perf_counter()

        thread = threading.Thread(target=send_large)
        thread.start()
        time.sleep(0.3)  # the large request is being scored now
        small_during, finished = [], []
        while thread.is_alive() and len(small_during) < 8:
            started = time.perf_counter()
            r = c.post(URL, json=SMALL)
            assert r.status_code == 200
            small_during.append(time.perf_counter() - started)
            finished.append(time.perf_counter())
        thread.join(120)
    assert large["status"] == 200
    answered_in_flight = [t for t, done in zip(small_during, finished, strict=True) if done < large["done"]]
    print(
        f"\nsmall alone: median {statistics.median(small_alone) * 1000:.0f} ms; large request: "
        f"{large['latency']:.2f} s; small while it ran: {len(answered_in_flight)} answered, latency max "
        f"{max(small_during) * 1000:.0f} ms, median {statistics.median(small_during) * 1000:.0f} ms"
    )
    # small requests were answered while the large one was still running: between two of its slices, not after it
    # (an order of events, not a duration: the latencies above are printed, never asserted)
    assert len(answered_in_flight) >= 2


def test_a_sliced_request_gets_the_answers_it_gets_in_one_go(model) -> None:
    parsed = parse_request(large_request(labels=20))
    whole = Scorer(model, BatchOptions(slice_tokens=10**9)).start()
    sliced = Scorer(model, BatchOptions(slice_tokens=1500)).start()
    try:
        a = whole.answer(parsed, timeout=120)["answers"]["labels"]["probabilities"]
        b = sliced.answer(parsed, timeout=120)["answers"]["labels"]["probabilities"]
    finally:
        whole.stop()
        sliced.stop()
    assert list(a) == list(b)
    assert list(b.values()) == pytest.approx(list(a.values()), abs=1e-4)
