"""Per-type temperatures, temperatures.json, and the refusal to fit on a training split."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from scipy.special import expit
from typer.testing import CliRunner

from mydecide.calibration.run import calibrate, check_calibration_data
from mydecide.calibration.temperatures import (
    TemperatureTable,
    fit_temperatures,
    load_temperatures,
    option_bucket,
)
from mydecide.cli import app
from mydecide.data.split import protected_split
from mydecide.errors import UserError
from mydecide.records import parse_record
from mydecide.scoring.probabilities import answer_rows, to_probabilities

TRUE_T = {"choice": 2.0, "noul": 0.5, "score": 1.5, "set": 3.0}


def _sampled(qtype: str, n: int, rng: np.random.Generator, k: int | None = None) -> list[tuple]:
    """n (type, K, logits, target) items whose labels are drawn from the model at temperature TRUE_T[qtype]."""
    t = TRUE_T[qtype]
    items = []
    for _ in range(n):
        kk = k or {"noul": 2, "set": 3}.get(qtype, int(rng.integers(3, 6)))
        z = rng.normal(0.0, 3.0, size=kk)
        if qtype == "set":  # each label applies with probability sigmoid(d / T)
            y = (rng.random(kk) < expit(z / t)).astype(float)
        else:  # Gumbel-max: a draw from softmax(z / T)
            y = np.eye(kk)[int(np.argmax(z / t + rng.gumbel(size=kk)))]
        items.append((qtype, kk, z, y))
    return items


@pytest.fixture(scope="module")
def sampled_items() -> list[tuple]:
    rng = np.random.default_rng(7)
    return [item for qtype in TRUE_T for item in _sampled(qtype, 12000, rng)]


def test_each_type_recovers_its_own_temperature_within_2_percent(sampled_items: list[tuple]) -> None:
    fit = fit_temperatures(sampled_items)
    for qtype, true_t in TRUE_T.items():
        assert fit["types"][qtype]["temperature"] == pytest.approx(true_t, rel=0.02), qtype
        assert fit["types"][qtype]["n"] == 12000
    assert fit["types"]["set"]["rows"] == 3 * 12000  # one binary row per label
    assert not any(summary["at_bound"] for summary in fit["types"].values())
    for summary in (*fit["types"].values(), fit["overall"]):
        assert summary["log_loss_after"] <= summary["log_loss_before"] + 1e-12


def test_temperatures_never_change_an_argmax() -> None:
    rng = np.random.default_rng(8)
    items = [item for qtype in TRUE_T for item in _sampled(qtype, 1500, rng)]
    fit = fit_temperatures(items, by_bucket=True, min_rows=50)
    table = TemperatureTable(
        {t: s["temperature"] for t, s in fit["types"].items()},
        {t: {b: s["temperature"] for b, s in bs.items()} for t, bs in fit["buckets"].items()},
    )
    for qtype, k, z, _ in items:
        t = table(qtype, k)
        assert t != 1.0
        before, after = to_probabilities(qtype, z, 1.0), to_probabilities(qtype, z, t)
        if qtype == "set":  # each label's side of 0.5 is kept
            assert np.array_equal(before >= 0.5, after >= 0.5)
        else:
            assert int(np.argmax(before)) == int(np.argmax(after))


def test_set_rows_are_binary_softmax_rows_equal_to_the_sigmoid() -> None:
    rows = answer_rows("set", np.array([1.5, -0.3]), [1.0, 0.25], logits=True)
    assert [list(y) for _, y in rows] == [[1.0, 0.0], [0.25, 0.75]]
    for (z, _), d in zip(rows, (1.5, -0.3), strict=True):
        assert to_probabilities("choice", z, 2.0)[0] == pytest.approx(expit(d / 2.0), abs=1e-12)


def test_option_buckets() -> None:
    assert [option_bucket(k) for k in (2, 3, 4, 5, 8, 9, 16, 17, 26, 27, 255)] == [
        "2",
        "3-4",
        "3-4",
        "5-8",
        "5-8",
        "9-16",
        "9-16",
        "17-26",
        "17-26",
        "27+",
        "27+",
    ]


def test_small_buckets_fall_back_to_their_type_and_small_types_to_one() -> None:
    rng = np.random.default_rng(3)
    items = _sampled("choice", 3000, rng, k=3) + _sampled("choice", 10, rng, k=6) + _sampled("score", 5, rng)
    fit = fit_temperatures(items, by_bucket=True, min_rows=40)
    choice_t = fit["types"]["choice"]["temperature"]
    assert fit["buckets"]["choice"]["3-4"]["temperature"] != choice_t  # fitted on its own 3000 rows
    assert "fallback" not in fit["buckets"]["choice"]["3-4"]
    assert fit["buckets"]["choice"]["5-8"]["temperature"] == choice_t
    assert fit["buckets"]["choice"]["5-8"]["n"] == 10 and "fallback" in fit["buckets"]["choice"]["5-8"]
    assert fit["types"]["score"]["temperature"] == 1.0 and "fallback" in fit["types"]["score"]
    # every logit seen once with each label: no signal, the log loss falls all the way to the upper edge of T
    noise = [("noul", 2, np.array([d, 0.0]), np.eye(2)[gold]) for d in rng.normal(size=100) for gold in (0, 1)]
    assert fit_temperatures(noise)["types"]["noul"]["at_bound"]


def test_load_temperatures_round_trip_and_missing_type(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    items = _sampled("choice", 400, rng, k=3) + _sampled("choice", 5, rng, k=7) + _sampled("noul", 300, rng)
    fit = fit_temperatures(items, by_bucket=True, min_rows=50)
    path = tmp_path / "temperatures.json"
    path.write_text(json.dumps(fit))
    table = load_temperatures(path)
    assert table("choice", 3) == fit["buckets"]["choice"]["3-4"]["temperature"]
    assert table("choice", 7) == fit["types"]["choice"]["temperature"]  # bucket fell back: the type's T
    assert table("noul", 2) == fit["types"]["noul"]["temperature"]
    assert table("score", 5) == 1.0 and table("set", 3) == 1.0  # types the file does not list


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"temperature": 2}', "needs a 'types' object"),
        ('{"types": {"choice": {"temperature": -1}}}', "types.choice: temperature must be a finite number > 0"),
        (
            '{"types": {"noul": 1.2}, "buckets": {"choice": {"3-4": {"temperature": "hot"}}}}',
            "buckets.choice.3-4: temperature must be",
        ),
    ],
)
def test_load_temperatures_names_the_file_and_key(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as err:
        load_temperatures(path)
    assert str(path) in str(err.value)
    with pytest.raises(FileNotFoundError, match=r"no-such\.json"):
        load_temperatures(tmp_path / "no-such.json")


# ------------------------------------------------------------------------------------------ refusing train splits


def _records_file(path: Path, n: int = 4) -> Path:
    rows = [
        {
            "task": "t",
            "state": f"state {i}",
            "question": {"type": "noul", "instructions": "Is it on?"},
            "answer": i % 2 == 0,
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_refuses_files_named_like_training_or_test_splits(tmp_path: Path) -> None:
    for name in ("train.jsonl", "test.jsonl", "heldout_tasks.jsonl"):
        path = _records_file(tmp_path / name)
        with pytest.raises(ValueError, match=f"refusing to calibrate on .*{name}.*--force"):
            check_calibration_data(path)
        check_calibration_data(path, force=True)  # forced: allowed
    (tmp_path / "elsewhere").mkdir()  # beside the train.jsonl above it would hold its rows, and be refused for them
    check_calibration_data(_records_file(tmp_path / "elsewhere" / "dev.jsonl"))


def test_refuses_a_renamed_copy_of_a_split_the_manifest_records(tmp_path: Path) -> None:
    renamed = _records_file(tmp_path / "copy_of_split.jsonl")
    dev = _records_file(tmp_path / "dev.jsonl", n=3)
    digest = hashlib.sha256(renamed.read_bytes()).hexdigest()
    outputs = {"train.jsonl": {"rows": 4, "sha256": digest}, "dev.jsonl": {"rows": 3, "sha256": "0" * 64}}
    (tmp_path / "manifest.json").write_text(json.dumps({"outputs": outputs}))
    assert "has the sha256 that" in (protected_split(renamed) or "")
    assert "train.jsonl, the training split" in (protected_split(renamed) or "")
    assert protected_split(dev) is None


def test_cli_refuses_a_training_split_before_loading_any_model(tmp_path: Path) -> None:
    train = _records_file(tmp_path / "train.jsonl")
    result = CliRunner().invoke(
        app,
        ["calibrate", "--model", str(tmp_path / "no-model"), "--data", str(train), "--out", str(tmp_path / "t.json")],
    )
    assert result.exit_code == 2
    assert "refusing to calibrate" in result.output and "--force" in result.output
    assert not (tmp_path / "t.json").exists()


# -------------------------------------------------------------------------------------------- calibrate a model


def test_calibrate_with_a_scorer_fits_each_type_on_the_records_logits() -> None:
    rng = np.random.default_rng(5)
    records, logits = [], {}
    for i in range(600):
        z = rng.normal(0.0, 3.0, size=3)
        gold = int(np.argmax(z / 2.0 + rng.gumbel(size=3)))
        record = parse_record(
            {
                "task": "t",
                "state": f"s{i}",
                "question": {"type": "choice", "instructions": "Pick", "criteria": ["a", "b", "c"]},
                "answer": "abc"[gold],
            }
        )[0]
        records.append(record)
        logits[record.state] = z

    def scorer(items, orders=None):
        return [logits[state] for state, _ in items]

    fit = calibrate(None, records, scorer=scorer, progress=False)
    assert fit["types"]["choice"]["temperature"] == pytest.approx(2.0, rel=0.15)  # 600 rows: a loose bound
    assert fit["types"]["choice"]["n"] == 600


def test_cli_calibrate_writes_temperatures_json(tiny_llama_dir: Path, tmp_path: Path) -> None:
    dev = _records_file(tmp_path / "dev.jsonl", n=6)
    out = tmp_path / "cal" / "temperatures.json"
    result = CliRunner().invoke(
        app,
        [
            "calibrate",
            "--model",
            str(tiny_llama_dir),
            "--data",
            str(dev),
            "--out",
            str(out),
            "--min-rows",
            "2",
            "--by-bucket",
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert document["format"] == "mydecide.temperatures/1"
    assert document["data"] == str(dev) and document["model"] == str(tiny_llama_dir)
    assert document["types"]["noul"]["n"] == 6 and document["by_bucket"] is True
    assert set(document["types"]["noul"]) >= {
        "temperature",
        "log_loss_before",
        "log_loss_after",
        "ece_before",
        "ece_after",
    }
    assert document["provenance"]["versions"]["torch"]
    assert load_temperatures(out)("noul", 2) == document["types"]["noul"]["temperature"]
    assert (tmp_path / "cal" / "temperatures.recipe.yaml").is_file()


def test_the_overall_block_leaves_span_questions_to_their_own_row() -> None:
    rng = np.random.default_rng(9)
    others = [item for qtype in ("choice", "noul") for item in _sampled(qtype, 300, rng)]
    spans = []
    for _ in range(40):  # 60 words × 2 labels each, mostly "no": they would swamp the pooled rows
        z = rng.normal(-3.0, 2.0, size=120)
        spans.append(("span", 2, z, (rng.random(120) < expit(z)).astype(float)))
    with_spans = fit_temperatures(others + spans, min_rows=10)
    alone = fit_temperatures(others, min_rows=10)
    assert with_spans["types"]["span"]["n"] == 40 and with_spans["types"]["span"]["rows"] == 40 * 120
    assert with_spans["overall"] == alone["overall"]
    only_spans = fit_temperatures(spans, min_rows=10)  # nothing else: the overall block is theirs
    assert only_spans["overall"]["n"] == 40 and only_spans["overall"]["rows"] == 40 * 120


@pytest.mark.parametrize("case", ["the dev file", "in the adapter", "in a prepare output", "a foreign file", "a dir"])
def test_calibrate_refuses_an_out_it_would_not_own_before_loading_any_model(case: str, tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    dev = _records_file(tmp_path / "mine" / "dev.jsonl", n=4)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (tmp_path / "prep").mkdir()
    (tmp_path / "prep" / "manifest.json").write_text("{}")
    (tmp_path / "notes.json").write_text('{"mine": true}')
    (tmp_path / "folder").mkdir()
    out, message = {
        "the dev file": (dev, "would overwrite the dev data"),
        "in the adapter": (adapter / "temperatures.json", "is inside the adapter"),
        "in a prepare output": (tmp_path / "prep" / "t.json", "is inside a prepare output"),
        "a foreign file": (tmp_path / "notes.json", "exists and is not a temperatures.json written by calibrate"),
        "a dir": (tmp_path / "folder", "is a directory"),
    }[case]
    before = {str(p): p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    args = ["calibrate", "--model", str(tmp_path / "no-model"), "--adapter", str(adapter), "--data", str(dev)]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and str(out) in lines[0], lines
    assert {str(p): p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == before


def test_the_out_checks_follow_links_as_before(tmp_path: Path) -> None:
    """check_temperatures_out asks io.holds (links and .. resolved) whether --out lies in the dev data or the adapter;
    a link in the place of --out or of the recipe beside it is refused, never replaced or followed (issue 64)."""
    from mydecide.calibration.run import check_temperatures_out
    from mydecide.calibration.temperatures import TEMPERATURES_FORMAT

    split = tmp_path / "data" / "dev"  # a partitioned dev split
    split.mkdir(parents=True)
    _records_file(split / "part-00000.jsonl", n=2)
    adapter = tmp_path / "run" / "adapter"
    adapter.mkdir(parents=True)
    (tmp_path / "into-adapter").symlink_to(adapter)
    (tmp_path / "into-split").symlink_to(split)
    refused = {
        split / "t.json": "would overwrite the dev data",
        tmp_path / "into-split" / "sub" / ".." / "t.json": "would overwrite the dev data",
        tmp_path / "into-adapter" / "t.json": "is inside the adapter",
        adapter / "sub" / "t.json": "is inside the adapter",
    }
    for out, message in refused.items():
        with pytest.raises(ValueError, match=message):
            check_temperatures_out(out, split, str(adapter))
    dev = _records_file(tmp_path / "t.recipe.yaml", n=2)  # dev data named like the recipe beside --out t.json
    with pytest.raises(ValueError, match="would overwrite the dev data"):
        check_temperatures_out(tmp_path / "t.json", dev, None)
    check_temperatures_out(tmp_path / "elsewhere" / "t.json", split, str(adapter))  # no error
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "t.json").write_text(json.dumps({"format": TEMPERATURES_FORMAT}))
    (tmp_path / "elsewhere" / "t.recipe.yaml").symlink_to(dev)
    with pytest.raises(ValueError, match=r"elsewhere/t\.recipe\.yaml: is a symbolic link; an output is written as"):
        check_temperatures_out(tmp_path / "elsewhere" / "t.json", dev, None)
    (tmp_path / "link.json").symlink_to(tmp_path / "elsewhere" / "t.json")
    with pytest.raises(ValueError, match=r"link\.json: is a symbolic link; an output is written as a plain file"):
        check_temperatures_out(tmp_path / "link.json", dev, None)
    assert (tmp_path / "link.json").is_symlink() and dev.read_text().count("\n") == 2


@pytest.mark.parametrize("out", [".", "..", "/"])
def test_an_out_with_no_file_name_is_refused_as_a_directory(tmp_path: Path, out: str) -> None:
    """``--out .`` was a ValueError traceback from pathlib ("PosixPath('.') has an empty name") once the recipe
    beside --out was checked for a link."""
    from mydecide.calibration.run import check_temperatures_out

    with pytest.raises(UserError) as err:
        check_temperatures_out(Path(out), _records_file(tmp_path / "dev.jsonl", n=2), None)
    assert str(err.value) == f"{out}: is a directory; give the temperatures file's path (e.g. {out}/temperatures.json)"
