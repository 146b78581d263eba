"""The demo driver end to end on a tiny model: every step runs and the summary has the promised blocks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_demo_pipeline_on_a_tiny_model(tiny_llama_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mydecide.demo",
            "--out",
            str(out),
            "--model",
            str(tiny_llama_dir),
            "optim.max_steps=2",
            "eval_every=2",
            "dev_limit=8",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    for block in ("base", "tuned", "tuned_calibrated", "majority"):
        assert set(summary[block]) == {"n", "accuracy", "chance_corrected", "log_loss", "ece", "ece_band", "flip_rate"}
        assert summary[block]["n"] == summary["tuned"]["n"] > 0
    assert summary["heldout"]["tuned"]["n"] > 0
    # calibration never changes an answer: tuned and tuned + calibrated have the same accuracy
    assert summary["tuned"]["accuracy"] == summary["tuned_calibrated"]["accuracy"]
    assert (out / "eval_test" / "reliability.png").stat().st_size > 0
    assert "| tuned_calibrated |" in result.stdout
    # the per-type calibration table: every type of the test split with its dev and test log loss, T = 1 → calibrated
    temperatures = json.loads((out / "temperatures.json").read_text())["types"]
    test_report = json.loads((out / "eval_test" / "report.json").read_text())
    assert temperatures and any(test_report.get(qtype, {}).get("n") for qtype in temperatures)
    for qtype in (t for t in temperatures if test_report.get(t, {}).get("n")):
        assert f"| {qtype} | {temperatures[qtype]['temperature']:.3f} |" in result.stdout


def test_the_demo_refuses_reused_data_inside_the_directory_it_empties(tmp_path: Path) -> None:
    data = tmp_path / "demo" / "data"
    data.mkdir(parents=True)
    (data / "train.jsonl").write_text("{}\n")
    result = subprocess.run(
        [sys.executable, "-m", "mydecide.demo", "--out", str(tmp_path / "demo"), "--data", str(data)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"demo: --data {data} is inside --out {tmp_path / 'demo'}, which the demo empties first: give another --out"
    )
    assert (data / "train.jsonl").exists()  # nothing was deleted
