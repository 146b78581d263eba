"""The calibration guard matches by content (issue 36, item 7): a file that holds rows of the training split beside
it (a copy with changes, a concatenation) is refused unless --force, and says how many rows matched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mydecide.calibration.run import check_calibration_data
from mydecide.cli import app
from mydecide.data.split import protected_split


def rows(start: int, n: int) -> list[dict[str, Any]]:
    return [
        {
            "id": f"r{i}",
            "task": "t",
            "state": f"ticket {i}: the printer is on fire",
            "question": {"type": "noul", "instructions": "Is it urgent?"},
            "answer": i % 2 == 0,
        }
        for i in range(start, start + n)
    ]


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def prepared(tmp_path: Path) -> Path:
    """A prepare output: 6 training rows, 3 dev rows on other states."""
    write(tmp_path / "data" / "train.jsonl", rows(0, 6))
    write(tmp_path / "data" / "dev.jsonl", rows(100, 3))
    return tmp_path / "data"


def test_the_dev_split_beside_the_training_split_is_accepted(prepared: Path) -> None:
    assert protected_split(prepared / "dev.jsonl") is None
    check_calibration_data(prepared / "dev.jsonl")


def test_a_concatenation_of_train_and_dev_is_refused_and_says_how_many_rows_matched(prepared: Path) -> None:
    both = write(prepared / "all.jsonl", rows(100, 3) + rows(0, 6))
    with pytest.raises(ValueError, match="refusing to calibrate on") as refused:
        check_calibration_data(both)
    message = str(refused.value)
    assert f"6 of its 9 rows are rows of the training split {prepared / 'train.jsonl'}" in message
    assert "(6 by row id and state, 0 by state alone" in message and "--force" in message
    check_calibration_data(both, force=True)


def test_a_copy_of_the_training_split_with_changes_is_refused(prepared: Path) -> None:
    changed = [{**r, "id": f"mine-{i}", "answer": not r["answer"]} for i, r in enumerate(rows(0, 6))]
    changed[0]["state"] = "a state of my own"  # one row really is new
    copy = write(prepared / "my_dev.jsonl", changed)
    reason = protected_split(copy) or ""
    assert "5 of its 6 rows are rows of the training split" in reason and "0 by row id and state, 5 by state" in reason


def test_a_part_file_of_a_partitioned_dev_split_is_checked_against_the_training_split(prepared: Path) -> None:
    part = write(prepared / "dev" / "part-00000.jsonl", rows(100, 2) + rows(3, 1))
    (prepared / "dev.jsonl").unlink()
    assert "1 of its 3 rows are rows of the training split" in (protected_split(part) or "")
    assert "1 of its 3 rows" in (protected_split(prepared / "dev") or "")


def test_a_shared_id_alone_is_not_a_training_row(prepared: Path) -> None:
    reused = write(prepared / "mine.jsonl", [{**r, "id": f"r{i}"} for i, r in enumerate(rows(200, 3))])
    assert protected_split(reused) is None


def test_calibrate_refuses_a_concatenated_training_split_in_one_line_before_loading_a_model(
    prepared: Path, tmp_path: Path
) -> None:
    both = write(prepared / "all.jsonl", rows(100, 3) + rows(0, 6))
    out = tmp_path / "t.json"
    args = ["calibrate", "--model", str(tmp_path / "no-model"), "--data", str(both), "--out", str(out)]
    result = CliRunner().invoke(app, args)
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert "6 of its 9 rows are rows of the training split" in errors[0] and "--force" in errors[0]
    assert not out.exists()


@pytest.fixture
def run_of(prepared: Path, tmp_path: Path) -> Path:
    """A training run on ``prepared``: RUN/recipe.yaml names its data, RUN/adapter is the adapter calibrated."""
    (tmp_path / "run" / "adapter").mkdir(parents=True)
    (tmp_path / "run" / "recipe.yaml").write_text(f"data: {prepared}\nout: {tmp_path / 'run'}\n")
    return tmp_path / "run" / "adapter"


@pytest.mark.parametrize("copy", ["the training split", "dev + train"])
def test_a_copy_of_the_adapters_training_split_placed_elsewhere_is_refused(
    copy: str, prepared: Path, run_of: Path, tmp_path: Path
) -> None:
    """Away from its prepare output no training split is beside the file: the adapter's run names the one to check."""
    mine = write(
        tmp_path / "elsewhere" / "mydev.jsonl",
        rows(0, 6) if copy == "the training split" else rows(100, 3) + rows(0, 6),
    )
    assert protected_split(mine) is None  # nothing beside it to compare with
    reason = protected_split(mine, run_of) or ""
    n = "6 of its 6" if copy == "the training split" else "6 of its 9"
    assert reason.startswith(
        f"{n} rows are rows of the training split that {run_of} was trained on, {prepared / 'train.jsonl'} "
        "(6 by row id and state, 0 by state alone"
    ), reason
    assert protected_split(write(tmp_path / "elsewhere" / "fresh.jsonl", rows(300, 3)), run_of) is None
    assert protected_split(prepared / "dev.jsonl", run_of) is None  # its own dev split, beside the training split
    out = tmp_path / "t.json"
    args = ["calibrate", "--model", str(tmp_path / "no-model"), "--adapter", str(run_of), "--data", str(mine)]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert errors[0].startswith(f"error: refusing to calibrate on {mine}: {n} rows are rows of the training split")
    assert "--force" in errors[0] and not out.exists()


def test_an_adapter_whose_run_recipe_is_gone_or_names_no_data_leaves_the_content_guard_to_the_file_beside(
    prepared: Path, run_of: Path, tmp_path: Path
) -> None:
    mine = write(tmp_path / "elsewhere" / "mydev.jsonl", rows(0, 6))
    for text in ("out: x\n", "data: [1, 2]\n", "data: [unclosed\n", f"data: {tmp_path / 'moved'}\n"):
        (run_of.parent / "recipe.yaml").write_text(text)
        assert protected_split(mine, run_of) is None, text
    (run_of.parent / "recipe.yaml").unlink()
    assert protected_split(mine, run_of) is None
