"""bench/coherence.py: jevbench (the pinned package) against `mydecide serve`, and the table it writes."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def coherence(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    return importlib.import_module("coherence")


def test_the_table_shows_every_dimension_and_its_groups(coherence) -> None:
    report = {
        "scores": {
            "n_cases": 48,
            "tolerance": "fixed 0.05",
            "overall": None,
            "pillars": {"REP": 0.0625, "BAT": None, "MEA": 0.5, "LOG": None, "CHO": 1.0},
            "groups": {"REP.type": 0.0625, "REP.binding": None, "MEA.complement": 0.5, "CHO.conditioning": 1.0},
        }
    }
    lines = coherence.table(report, "demo").splitlines()
    assert lines[0] == "JevBench coherence of demo (48 cases, tolerance fixed 0.05)"
    assert lines[4:] == [
        "| **overall** | **-** |",
        "| **REP** | **6.2** |",
        "| REP.type | 6.2 |",
        "| REP.binding | - |",
        "| **BAT** | **-** |",
        "| **MEA** | **50.0** |",
        "| MEA.complement | 50.0 |",
        "| **LOG** | **-** |",
        "| **CHO** | **100.0** |",
        "| CHO.conditioning | 100.0 |",
    ]


def test_the_commands_it_runs(coherence) -> None:
    args = coherence.argparse.Namespace(
        model="m", adapter="A", temperatures="T.json", name="n", jevbench="/x/jevbench", suite="jevbench-mini",
        concurrency=8, seed=0, groups="REP.type", dimensions=None,
    )  # fmt: skip
    serve = coherence.serve_command(args, 1234)
    assert serve[1:5] == ["-m", "mydecide.cli", "serve", "--model"] and serve[-4:] == [
        "--adapter",
        "A",
        "--temperatures",
        "T.json",
    ]
    bench = coherence.jevbench_command(args, 1234, Path("/tmp/r.json"))
    assert bench[:4] == ["/x/jevbench", "eval", "--url", "http://127.0.0.1:1234/v1/systemone"]
    assert bench[-2:] == ["--groups", "REP.type"] and "--dimensions" not in bench


@pytest.mark.slow
def test_jevbench_runs_against_the_server_on_a_tiny_model(coherence, tiny_llama_dir: Path, tmp_path: Path) -> None:
    coherence.main(
        ["--model", str(tiny_llama_dir), "--groups", "REP.type", "--name", "tiny", "--results", str(tmp_path)]
    )
    result = json.loads((tmp_path / "tiny.json").read_text())
    groups = result["jevbench"]["scores"]["groups"]
    assert groups["REP.type"] == pytest.approx(1.0)  # a yes / no choice and score read as the noul (scoring/yes_no.py)
    assert "| REP.type | 100.0 |" in (tmp_path / "tiny.md").read_text()
