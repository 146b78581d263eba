"""The converter contract every module in data_sources/ keeps: docstring, signature, options, limit, records.

Runs each converter that works offline on its small local input (a fixture or the shipped sample) and checks
that every record it yields passes the shared validator (mydecide.records.parse_record).
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import data_sources
from mydecide.records import parse_record

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data_sources"

# kind → (path or None for the shipped sample, options): one offline input per source.
OFFLINE_INPUTS: dict[str, tuple[Path | None, dict[str, Any]]] = {
    "banking77": (FIXTURES / "banking77" / "train.csv", {}),
    "boolq": (FIXTURES / "boolq" / "dev.jsonl", {}),
    "sst5": (FIXTURES / "sst5" / "dev.txt", {}),
    "ocnli": (FIXTURES / "ocnli" / "dev.json", {}),
    "jsonl": (FIXTURES / "generic" / "records.jsonl", {}),
    "csv": (
        FIXTURES / "generic" / "tickets.csv",
        {"type": "noul", "instructions": "Is it urgent?", "state_column": "body", "answer_column": "urgent"},
    ),
    "datasets": (
        FIXTURES / "generic" / "tickets.csv",
        {"type": "noul", "instructions": "Is it urgent?", "fields": {"state": "body", "answer": "urgent"}},
    ),
    "jevbench": (FIXTURES / "jevbench" / "cases.jsonl", {"gold": str(FIXTURES / "jevbench" / "gold.jsonl")}),
    "vader": (None, {}),
    "spamassassin": (None, {}),
    "rotten_tomatoes": (None, {}),
    "convention": (None, {}),
    "conll": (FIXTURES / "spans" / "ner.conll", {}),
    "span_jsonl": (FIXTURES / "spans" / "spans.jsonl", {}),
    "pii": (None, {}),
}
SHIPPED = ["vader", "spamassassin", "rotten_tomatoes", "convention"]


def source_names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(data_sources.__path__) if not m.name.startswith("_"))


def run(kind: str, **extra: Any) -> list[dict[str, Any]]:
    path, options = OFFLINE_INPUTS[kind]
    module = importlib.import_module(f"data_sources.{kind}")
    return list(module.convert(None if path is None else str(path), **options, **extra))


def test_every_source_module_is_covered_here() -> None:
    assert set(source_names()) - {"parquet"} == set(OFFLINE_INPUTS)


@pytest.mark.parametrize("kind", source_names())
def test_module_has_a_one_line_description_and_the_convert_signature(kind: str) -> None:
    module = importlib.import_module(f"data_sources.{kind}")
    first = (module.__doc__ or "").splitlines()[0]
    assert first.strip() and first.endswith((".", ")")) and len(first) <= 110
    params = inspect.signature(module.convert).parameters
    assert list(params)[:3] == ["path", "limit", "seed"]
    assert params["path"].default is None and params["limit"].default is None and params["seed"].default == 13
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for name, p in params.items() if name != "path")


@pytest.mark.parametrize("kind", sorted(OFFLINE_INPUTS))
def test_unknown_option_is_a_type_error_naming_it(kind: str) -> None:
    with pytest.raises(TypeError, match="no_such_option"):
        run(kind, no_such_option=1)


@pytest.mark.parametrize("kind", sorted(OFFLINE_INPUTS))
def test_limit_caps_yielded_rows_including_error_rows(kind: str) -> None:
    everything = run(kind)
    assert len(everything) >= 3
    assert run(kind, limit=2) == everything[:2]
    assert run(kind, limit=0) == []


@pytest.mark.parametrize("kind", sorted(OFFLINE_INPUTS))
def test_rows_are_records_or_error_rows_and_valid_records_pass_the_validator(kind: str) -> None:
    rows = run(kind)
    for row in rows:
        json.dumps(row)  # plain JSON only
        where = row["_where"]
        assert isinstance(where, str) and where.rsplit(":", 1)[1].isdigit()
        if "_error" in row:
            assert set(row) == {"_where", "_error", "raw"} and row["_error"]
            continue
        record = {k: v for k, v in row.items() if k != "_where"}
        parsed = parse_record(record)  # raises RecordError if the converter made a bad record
        assert parsed and all(r.id for r in parsed)
    assert run(kind) == rows  # deterministic


@pytest.mark.parametrize("kind", sorted(OFFLINE_INPUTS))
def test_ids_are_unique_and_stable(kind: str) -> None:
    ids = [r["id"] for r in run(kind) if "_error" not in r and "id" in r]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(
    "kind",
    [
        "jsonl",
        "csv",
        "parquet",
        "datasets",
        "banking77",
        "boolq",
        "sst5",
        "ocnli",
        "jevbench",
        "vader",
        "spamassassin",
        "rotten_tomatoes",
        "convention",
        "conll",
        "span_jsonl",
        "pii",
    ],
)
def test_missing_file_raises_file_not_found_naming_the_path(kind: str, tmp_path: Path) -> None:
    module = importlib.import_module(f"data_sources.{kind}")
    missing = tmp_path / "nowhere" / "data.csv"
    options = {"type": "noul", "instructions": "Is it?"} if kind in ("csv", "parquet", "datasets") else {}
    with pytest.raises(FileNotFoundError, match="nowhere"):
        list(module.convert(str(missing), **options))


@pytest.mark.parametrize("kind", SHIPPED)
def test_shipped_sample_answers_are_options_and_labels_are_balanced(kind: str) -> None:
    records = [r for r in run(kind) if "_error" not in r]
    assert 1000 <= len(records) <= 2000
    counts: Counter[str] = Counter()
    for r in records:
        q = r["question"]
        if q["type"] == "choice":
            assert r["answer"] in q["criteria"]
        elif q["type"] == "score":
            assert 0 <= r["answer"] < len(q["criteria"])
        else:
            assert isinstance(r["answer"], bool)
        counts[str(r["answer"])] += 1
    assert len(counts) >= 2
    assert max(counts.values()) / len(records) <= 0.55  # no class dominates


def test_samples_directory_stays_small() -> None:
    samples = Path(data_sources.__file__).parent / "samples"
    assert sum(f.stat().st_size for f in samples.iterdir()) < 4 * 1024 * 1024
    assert (samples / "ATTRIBUTION.md").read_text(encoding="utf-8").count("License") >= 4
