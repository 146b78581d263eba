"""``load_recipe(path, overrides, model=..., options=...)``: the one way from a command line to a validated recipe.

A recipe is a YAML file from ``recipes/``; dotted ``KEY=VALUE`` overrides from the command line are applied before
validation (``lora.r=16``, ``objective.kind=rlcd``), then the command's options (``--out``, ``--limit``). The models
are :mod:`mydecide.config`'s; reading the text and telling errors in one line is :mod:`mydecide.recipe_parsing`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from mydecide import config
from mydecide.recipe_parsing import RecipeError, describe_errors, merge, nest, parse_overrides, read_yaml

R = TypeVar("R", bound=BaseModel)


def load_recipe(
    path: str | Path | None,
    overrides: Sequence[str] = (),
    *,
    model: type[R],
    options: Mapping[str, Any] | None = None,
) -> R:
    """The one way from a command line to a validated recipe: the YAML file (None: all defaults), then its dotted
    ``KEY=VALUE`` overrides, then the command-line ``options`` (dotted key → value, taken as given; None = not
    given), validated once. Errors name the file, the override or the command line, and the key."""
    from_file = read_yaml(path) if path is not None else {}
    check_dotted_overrides(from_file, overrides, str(path))
    given = {key: value for key, value in (options or {}).items() if value is not None}
    data = merge(merge(from_file, parse_overrides(overrides)), nest(given))
    try:
        return model.model_validate(data)
    except ValidationError as err:
        where = str(path) if path is not None else "recipe"
        needed = [str(e["loc"][0]) for e in err.errors() if e["type"] == "missing" and len(e["loc"]) == 1]
        if path is not None and not from_file and len(needed) == len(err.errors()):
            # an empty file (or comments only) names no kind: every recipe but the data recipe is valid empty
            kind = RECIPE_COMMANDS.get(model.__name__, ("this", ""))[0]
            article = "" if kind == "this" else "an " if kind[0] in "aeiou" else "a "
            raise RecipeError(
                f"{where}: the recipe is empty; {article}{kind} recipe needs {', '.join(needed)}"
            ) from None
        other = recipe_kind(from_file, exclude=model) if path is not None else None
        if other is not None and any(
            len(e["loc"]) == 1 and e["type"] in ("extra_forbidden", "missing") for e in err.errors()
        ):
            kind, verb = other
            article = "an" if kind[0] in "aeiou" else "a"
            raise RecipeError(f"{where}: this is {article} {kind} recipe: use `mydecide {verb}`") from None
        raise RecipeError(describe_errors(err, model, where, overrides, given)) from None


# recipe model name → (what the recipe is, the command that takes it)
RECIPE_COMMANDS: dict[str, tuple[str, str]] = {
    "DataRecipe": ("data", "prepare"),
    "TrainRecipe": ("training", "train"),
    "CalibrateRecipe": ("calibration", "calibrate"),
    "EvalRecipe": ("evaluation", "evaluate"),
    "ServeRecipe": ("serving", "serve"),
    "MergeRecipe": ("merge", "merge"),
}


def recipe_kind(data: dict[str, Any], *, exclude: type[BaseModel]) -> tuple[str, str] | None:
    """(kind, command) of the one other recipe model that ``data`` is valid for, or None: None too when several
    are (``adapter: DIR`` alone is a calibration, evaluation, serving or merge recipe), since naming one would be
    a guess."""
    kinds = []
    for name, kind in RECIPE_COMMANDS.items():
        other = getattr(config, name)
        if other is exclude:
            continue
        try:
            other.model_validate(data)
        except ValidationError:
            continue
        kinds.append(kind)
    return kinds[0] if len(kinds) == 1 else None


def check_dotted_overrides(from_file: dict[str, Any], overrides: Sequence[str], where: str) -> None:
    """A dotted override below a key the file sets to one value replaces that value, not a part of it:
    ``cap_per_task.alpha=5`` over ``cap_per_task: 7`` would leave every other task uncapped. Refuse it, naming the
    value to write whole."""
    for item in overrides:
        parts = item.split("=", 1)[0].strip().split(".")
        node: Any = from_file
        for depth, part in enumerate(parts[:-1]):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
            if node is not None and not isinstance(node, dict):
                key = ".".join(parts[: depth + 1])
                shown = item if len(item) <= 80 else item[:79] + "…"
                what = "a list" if isinstance(node, list) else f"{node!r}"[:40]
                raise RecipeError(
                    f"command-line override {shown}: {key} is {what} in {where}, not a section: an override sets "
                    f"it whole ({key}=...)"
                )
