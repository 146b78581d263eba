"""`mydecide evaluate`: metrics, baselines, slices, order robustness and latency → report.json / .md / .png."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import typer
from pydantic import BaseModel

from mydecide.commands import friendly_errors

R = TypeVar("R", bound=BaseModel)
ARGS_HELP = "[RECIPE.yaml] [KEY=VALUE ...] and more data files (--data a.jsonl b.jsonl works)."


def split_args(args: list[str] | None) -> tuple[str | None, list[str], list[str]]:
    """Positional arguments → (recipe path, dotted overrides, extra data files).

    A ``.yaml`` / ``.yml`` first argument is the recipe, ``KEY=VALUE`` items are overrides, anything else is
    a data file (so ``--data a.jsonl b.jsonl`` reads both files: the shell passes b.jsonl positionally).
    """
    recipe: str | None = None
    overrides: list[str] = []
    files: list[str] = []
    for arg in args or []:
        if arg.endswith((".yaml", ".yml")) and "=" not in arg:
            if recipe is not None:
                raise ValueError(f"two recipes given ({recipe} and {arg}); pass one")
            recipe = arg
        elif "=" in arg and not Path(arg).exists():
            overrides.append(arg)
        else:
            files.append(arg)
    return recipe, overrides, files


def parse_costs(text: str) -> dict[str, float]:
    """``right=1,wrong=-3,escalate=-0.5`` → payoffs (keys not given keep their defaults)."""
    costs: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in ("right", "wrong", "escalate"):
            raise ValueError(f"--costs {text!r}: expected right=…,wrong=…,escalate=… (got {part!r})")
        try:
            costs[key] = float(value)
        except ValueError:
            raise ValueError(f"--costs {text!r}: {key} must be a number, got {value!r}") from None
    return costs


def resolve(recipe_type: type[R], args: list[str] | None, cli: dict[str, Any]) -> R:
    """Recipe file, then dotted overrides, then explicit command-line options (None = not given)."""
    from mydecide.config import load_recipe, validate_recipe

    recipe_path, overrides, files = split_args(args)
    recipe = load_recipe(recipe_path, overrides, model=recipe_type)
    updates = {k: v for k, v in cli.items() if v is not None}
    if files:
        current = recipe.model_dump().get("data")
        if not isinstance(current, list):
            raise ValueError(f"unexpected argument(s) {files}: pass the data file with --data")
        updates["data"] = [*(updates.get("data") or current), *files]
    recipe = validate_recipe(recipe_type, {**recipe.model_dump(), **updates})
    data = recipe.model_dump().get("data")
    for path in data if isinstance(data, list) else [data]:
        check_records_file(path)
    return recipe


def check_records_file(path: str | None) -> None:
    """A --data that names a directory (a `mydecide prepare` output) where a JSONL file is expected."""
    if isinstance(path, str) and Path(path).is_dir():
        found = sorted(p.name for p in Path(path).glob("*.jsonl"))
        hint = f": give one of its files ({', '.join(found)})" if found else ""
        raise IsADirectoryError(
            f"--data {path} is a directory; this command reads a JSONL file of decision records{hint}"
        )


def register(app: typer.Typer) -> None:
    @app.command("evaluate")
    @friendly_errors
    def evaluate(
        args: list[str] | None = typer.Argument(None, help=ARGS_HELP, show_default=False),
        model: str | None = typer.Option(
            None, "--model", "-m", help="Base model: HF dir, hub name, .gguf, or smollm2-135m (default)."
        ),
        adapter: str | None = typer.Option(None, "--adapter", "-a", help="A LoRA adapter directory."),
        temperatures: str | None = typer.Option(
            None, "--temperatures", "-t", help="temperatures.json from `mydecide calibrate`."
        ),
        data: list[str] | None = typer.Option(None, "--data", "-d", help="Decision-record JSONL file(s)."),
        out: str | None = typer.Option(None, "--out", "-o", help="Output directory (default runs/eval)."),
        permutations: int | None = typer.Option(
            None, help="Random option orders per question, besides the reversed order (default 4)."
        ),
        costs: str | None = typer.Option(
            None,
            help="Payoffs, e.g. right=1,wrong=-3,escalate=-0.5: prints "
            "the auto-act threshold and its coverage / accuracy / payoff table.",
        ),
        coherence: bool | None = typer.Option(
            None, "--coherence/--no-coherence", help="Also run the negation, renaming and context checks."
        ),
        no_base: bool = typer.Option(False, "--no-base", help="Skip the base model (adapter disabled)."),
        limit: int | None = typer.Option(None, help="Only the first N records of each file."),
        batch_size: int | None = typer.Option(None, help="Prompts per forward pass (default 16)."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
    ) -> None:
        """Score records and write predictions.jsonl, report.json, report.md and reliability.png."""
        from mydecide.config import EvalRecipe
        from mydecide.evaluation.report import render_markdown
        from mydecide.evaluation.run import evaluate_files

        cli: dict[str, Any] = {
            "model": model,
            "adapter": adapter,
            "temperatures": temperatures,
            "data": list(data) if data else None,
            "out": out,
            "permutations": permutations,
            "coherence": coherence,
            "limit": limit,
            "batch_size": batch_size,
            "base": False if no_base else None,
        }
        if costs is not None:
            cli["costs"] = parse_costs(costs)
        recipe = resolve(EvalRecipe, args, cli)
        evaluation = evaluate_files(recipe, progress=not quiet)
        markdown = render_markdown(evaluation.report)
        shown = [s for s in markdown.split("\n## ") if s.startswith(("Overall", "Baselines", "Thresholds"))]
        typer.echo("\n".join("## " + s.rstrip() + "\n" for s in shown))
        typer.echo(f"wrote {Path(recipe.out) / 'report.json'}, report.md, reliability.png, predictions.jsonl")
