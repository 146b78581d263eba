"""`mydecide merge --out` never replaces what merge did not write, --overwrite included (issue 36, item 2's rule for
every command that writes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from mydecide.cli import app
from mydecide.merging import REPORT_FILE, MergeError, check_merge_out


def _files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "case",
    ["the adapter", "inside the adapter", "above the model", "the working directory", "your files", "your twin"],
)
def test_merge_refuses_an_out_it_did_not_write_with_or_without_overwrite(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    model = tmp_path / "models" / "base"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    (tmp_path / "merged.unverified").mkdir()
    (tmp_path / "merged.unverified" / "notes.txt").write_text("mine too")
    monkeypatch.chdir(tmp_path)
    out, message = {
        "the adapter": (adapter, "holds or lies inside --adapter"),
        "inside the adapter": (adapter / "merged", "holds or lies inside --adapter"),
        "above the model": (tmp_path / "models", "holds or lies inside --model"),
        "the working directory": (Path("."), "is the working directory or above it"),
        "your files": (tmp_path / "mine", "holds notes.txt but no merge_report.json of an earlier merge"),
        "your twin": (tmp_path / "merged", "merged.unverified: holds notes.txt but no merge_report.json"),
    }[case]
    before = _files(tmp_path)
    for extra in ([], ["--overwrite"]):
        args = ["merge", "--model", str(model), "--adapter", str(adapter), "--out", str(out), *extra]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and message in lines[0], lines
        assert _files(tmp_path) == before
    assert not list(tmp_path.glob(".*.lock"))


def test_overwrite_replaces_an_earlier_merge_only_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    earlier = tmp_path / "merged"
    earlier.mkdir()
    (earlier / REPORT_FILE).write_text("{}")
    (earlier / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(MergeError, match="holds an earlier merge; pass --overwrite"):
        check_merge_out(earlier, [], overwrite=False)
    check_merge_out(earlier, [], overwrite=True)
    assert f"merge replaces the earlier merge in {earlier}" in capsys.readouterr().err
    check_merge_out(tmp_path / "new", [], overwrite=False)  # absent: made new
    (tmp_path / "empty").mkdir()
    check_merge_out(tmp_path / "empty", [], overwrite=False)
