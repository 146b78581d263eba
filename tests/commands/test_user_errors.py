"""``friendly_errors`` tells a user's mistake (a :class:`~mydecide.errors.UserError`) in one line with exit code 2,
and lets anything else through: a plain ``ValueError`` raised inside a command is a bug and keeps its traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

import mydecide.calibration.run as calibration_run
from mydecide.cli import app
from mydecide.errors import UserError
from mydecide.io import DirectoryBusy
from mydecide.merging import MergeError
from mydecide.recipe_parsing import RecipeError
from mydecide.records import RecordError

REPO = Path(__file__).resolve().parents[2]


def calibrate_args(tmp_path: Path) -> list[str]:
    return ["calibrate", "--data", str(tmp_path / "dev.jsonl"), "--out", str(tmp_path / "t.json")]


def raising(err: BaseException):
    def calibrate_file(*args: object, **kwargs: object) -> dict:
        raise err

    return calibrate_file


@pytest.mark.parametrize(
    "err",
    [
        UserError("dev.jsonl: something the user must fix"),
        RecipeError("dev.jsonl: something the user must fix"),
        RecordError("something the user must fix", "dev.jsonl"),
        DirectoryBusy("dev.jsonl: something the user must fix"),
        MergeError("dev.jsonl: something the user must fix"),
    ],
    ids=lambda err: type(err).__name__,
)
def test_a_user_error_is_one_line_and_exit_code_2(
    err: UserError, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(calibration_run, "calibrate_file", raising(err))
    result = CliRunner().invoke(app, calibrate_args(tmp_path))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.stderr.strip().splitlines() == ["error: dev.jsonl: something the user must fix"]


def test_user_error_is_a_value_error_for_callers_that_catch_one() -> None:
    for kind in (UserError, RecipeError, RecordError, DirectoryBusy, MergeError):
        assert issubclass(kind, ValueError)
    assert issubclass(DirectoryBusy, RuntimeError)  # as it was


@pytest.mark.parametrize("err", [ValueError("bug"), KeyError("bug"), RuntimeError("bug")], ids=repr)
def test_a_bug_is_not_told_as_a_user_error(err: Exception, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calibration_run, "calibrate_file", raising(err))
    result = CliRunner().invoke(app, calibrate_args(tmp_path))
    assert result.exit_code not in (0, 2), result.output
    assert result.exception is err  # it left the command as raised, not as `error: …` and typer.Exit
    assert "error: " not in result.stderr


def test_a_plain_value_error_from_inside_a_command_keeps_its_traceback(tmp_path: Path) -> None:
    # the real console entry point, in its own process: what the user sees on stderr
    script = textwrap.dedent(
        f"""
        import sys

        import mydecide.calibration.run as run

        def calibrate_file(*args, **kwargs):
            raise ValueError("bug")

        run.calibrate_file = calibrate_file
        sys.argv = ["mydecide", *{calibrate_args(tmp_path)!r}]

        from mydecide.cli import main

        main()
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode not in (0, 2), out.stderr
    assert "Traceback (most recent call last)" in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1] == "ValueError: bug"
    assert "error: bug" not in out.stderr
