"""`mydecide prepare` on the command line, the shipped data recipes, and converter discovery."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from prepare_builders import make, write_jsonl
from typer.testing import CliRunner

from mydecide.cli import app
from mydecide.config import DataRecipe
from mydecide.data.sources import UnknownSourceError, available_sources, load_source
from mydecide.recipe_loading import load_recipe
from mydecide.recipe_parsing import RecipeError

ROOT = Path(__file__).resolve().parents[2]
DATA_RECIPES = sorted((ROOT / "recipes" / "data").glob("*.yaml"))


def test_cli_end_to_end_with_overrides(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "records.jsonl", [make(i) for i in range(40)] + ["{oops"])
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump({"sources": [{"kind": "jsonl", "path": str(source)}], "split": {"dev_fraction": 0.1}})
    )
    out = tmp_path / "prepared"
    result = CliRunner().invoke(
        app, ["prepare", str(recipe), "--out", str(out), "split.dev_fraction=0.5", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir()} == {
        "train.jsonl",
        "dev.jsonl",
        "heldout_tasks.jsonl",
        "rejects.jsonl",
        "near_pairs.jsonl",
        "manifest.json",
        "recipe.yaml",
    }
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["recipe"]["split"]["dev_fraction"] == 0.5 and manifest["recipe"]["out"] == str(out)
    assert manifest["conservation"]["kept"] == 40 and manifest["conservation"]["rejected"] == 1
    dev = (out / "dev.jsonl").read_text().count("\n")
    assert 10 <= dev <= 30  # half of 40, by hash
    assert "input 41 = kept 40 + rejected 1 + removed 0" in result.stdout
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert [r["where"] for r in rejects] == ["records.jsonl:41"]


def test_cli_errors_are_one_line_naming_the_key(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("sources: [{kind: jsonl, path: x.jsonl}]\ndedup: {near: {treshold: 0.5}}\n")
    result = CliRunner().invoke(app, ["prepare", str(recipe), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "dedup.near.treshold" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(app, ["prepare"])
    assert result.exit_code == 2 and "--list-sources" in result.output


def test_list_sources_shows_every_converter_with_its_description() -> None:
    result = CliRunner().invoke(app, ["prepare", "--list-sources"])
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    names = [info.name for info in available_sources()]
    assert len(lines) == len(names) and {"jsonl", "csv", "parquet"} <= set(names)
    for info, line in zip(available_sources(), lines, strict=True):
        module = load_source(info.name)
        assert (module.__doc__ or "").strip().splitlines()[0] == info.description
        assert line.split()[0] == info.name and line.endswith(info.description)
    assert not any(name.startswith("_") for name in names)


def test_unknown_source_kind_lists_the_known_ones() -> None:
    with pytest.raises(UnknownSourceError, match=r"unknown source kind 'bogus'; known kinds: .*csv.*jsonl"):
        load_source("bogus")


@pytest.mark.parametrize(
    "key, where",
    [
        ("colour: red", "colour"),
        ("split: {dev_fractoin: 0.1}", "split.dev_fractoin"),
        ("sources: [{kind: jsonl, pth: a}]", "sources.0.pth"),
        ("augment: {anonymise_options: 0.1}", "augment.anonymise_options"),
    ],
)
def test_unknown_recipe_keys_are_errors_naming_the_key(tmp_path: Path, key: str, where: str) -> None:
    recipe = tmp_path / "r.yaml"
    text = key if key.startswith("sources") else "sources: [{kind: jsonl, path: a.jsonl}]\n" + key
    recipe.write_text(text + "\n")
    with pytest.raises(RecipeError, match=rf"r\.yaml: {where}: unknown key"):
        load_recipe(recipe, model=DataRecipe)


def test_fractions_must_leave_training_rows() -> None:
    with pytest.raises(ValueError, match="dev_fraction"):
        DataRecipe.model_validate(
            {"sources": [{"kind": "jsonl"}], "split": {"dev_fraction": 0.6, "test_fraction": 0.4}}
        )


@pytest.mark.parametrize("path", DATA_RECIPES, ids=lambda p: p.name)
def test_every_data_recipe_loads_and_names_real_sources_and_files(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("#") and "mydecide prepare recipes/data/" + path.name in text
    recipe = load_recipe(path, model=DataRecipe)
    names = {info.name for info in available_sources()}
    for source in recipe.sources:
        assert source.kind in names
        assert source.path is None or (ROOT / source.path).exists() or "your" in source.path


def test_there_are_data_recipes() -> None:
    assert {p.name for p in DATA_RECIPES} >= {"demo.yaml", "example.yaml"}


def test_demo_recipe_gives_the_demo_its_sizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mydecide.data.prepare import prepare

    monkeypatch.chdir(ROOT)
    manifest = prepare(load_recipe(ROOT / "recipes/data/demo.yaml", model=DataRecipe), tmp_path)
    split = next(s for s in manifest["steps"] if s["step"] == "split")
    trained = split["by_task"]["train"]
    assert set(trained) == {"vader_sentiment_score", "spam_detection", "rotten_tomatoes_kind", "pii_spans"}
    assert all(200 <= n <= 300 for task, n in trained.items() if task != "pii_spans"), trained
    assert 60 <= trained["pii_spans"] <= 100, trained  # capped at 190: span questions cost several times the others
    assert split["by_task"]["heldout"] == {"vader_sentiment_positive": 120}
    # dev and test: ~190 questions of each trained type, enough to fit a temperature and to judge an ECE
    for name in ("dev", "test"):
        per_type = manifest["splits"][name]["type"]
        assert all(per_type[t] >= 150 for t in ("choice", "noul", "score")) and per_type["span"] >= 40, per_type
    assert manifest["splits"]["train"]["type"].keys() == {"choice", "noul", "score", "span"}
    c = manifest["conservation"]
    assert c["input"] == c["kept"] + c["rejected"] + c["removed"]
