"""What the verbs share: their option declarations (one each: ``--model`` has one help and one default, the recipe's)
and the one way from a command line to a validated recipe (:func:`recipe_from_command_line`).

A verb takes ``[RECIPE.yaml] [KEY=VALUE ...]`` positionally and its options; an option left out is None, so the
recipe's value (or the recipe model's default) stands. Nothing here imports more than typer.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel

from mydecide.errors import UserError
from mydecide.recipe_loading import load_recipe

R = TypeVar("R", bound=BaseModel)

RecipeArgs = Annotated[
    list[str] | None, typer.Argument(help="[RECIPE.yaml] [KEY=VALUE ...] (dotted overrides).", show_default=False)
]
Model = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="Base model: a local HF directory, a hub name, a .gguf file or smollm2-135m "
        "(default: the recipe's model, else smollm2-135m; merge: the adapter's base).",
    ),
]
Adapter = Annotated[
    str | None,
    typer.Option(
        "--adapter", "-a", help="A LoRA adapter directory (RUN/adapter), or its hub id (owner/name: mydecide push)."
    ),
]
AllowOtherBase = Annotated[
    bool,
    typer.Option(
        "--allow-other-base",
        help="Load the adapter even on a base model whose weights differ from the one it was trained on "
        "(checked by the weights fingerprint saved beside it).",
    ),
]
Temperatures = Annotated[
    str | None, typer.Option("--temperatures", "-t", help="temperatures.json from `mydecide calibrate`.")
]
OptionFormOption = Annotated[
    str | None,
    typer.Option(
        "--option-form",
        help="How choice options are scored: letters or per_option (default: as the adapter was trained).",
    ),
]
ScoreFormOption = Annotated[
    str | None,
    typer.Option(
        "--score-form",
        help=(
            "How score levels are scored: letters, per_option, thresholds or binomial (default: as the adapter was "
            "trained)."
        ),
    ),
]
Out = Annotated[str | None, typer.Option("--out", "-o", help="Where to write (default: the recipe's `out`).")]
Limit = Annotated[int | None, typer.Option("--limit", help="Only the first N records (of each file).")]
BatchSize = Annotated[int | None, typer.Option("--batch-size", help="Prompts per forward pass (default 16).")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]
Device = Annotated[str | None, typer.Option("--device", help="cpu, cuda, cuda:1 … (default: cuda when available).")]


def _exists(arg: str) -> bool:
    """Whether ``arg`` names something (False for a name the system cannot look up: a long ``KEY=VALUE``)."""
    try:
        return Path(arg).exists()
    except OSError:
        return False


def split_args(args: list[str] | None, *, data_files: bool = False) -> tuple[str | None, list[str], list[str]]:
    """Positional arguments → (recipe path, dotted overrides, data files).

    ``KEY=VALUE`` (not an existing file; one too long to be a file name is none) is an override; a ``.yaml`` /
    ``.yml`` file is the recipe; with ``data_files``, anything else is one more data file (so ``--data a.jsonl
    b.jsonl`` reads both: the shell passes b.jsonl positionally); without, the first other argument is the recipe
    whatever its suffix.
    """
    recipe: str | None = None
    overrides: list[str] = []
    files: list[str] = []
    for arg in args or []:
        if "=" in arg and not _exists(arg):
            overrides.append(arg)
        elif recipe is None and (arg.endswith((".yaml", ".yml")) or not data_files):
            recipe = arg
        elif arg.endswith((".yaml", ".yml")):
            raise UserError(f"two recipes given ({recipe} and {arg}); pass one")
        elif not data_files:
            raise UserError(f"unexpected argument {arg!r} after the recipe {recipe}: overrides are KEY=VALUE")
        else:
            files.append(arg)
    return recipe, overrides, files


def recipe_from_command_line(
    model: type[R], args: list[str] | None, options: Mapping[str, Any], *, data_files: bool = False
) -> R:
    """The recipe file, its dotted overrides, then the options given (dotted recipe key → value; None = not given),
    validated once by ``recipe_loading.load_recipe``. With ``data_files``, extra positional files join the recipe's
    ``data`` list (after ``--data``'s, which replace the recipe's)."""
    path, overrides, files = split_args(args, data_files=data_files)
    recipe = load_recipe(path, overrides, model=model, options=options)
    if files:
        current = getattr(recipe, "data", None)
        if not isinstance(current, list):
            raise UserError(f"unexpected argument(s) {files}: pass the data file with --data")
        recipe = load_recipe(path, overrides, model=model, options={**options, "data": [*current, *files]})
    adapter = getattr(recipe, "adapter", None)
    if isinstance(adapter, str) and not Path(adapter).expanduser().exists():
        from mydecide.hub import local_adapter

        recipe = recipe.model_copy(update={"adapter": str(local_adapter(adapter))})  # a hub id: its cached snapshot
    return recipe


def check_records_file(path: str | None) -> None:
    """A --data that names a directory (a `mydecide prepare` output) where a JSONL file is expected."""
    if isinstance(path, str) and Path(path).is_dir():
        found = sorted(p.name for p in Path(path).glob("*.jsonl"))
        hint = f": give one of its files ({', '.join(found)})" if found else ""
        raise IsADirectoryError(
            f"--data {path} is a directory; this command reads a JSONL file of decision records{hint}"
        )
