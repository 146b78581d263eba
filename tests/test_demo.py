"""The demo driver end to end on a tiny model: every step runs and the summary has the promised blocks; and
scripts/update_readme.py, which puts a run's summary.md into docs/demo.md and its first table into README.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
UPDATE_README = REPO / "scripts" / "update_readme.py"
START, END = "<!-- demo:start -->", "<!-- demo:end -->"


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
    # the score task is judged on the second prepare's uncapped dev and test rows, none of them a training state
    assert "    0 of the evaluation's dev and test states are in" in result.stdout
    tasks = [json.loads(line)["task"] for line in (out / "data_eval" / "test.jsonl").open()]
    assert tasks.count("vader_sentiment_score") >= 300
    assert summary["score"]["tuned_calibrated"]["n"] == tasks.count("vader_sentiment_score")
    for side in ("base", "tuned", "tuned_calibrated", "prior"):
        ordinal = summary["score"][side]["ordinal"]
        assert {"rps", "mae", "spearman", "within_one", "threshold_ece", "threshold_ece_band"} <= set(ordinal)
    assert "| tuned_calibrated | " + str(summary["score"]["tuned_calibrated"]["n"]) + " |" in result.stdout
    # a temperature never changes an answer; only a score level map may, and the tiny run has enough dev score
    # questions (>= 300) for one to be tried
    report = json.loads((out / "eval_test" / "report.json").read_text())
    for qtype in ("choice", "noul"):
        assert report[qtype]["accuracy"] == report["uncalibrated"][qtype]["accuracy"]
    maps = json.loads((out / "temperatures.json").read_text())["level_maps"]
    if "bias" not in maps["5"]:  # not kept: every answer is the tuned model's
        assert summary["tuned"]["accuracy"] == summary["tuned_calibrated"]["accuracy"]
    assert (out / "eval_test" / "reliability.png").stat().st_size > 0
    assert "| tuned_calibrated |" in result.stdout
    # the per-type calibration table: every type of the test split with its dev and test log loss, T = 1 → calibrated
    temperatures = json.loads((out / "temperatures.json").read_text())["types"]
    test_report = json.loads((out / "eval_test" / "report.json").read_text())
    assert temperatures and any(test_report.get(qtype, {}).get("n") for qtype in temperatures)
    for qtype in (t for t in temperatures if test_report.get(t, {}).get("n")):
        assert f"| {qtype} | {temperatures[qtype]['temperature']:.3f} |" in result.stdout
    # docs/demo.md's tables are this run's summary.md, as the demo printed it, and the README's is its first
    # (scripts/update_readme.py)
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text(f"intro\n{START}\nold table\n{END}\n", encoding="utf-8")
    (root / "docs" / "demo.md").write_text(f"# Demo\n{START}\nold tables\n{END}\n", encoding="utf-8")
    subprocess.run([sys.executable, str(UPDATE_README), "--out", str(out), "--root", str(root)], check=True, timeout=60)
    summary_md = (out / "summary.md").read_text(encoding="utf-8")
    assert summary_md in result.stdout
    assert (root / "docs" / "demo.md").read_text(encoding="utf-8") == (
        f"# Demo\n{START}\n{summary_md}\n![reliability diagram](demo-reliability.png)\n{END}\n"
    )
    first = summary_md.split("\n\n")[:2]
    assert first[0].startswith("Test split of the trained tasks") and first[1].startswith("| model |")
    assert (root / "README.md").read_text(encoding="utf-8") == f"intro\n{START}\n{first[0]}\n\n{first[1]}\n{END}\n"
    assert (root / "docs" / "demo-reliability.png").read_bytes() == (out / "eval_test" / "reliability.png").read_bytes()


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


def test_the_demo_refuses_data_whose_training_states_it_would_evaluate_on(tmp_path: Path) -> None:
    """--data whose train.jsonl holds a state of the evaluation prepare's dev split: stopped before training."""
    probe = tmp_path / "probe"
    subprocess.run(
        [sys.executable, "-m", "mydecide.cli", "prepare", "recipes/data/demo.yaml", "--out", str(probe)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text((probe / "dev.jsonl").read_text().splitlines()[0] + "\n", encoding="utf-8")
    out = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "mydecide.demo", "--out", str(out), "--data", str(data)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"demo: 1 dev or test states of {out / 'data_eval'} are training states of {data}: give --data a prepare "
        "of recipes/data/demo.yaml"
    )
    assert not (out / "train").exists()


def test_update_readme_replaces_only_the_blocks_between_the_markers(tmp_path: Path) -> None:
    out, root = tmp_path / "demo", tmp_path / "repo"
    (out / "eval_test").mkdir(parents=True)
    summary = (
        "Test split (3 questions):\n\n| model | n |\n|---|---|\n| tuned | 3 |\n\nBy task:\n\n| task | n |\n|---|---|\n"
    )
    (out / "summary.md").write_text(summary, "utf-8")
    (out / "eval_test" / "reliability.png").write_bytes(b"png")
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text(f"# mydecide\n\nThe numbers:\n\n{START}\nold\n{END}\n\n## Next\n", encoding="utf-8")
    (root / "docs" / "demo.md").write_text(f"# The demo\n\n{START}\nold\n{END}\n\n## How to read\n", "utf-8")
    command = [sys.executable, str(UPDATE_README), "--out", str(out), "--root", str(root)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (root / "docs" / "demo.md").read_text(encoding="utf-8") == (
        f"# The demo\n\n{START}\n{summary}\n![reliability diagram](demo-reliability.png)\n{END}\n\n## How to read\n"
    )
    assert (root / "README.md").read_text(encoding="utf-8") == (
        f"# mydecide\n\nThe numbers:\n\n{START}\nTest split (3 questions):\n\n| model | n |\n|---|---|\n"
        f"| tuned | 3 |\n{END}\n\n## Next\n"
    )
    assert (root / "docs" / "demo-reliability.png").read_bytes() == b"png"

    missing = tmp_path / "no-run"
    refused = subprocess.run(
        [sys.executable, str(UPDATE_README), "--out", str(missing), "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"update_readme: no {missing / 'summary.md'}: run the demo first (python -m mydecide.demo --out {missing})"
    )

    # a page without its markers: nothing is written, not even the other page
    (root / "docs" / "demo.md").write_text("# The demo\n", encoding="utf-8")
    before = (root / "README.md").read_text(encoding="utf-8")
    (out / "summary.md").write_text(summary.replace("| tuned | 3 |", "| tuned | 4 |"), "utf-8")
    unmarked = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert unmarked.returncode == 1
    assert unmarked.stderr.strip() == f"update_readme: {root / 'docs' / 'demo.md'} has no {START} ... {END} markers"
    assert (root / "README.md").read_text(encoding="utf-8") == before
