"""The benches that run the seed article's reference scripts: how they find them, copy and patch them (fp32, outside
the repository), and what they feed them: the same records and requests as mydecide, read the same way."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch):
    """bench/ first on sys.path, as when a bench script runs; returns an importer of its modules."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    return importlib.import_module


def fake_scripts(folder: Path, dtype: str = "dtype=torch.bfloat16") -> Path:
    folder.mkdir(parents=True)
    (folder / "decision_format.py").write_text(f"import torch\n\n\ndef load(base, {dtype}):\n    return base\n")
    for name in ("train.py", "serve.py", "evaluate.py", "prepare_data.py"):
        (folder / name).write_text("# stand-in\n")
    return folder


def test_absent_or_incomplete_seed_scripts_are_a_reason_to_skip(bench, tmp_path: Path) -> None:
    common = bench("_common")
    expected = ROOT.parent / "shared" / "seed-scripts"
    assert expected == common.SEED_SCRIPTS
    found, why = common.find_seed_scripts(tmp_path / "nowhere")
    assert found is None and str(tmp_path / "nowhere") in why and "--seed-scripts" in why
    folder = fake_scripts(tmp_path / "seed")
    (folder / "serve.py").unlink()
    found, why = common.find_seed_scripts(folder)
    assert found is None and "serve.py" in why
    assert common.find_seed_scripts(folder, needed=("decision_format.py", "train.py")) == (folder.resolve(), "")


def test_the_copy_loads_in_fp32_outside_the_repository_and_leaves_the_originals_alone(bench, tmp_path: Path) -> None:
    common = bench("_common")
    source = fake_scripts(tmp_path / "seed")
    copy = common.seed_copy(source, tmp_path / "copy")
    assert "dtype=torch.float32" in (copy / "decision_format.py").read_text()
    assert "bfloat16" not in (copy / "decision_format.py").read_text()
    assert "dtype=torch.bfloat16" in (source / "decision_format.py").read_text()
    assert sorted(p.name for p in copy.iterdir()) == sorted(common.SEED_FILES)
    with pytest.raises(ValueError, match="never copied into the repository"):
        common.seed_copy(source, ROOT / "bench" / "seed-copy")
    assert not (ROOT / "bench" / "seed-copy").exists()
    with pytest.raises(ValueError, match="exactly once"):
        common.seed_copy(fake_scripts(tmp_path / "other", dtype="dtype=None"), tmp_path / "copy2")


def test_both_wire_formats_pass_the_answer_check_and_a_missing_distribution_fails(bench) -> None:
    serve = bench("bench_serve")
    body = serve.request_body(3)
    assert body["state"] != serve.request_body(4)["state"] and body["questions"] == serve.QUESTIONS
    answers = {}
    for name, q in serve.QUESTIONS.items():
        if q["type"] == "noul":
            answers[name] = {"type": "noul", "noul": 0.7}
            continue
        keys = list(q["criteria"]) if q["type"] == "choice" else [str(i) for i in range(len(q["criteria"]))]
        answers[name] = {"type": q["type"], "probabilities": {k: 1 / len(keys) for k in keys}}
    serve.check_answers("seed", {"answers": answers, "usage": {"input_tokens": 1, "output_tokens": 0}})
    team = next(n for n, q in serve.QUESTIONS.items() if q["type"] == "choice")
    broken = {**answers, team: {"type": "choice", "choice": "billing"}}
    with pytest.raises(RuntimeError, match="no distribution"):
        serve.check_answers("seed", {"answers": broken})


def test_the_seed_reads_the_bench_records_as_mydecide_does(bench, tmp_path: Path) -> None:
    """Through the seed's own options() and target(): the same options in the same order and the same targets."""
    common = bench("_common")
    scripts, why = common.find_seed_scripts(needed=("decision_format.py", "train.py"))
    if scripts is None:
        pytest.skip(why)
    copy = common.seed_copy(scripts, tmp_path / "copy")
    sys.path.insert(0, str(copy))
    try:
        decision_format = importlib.import_module("decision_format")
    finally:
        sys.path.remove(str(copy))
        sys.modules.pop("decision_format", None)
    from mydecide.records import parse_record

    train_command = bench("bench_train_command")
    for row in bench("bench_train").make_rows(4):
        seed = train_command.seed_record(row)
        (record,) = parse_record(row)
        options = decision_format.options(seed["question"])
        assert tuple(key for key, _ in options) == record.question.options
        assert decision_format.target(seed, options) == pytest.approx(list(record.target))
