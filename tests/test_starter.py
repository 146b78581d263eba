"""The recipes inside the package (a pip install has them) and ``mydecide init``'s starter recipes."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from mydecide.cli import app
from mydecide.config import DataRecipe, TrainRecipe
from mydecide.data.prepare import prepare
from mydecide.recipe_loading import load_recipe
from mydecide.recipe_parsing import RecipeError
from mydecide.starter import packaged_root
from tests.data.prepare_builders import sentence

REPO_RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_packaged_recipes_are_the_repos() -> None:
    # one copy: the repository's recipes/ is a link to the package's, so they cannot drift apart
    assert REPO_RECIPES.is_symlink() and REPO_RECIPES.resolve() == packaged_root().resolve()
    assert {"data/demo.yaml", "train/demo.yaml", "train/smoke.yaml"} <= set(tree(packaged_root()))


def test_a_recipes_path_absent_here_is_read_from_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe("recipes/train/demo.yaml", model=TrainRecipe)
    assert recipe == load_recipe(REPO_RECIPES / "train" / "demo.yaml", model=TrainRecipe)
    with pytest.raises(RecipeError, match=r"recipes/train/nope\.yaml: no such recipe file"):
        load_recipe("recipes/train/nope.yaml", model=TrainRecipe)
    (tmp_path / "recipes" / "train").mkdir(parents=True)
    (tmp_path / "recipes" / "train" / "demo.yaml").write_text("seed: 7\n")  # a file of the user's own comes first
    assert load_recipe("recipes/train/demo.yaml", model=TrainRecipe).seed == 7


def test_init_writes_recipes_for_a_users_csv_that_prepare_and_train_take(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    with (tmp_path / "data" / "tickets.csv").open("w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(["id", "text", "team", "urgent", "note"])
        for k in range(30):
            out.writerow([f"t-{k}", sentence(k), ["billing", "support"][k % 2], ["yes", "no"][k % 3 == 0], f"n{k}"])
    result = CliRunner().invoke(app, ["init", "starter", "--csv", "data/tickets.csv"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "  state: column 'text', ids: column 'id'",
        "  question 'team': choice of 2 options",
        "  question 'urgent': noul",
        "  column 'note' left out: 30 distinct values (more than 20)",
        "wrote starter/data.yaml and starter/train.yaml; next:",
        "  mydecide prepare starter/data.yaml",
        "  mydecide train starter/train.yaml",
    ]
    data = load_recipe("starter/data.yaml", model=DataRecipe)
    manifest = prepare(data, tmp_path / "runs" / "tickets" / "data")
    assert sorted(manifest["splits"]["train"]["task"]) == ["team", "urgent"]
    train = load_recipe("starter/train.yaml", model=TrainRecipe)
    assert train.task_weights == {} and train.out == "runs/tickets/train"
    demo = yaml.safe_load((REPO_RECIPES / "train" / "demo.yaml").read_text())
    assert train == TrainRecipe.model_validate({**demo, "task_weights": {}, "out": "runs/tickets/train"})
    again = CliRunner().invoke(app, ["init", "starter"])
    assert again.exit_code == 2 and "already there; init never replaces a recipe" in again.output


def test_init_without_a_csv_writes_a_template_that_validates(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["init", str(tmp_path / "mine")])
    assert result.exit_code == 0, result.output
    recipe = load_recipe(tmp_path / "mine" / "data.yaml", model=DataRecipe)
    assert [q["task"] for q in recipe.sources[0].options["questions"]] == ["team", "urgency"]
