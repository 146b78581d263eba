"""docs/python-api.md runs as a notebook would: its python cells, in order, as one script, on the guide's
tickets.yaml and CSV, with a tiny model in place of smollm2-135m and the smoke training recipe in place of the
demo's (as tests/test_guide.py does)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_guide import blocks, write_tickets

PAGE = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"
SMOKE = PAGE.parents[1] / "recipes" / "train" / "smoke.yaml"  # a few updates, in place of the demo recipe


def cells() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)


def test_the_python_api_page_runs_as_a_notebook(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tickets.yaml").write_text(blocks("yaml")[0], encoding="utf-8")
    write_tickets(tmp_path / "data" / "tickets.csv")
    script = "\n".join(cells()).replace("smollm2-135m", str(tiny_llama_dir))
    script = script.replace("recipes/train/demo.yaml", str(SMOKE))
    assert len(cells()) == 5
    namespace: dict[str, object] = {}
    exec(compile(script, str(PAGE), "exec"), namespace)

    import mydecide

    data, run, result = namespace["data"], namespace["run"], namespace["result"]
    assert isinstance(data, mydecide.Prepared) and data.splits["train"] > 0
    assert isinstance(run, mydecide.Trained) and (run.adapter / "adapter_config.json").is_file()
    assert namespace["dev_lines"]
    assert isinstance(result, mydecide.Evaluated) and result.report["classes"][0]["task"] == "team"
    answer = namespace["answer"]
    assert isinstance(answer, mydecide.ChoiceAnswer)
    assert answer.choice == max(answer.probabilities, key=answer.probabilities.__getitem__)
    assert sum(answer.probabilities.values()) == pytest.approx(1.0)
    printed = capsys.readouterr().out
    # prepare's per-task summary reached log=print
    assert f"task {'team':<20} kept" in printed and f"task {'urgency':<20} kept" in printed
