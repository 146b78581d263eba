"""Partitioned data, as a cluster reads and writes it: sources given as a directory or a glob of part files
(JSONL, Parquet), and `prepare`'s splits written as part files (``output.format`` / ``output.rows_per_file``) that
`train`, `calibrate` and `evaluate` read like the single files, each part checked against the manifest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prepare_builders import NOUL, SCORE, make, write_jsonl

from mydecide.config import DataRecipe, TrainRecipe
from mydecide.data.prepare import prepare
from mydecide.manifest import read_manifest, split_digest, split_path
from mydecide.recipe_loading import load_recipe
from mydecide.recipe_parsing import RecipeError
from mydecide.record_files import load_records
from mydecide.records import RecordError

SMOKE = Path(__file__).resolve().parents[2] / "recipes" / "train" / "smoke.yaml"


def rows(n: int = 120) -> list[dict]:
    return [make(i, question=(None, NOUL, SCORE)[i % 3], task=("route", "outage", "urgency")[i % 3]) for i in range(n)]


def recipe(path: str, **update: object) -> DataRecipe:
    return DataRecipe.model_validate(
        {"sources": [{"kind": "jsonl", "path": path}], "split": {"dev_fraction": 0.2, "test_fraction": 0.2}, **update}
    )


def records_of(directory: Path) -> dict[str, list[dict]]:
    """Each split's records (an empty split, such as heldout without held-out tasks, as [])."""
    out = {}
    for split in ("train", "dev", "test", "heldout"):
        try:
            out[split] = [r.to_json() for r in load_records(split_path(directory, split))]
        except RecordError as err:
            assert "holds no records" in str(err)
            out[split] = []
    return out


@pytest.fixture
def one_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "all.jsonl", rows())


def test_a_source_given_as_a_directory_or_a_glob_of_parts_reads_the_rows_of_the_single_file(
    tmp_path: Path, one_file: Path
) -> None:
    all_rows = rows()
    shards = tmp_path / "shards"
    shards.mkdir()
    for k in range(4):
        write_jsonl(shards / f"part-{k:05d}.jsonl", all_rows[k * 30 : (k + 1) * 30])
    (shards / "_SUCCESS").write_text("")  # what Spark leaves beside its parts: skipped
    prepare(recipe(str(one_file)), tmp_path / "single")
    prepare(recipe(str(shards)), tmp_path / "directory")
    prepare(recipe(str(shards / "part-*.jsonl")), tmp_path / "glob")
    expected = records_of(tmp_path / "single")
    assert sum(map(len, expected.values())) == 120
    assert records_of(tmp_path / "directory") == expected
    assert records_of(tmp_path / "glob") == expected
    # rejects name the part file and its line
    write_jsonl(shards / "part-00004.jsonl", [{"id": "bad", "task": "route", "state": "x"}])
    prepare(recipe(str(shards)), tmp_path / "with_bad")
    rejects = [json.loads(line) for line in (tmp_path / "with_bad" / "rejects.jsonl").read_text().splitlines()]
    assert [r["where"] for r in rejects if r["raw"].get("id") == "bad"] == ["part-00004.jsonl:1"]
    # a file of another format among the parts is named, not skipped
    (shards / "notes.txt").write_text("not data")
    with pytest.raises(RecipeError, match=r"notes\.txt: not a \.jsonl / \.ndjson / \.json file"):
        prepare(recipe(str(shards)), tmp_path / "with_stray")


def test_a_parquet_source_reads_a_directory_of_parts(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    texts = [f"ticket {i}: the {('printer', 'server', 'invoice')[i % 3]} is broken again" for i in range(60)]
    for k in range(3):
        pq.write_table(
            pa.table({"text": texts[k * 20 : (k + 1) * 20], "label": [i % 2 for i in range(k * 20, (k + 1) * 20)]}),
            shards / f"part-{k}.parquet",
        )
    spec = {"kind": "parquet", "path": str(shards), "options": {"type": "noul", "instructions": "Is it urgent?"}}
    data = DataRecipe.model_validate({"sources": [spec], "dedup": {"near": {"enabled": False}}})
    prepare(data, tmp_path / "out")
    manifest = read_manifest(tmp_path / "out")
    assert manifest is not None and manifest["conservation"]["kept"] == 60


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_partitioned_outputs_hold_the_records_of_the_single_files(tmp_path: Path, one_file: Path, fmt: str) -> None:
    prepare(recipe(str(one_file)), tmp_path / "single")
    out = tmp_path / "parts"
    prepare(recipe(str(one_file), output={"format": fmt, "rows_per_file": 25}), out)
    assert not (out / "train.jsonl").exists()
    train_parts = sorted(p.name for p in (out / "train").iterdir())
    assert train_parts == [f"part-{k:05d}.{fmt}" for k in range(len(train_parts))] and len(train_parts) >= 2
    assert records_of(out) == records_of(tmp_path / "single")
    manifest = read_manifest(out)
    assert manifest is not None
    listed = {name: entry for name, entry in manifest["outputs"].items() if name.startswith("train/")}
    assert sorted(listed) == [f"train/{name}" for name in train_parts]
    assert sum(entry["rows"] for entry in listed.values()) == manifest["splits"]["train"]["rows"]
    assert all(entry["rows"] <= 25 for entry in listed.values())
    if fmt == "parquet":
        table = pq.read_table(out / "train" / train_parts[0])
        assert table.column_names == ["id", "task", "type", "lang", "record"]
        assert json.loads(table.column("record")[0].as_py())["id"] == table.column("id")[0].as_py()


def test_parquet_without_rows_per_file_writes_one_part_and_a_rerun_replaces_the_layout(
    tmp_path: Path, one_file: Path
) -> None:
    out = tmp_path / "out"
    prepare(recipe(str(one_file), output={"format": "parquet"}), out)
    assert [p.name for p in (out / "dev").iterdir()] == ["part-00000.parquet"]
    prepare(recipe(str(one_file)), out)  # back to single files: the split directories go
    assert (out / "train.jsonl").is_file() and not (out / "train").exists()


def test_a_split_directory_that_mixes_runs_is_refused(tmp_path: Path, one_file: Path) -> None:
    out = tmp_path / "parts"
    prepare(recipe(str(one_file), output={"format": "jsonl", "rows_per_file": 20}), out)
    parts = sorted((out / "train").iterdir())
    shutil.copy(parts[0], out / "train" / "part-00099.jsonl")  # a part the manifest does not list
    with pytest.raises(ValueError, match=r"part-00099\.jsonl"):
        load_records(out / "train")
    (out / "train" / "part-00099.jsonl").unlink()
    parts[1].write_text(parts[1].read_text().replace('"r', '"x', 1))  # a part changed after prepare
    with pytest.raises(ValueError, match="does not match the sha256"):
        load_records(out / "train")


def test_a_parquet_file_of_records_is_read_with_its_row_in_errors(tmp_path: Path) -> None:
    path = tmp_path / "dev.parquet"
    good = json.dumps(make(1, question=NOUL))
    pq.write_table(pa.table({"record": [good, '{"id": 2, "task": "t"'], "id": ["1", "2"]}), path)
    with pytest.raises(ValueError, match=r"dev.parquet:1: column 'record' is not JSON text"):
        load_records(path)
    pq.write_table(pa.table({"text": ["a"]}), path)
    with pytest.raises(ValueError, match="needs a column 'record'"):
        load_records(path)


def test_train_reads_a_partitioned_prepare_output(tiny_llama_dir: Path, tmp_path: Path, one_file: Path) -> None:
    from mydecide.training.loop import train

    data = tmp_path / "parts"
    prepare(recipe(str(one_file), output={"format": "parquet", "rows_per_file": 30}), data)
    run = train(
        load_recipe(
            SMOKE,
            [f"model={tiny_llama_dir}", f"data={data}", f"out={tmp_path / 'run'}", "optim.max_steps=2"],
            model=TrainRecipe,
        )
    )
    saved = (run / "recipe.yaml").read_text()
    assert split_digest(data / "train") in saved and split_digest(data / "dev") in saved
    assert (run / "adapter" / "adapter_config.json").is_file()
