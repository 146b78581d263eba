"""manifest.json has one writer and one reader: what write_manifest records is what every check reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mydecide.manifest import (
    MANIFEST,
    SPLIT_FILES,
    check_against_manifest,
    listed_outputs,
    recorded_as,
    split_beside,
    write_manifest,
)


def _outputs(tmp_path: Path) -> Path:
    for name, text in (("train.jsonl", '{"a": 1}\n{"a": 2}\n'), ("dev.jsonl", '{"a": 3}\n'), ("recipe.yaml", "x: 1\n")):
        (tmp_path / name).write_text(text)
    write_manifest(tmp_path, {"steps": []}, ["train.jsonl", "dev.jsonl", "recipe.yaml"])
    return tmp_path


def test_what_is_written_is_what_is_read(tmp_path: Path) -> None:
    out = _outputs(tmp_path)
    outputs = listed_outputs(out)
    assert {name: entry["rows"] for name, entry in outputs.items()} == {
        "train.jsonl": 2,
        "dev.jsonl": 1,
        "recipe.yaml": None,
    }
    assert json.loads((out / MANIFEST).read_text())["steps"] == []
    check_against_manifest(out / "dev.jsonl")  # unchanged: passes
    (out / "dev.jsonl").write_text('{"a": 4}\n')
    with pytest.raises(ValueError, match=r"dev\.jsonl: does not match the sha256 that .*manifest\.json records"):
        check_against_manifest(out / "dev.jsonl")


def test_a_renamed_copy_is_known_by_its_digest_and_the_training_split_is_found(tmp_path: Path) -> None:
    out = _outputs(tmp_path)
    (out / "copy.jsonl").write_bytes((out / "train.jsonl").read_bytes())
    assert recorded_as(out / "copy.jsonl", [SPLIT_FILES["train"], SPLIT_FILES["dev"]]) == "train.jsonl"
    assert recorded_as(out / "dev.jsonl", [SPLIT_FILES["train"]]) is None
    assert split_beside([out / "dev.jsonl"], "train") == out / "train.jsonl"
    assert split_beside([out / "train.jsonl"], "train") is None  # the file given is that split


def test_an_unreadable_manifest_is_one_error_naming_it_and_none_is_no_check(tmp_path: Path) -> None:
    (tmp_path / "dev.jsonl").write_text('{"a": 1}\n')
    check_against_manifest(tmp_path / "dev.jsonl")  # no manifest: data written by hand
    (tmp_path / MANIFEST).write_text('{"outputs": {"dev.jsonl": {}}, "outputs": {}}')
    with pytest.raises(ValueError, match=r"manifest\.json: unreadable \(duplicate key 'outputs'\)"):
        check_against_manifest(tmp_path / "dev.jsonl")
    (tmp_path / MANIFEST).write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"manifest\.json: unreadable \(not a JSON object\)"):
        listed_outputs(tmp_path)


def test_one_digests_table_hashes_each_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mydecide import manifest

    out = _outputs(tmp_path)
    hashed: list[Path] = []
    real = manifest.sha256_file
    monkeypatch.setattr(manifest, "sha256_file", lambda path: hashed.append(Path(path)) or real(path))
    digests: manifest.Digests = {}
    check_against_manifest(out / "train.jsonl", digests)
    assert manifest.split_digest(out / "train.jsonl", digests) == real(out / "train.jsonl")
    assert hashed == [out / "train.jsonl"]  # the check's digest is the split's
    check_against_manifest(out / "train.jsonl")  # without a table: hashed again
    assert len(hashed) == 2
