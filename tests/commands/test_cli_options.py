"""One command line: the shared options are declared once (one help, one default: the recipe's), and every verb
goes from flags + recipe + overrides to a validated recipe the same way (options win over overrides, which win
over the file; errors blame the file, the override or the command line)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
from pydantic import BaseModel
from typer.testing import CliRunner

from mydecide.cli import app
from mydecide.commands.evaluate import summary
from mydecide.commands.options import recipe_from_command_line, split_args
from mydecide.config import CalibrateRecipe, DataRecipe, EvalRecipe, ModelChoice, ServeRecipe, TrainRecipe
from mydecide.recipe_loading import load_recipe
from mydecide.recipe_parsing import RecipeError

REPO = Path(__file__).resolve().parents[2]


def _params(option: str) -> dict[str, list[typer.core.TyperOption]]:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    return {
        verb: [p for p in command.params if option in getattr(p, "opts", [])]
        for verb, command in group.commands.items()
    }


@pytest.mark.parametrize("option", ["--model", "--adapter", "--temperatures", "--option-form", "--device"])
def test_a_shared_option_has_one_help_and_leaves_the_default_to_the_recipe(option: str) -> None:
    found = [p for params in _params(option).values() for p in params]
    assert len(found) >= 3, option  # declared by several verbs …
    assert len({p.help for p in found}) == 1  # … once
    assert {p.default for p in found} == {None}  # the default is the recipe's


def test_the_default_model_is_written_once_in_the_package() -> None:
    defaults = {model().model for model in (TrainRecipe, CalibrateRecipe, EvalRecipe, ServeRecipe)}
    assert defaults == {ModelChoice().model}
    quoted = re.compile(r"[\"']" + re.escape(ModelChoice().model) + r"[\"']")
    places = sorted(
        str(path.relative_to(REPO))
        for path in (REPO / "mydecide").rglob("*.py")
        if quoted.search(path.read_text(encoding="utf-8"))
    )
    assert places == ["mydecide/config.py", "mydecide/modeling.py"]  # the recipe default; the alias it names


@pytest.mark.parametrize(
    ("model", "key"),
    [(TrainRecipe, "seed"), (CalibrateRecipe, "min_rows"), (EvalRecipe, "permutations"), (ServeRecipe, "port")],
)
def test_options_beat_overrides_which_beat_the_file(model: type[BaseModel], key: str, tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"{key}: 11\n")
    assert getattr(recipe_from_command_line(model, [str(recipe)], {key: None}), key) == 11
    assert getattr(recipe_from_command_line(model, [str(recipe), f"{key}=22"], {key: None}), key) == 22
    assert getattr(recipe_from_command_line(model, [str(recipe), f"{key}=22"], {key: 33}), key) == 33
    assert getattr(recipe_from_command_line(model, [], {}), key) == model.model_fields[key].default


def test_a_serve_recipe_sets_limits_and_batching_and_flags_win(tmp_path: Path) -> None:
    recipe = tmp_path / "serve.yaml"
    recipe.write_text("limits: {max_questions: 5, max_prompts: 40}\nbatching: {window_ms: 2.5}\n")
    served = recipe_from_command_line(
        ServeRecipe, [str(recipe), "batching.max_requests=3"], {"limits.max_questions": 7, "port": None}
    )
    assert (served.limits.max_questions, served.limits.max_prompts) == (7, 40)
    assert (served.batching.window_ms, served.batching.max_requests) == (2.5, 3)
    assert served.limits.max_state_chars == ServeRecipe().limits.max_state_chars  # not given: the default
    with pytest.raises(RecipeError, match=r"^command line: limits\.max_questions: Input should be greater"):
        recipe_from_command_line(ServeRecipe, [str(recipe)], {"limits.max_questions": 0})
    with pytest.raises(RecipeError, match=r"serve\.yaml: limits\.max_prompt: unknown key \(did you mean"):
        recipe.write_text("limits: {max_prompt: 40}\n")
        recipe_from_command_line(ServeRecipe, [str(recipe)], {})


def test_the_shipped_serve_recipe_loads_and_serve_refuses_a_bad_one(tmp_path: Path) -> None:
    shipped = REPO / "recipes" / "serve" / "default.yaml"
    assert shipped.read_text().startswith("#") and load_recipe(shipped, model=ServeRecipe) == ServeRecipe()
    result = CliRunner().invoke(app, ["serve", str(shipped), "batching.window_ms=-1"])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: command-line override batching.window_ms=-1: batching.window_ms: "
        "Input should be greater than or equal to 0"
    )
    data = CliRunner().invoke(app, ["serve", str(REPO / "recipes" / "data" / "demo.yaml")])
    assert data.output.strip().endswith("this is a data recipe: use `mydecide prepare`")


def test_positional_arguments_split_one_way() -> None:
    assert split_args(["r.yaml", "lora.r=8"]) == ("r.yaml", ["lora.r=8"], [])
    assert split_args(["recipe.txt", "a=1"]) == ("recipe.txt", ["a=1"], [])  # any suffix, when no files are taken
    assert split_args(["a.jsonl", "b=2", "c.jsonl"], data_files=True) == (None, ["b=2"], ["a.jsonl", "c.jsonl"])
    with pytest.raises(ValueError, match="two recipes given"):
        split_args(["a.yaml", "b.yaml"])
    with pytest.raises(ValueError, match=r"unexpected argument 'x\.jsonl' after the recipe r\.yaml"):
        split_args(["r.yaml", "x.jsonl"])


def test_prepare_takes_out_from_the_command_line_through_the_same_path(tmp_path: Path) -> None:
    recipe = tmp_path / "data.yaml"
    recipe.write_text("sources: [{kind: jsonl}]\nout: runs/from-file\n")
    resolved = recipe_from_command_line(DataRecipe, [str(recipe), "split.dev_fraction=0.2"], {"out": "x #2"})
    assert resolved.out == "x #2" and resolved.split.dev_fraction == 0.2  # a path is taken as given, not YAML
    with pytest.raises(RecipeError, match=r"^command line: out: Input should be a valid string"):
        recipe_from_command_line(DataRecipe, [str(recipe)], {"out": 3})


def test_evaluate_prints_what_report_json_holds() -> None:
    block = {"n": 4, "accuracy": 0.75, "log_loss": 0.5, "ece": 0.125}
    report = {
        "all": block,
        "choice": block,
        "noul": {"n": 0},
        "score": {"n": 0},
        "set": {"n": 0},
        "baselines": {"majority": {"source": "/data/train.jsonl", "all": {**block, "accuracy": 0.5}}},
        "thresholds": {
            "costs": {"right": 1.0, "wrong": -3.0, "escalate": -0.5},
            "auto_act_threshold": 0.8,
            "table": [
                {"threshold": 0.5, "coverage": 1.0, "accuracy": 0.75, "payoff": 0.0, "auto_act": False},
                {"threshold": 0.8, "coverage": 0.5, "accuracy": 1.0, "payoff": 0.25, "auto_act": True},
            ],
        },
    }
    lines = summary(report)
    assert [line.split()[0] for line in lines if not line.startswith(" ")] == ["overall", "baselines", "thresholds:"]
    assert any("all" in line and "accuracy 0.750" in line and "ECE 0.125" in line for line in lines)
    assert not any(line.strip().startswith("noul") for line in lines)  # types with no questions are left out
    assert any("majority (train.jsonl)" in line and "accuracy 0.500" in line for line in lines)
    assert lines[-1].endswith(
        "auto-act when p > 0.800, escalate otherwise (coverage 0.500, accuracy 1.000, payoff 0.250 per question)"
    )


def test_an_override_too_long_to_be_a_file_name_is_still_an_override(tmp_path: Path) -> None:
    """Each KEY=VALUE is first looked up as a file; a name past the system's limit is no file, not an error."""
    long = "out=" + "x" * 300
    assert split_args(["r.yaml", long]) == ("r.yaml", [long], [])
    (tmp_path / "train.yaml").write_text("seed: 1\n")
    result = CliRunner().invoke(app, ["train", str(tmp_path / "train.yaml"), "optim.lr=.inf", long])
    assert result.exit_code == 2 and "File name too long" not in result.output
    assert (
        result.output.strip() == "error: command-line override optim.lr=.inf: optim.lr: Input should be a finite number"
    )
