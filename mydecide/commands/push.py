"""`mydecide push RUN --repo ID`: an adapter, its render config, its temperatures and a model card to a hub repository,
in one commit; `--adapter ID` (any command) pulls it back through the Hugging Face cache (docs/serving.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from mydecide.commands import fail, friendly_errors
from mydecide.commands.options import Temperatures

TEMPERATURES_FILE = "temperatures.json"


def register(app: typer.Typer) -> None:
    @app.command("push")
    @friendly_errors
    def push_command(
        run: Path = typer.Argument(..., help="A training run (its adapter in RUN/adapter) or an adapter directory."),
        repo: str = typer.Option(None, "--repo", help="The hub repository to push to (owner/name); created if new."),
        temperatures: Temperatures = None,
        private: bool = typer.Option(False, help="Create the repository private (an existing one keeps its setting)."),
    ) -> None:
        """Upload the adapter (its weights, config, span head, render config and base record), the temperatures
        (--temperatures, else RUN/temperatures.json when there is one) and a model card, in one commit. The token is
        huggingface_hub's: HF_TOKEN or `hf auth login`."""
        if not repo:
            fail("missing --repo: the hub repository to push to (owner/name)")
            return
        url = push(run, repo, temperatures=Path(temperatures) if temperatures else None, private=private)
        typer.echo(f"pushed {run} to {repo}: {url}", err=True)


def pushed_files(run: Path, temperatures: Path | None) -> tuple[Path, dict[str, Path]]:
    """The adapter directory of ``run`` and the files to upload (path in the repository → local file), checked."""
    from mydecide.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, BASE_FILE, check_adapter
    from mydecide.errors import UserError
    from mydecide.modeling import RENDER_CONFIG_FILE
    from mydecide.scoring.span_head import MERGED_FILE

    adapter = run / "adapter" if (run / "adapter" / ADAPTER_CONFIG).is_file() else run
    check_adapter(adapter)  # a missing or damaged adapter fails first, naming its file
    if not (adapter / RENDER_CONFIG_FILE).is_file():
        raise UserError(
            f"{adapter}: no {RENDER_CONFIG_FILE}; an adapter is pushed with the render config it was trained with"
        )
    names = (ADAPTER_CONFIG, ADAPTER_WEIGHTS, MERGED_FILE, RENDER_CONFIG_FILE, BASE_FILE)
    files = {name: adapter / name for name in names if (adapter / name).is_file()}
    if temperatures is None and (run / TEMPERATURES_FILE).is_file():
        temperatures = run / TEMPERATURES_FILE
    if temperatures is not None:
        from mydecide.calibration.temperatures import load_temperatures

        load_temperatures(temperatures)  # a bad file fails now, in one line
        files[TEMPERATURES_FILE] = temperatures
    return adapter, files


def base_name(adapter: Path) -> str:
    """The base the adapter was trained on, by the name recorded beside it."""
    import json

    from mydecide.adapters import ADAPTER_CONFIG, BASE_FILE

    if (adapter / BASE_FILE).is_file():
        return str(json.loads((adapter / BASE_FILE).read_text(encoding="utf-8"))["model"])
    return str(json.loads((adapter / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path", ""))


def pushed_card(adapter: Path, repo: str, base: str, temperatures: bool) -> str:
    """The repository's README.md: the adapter's own card (training data, dev metrics, recipe) when it has one, with
    how to use it from the hub on top."""
    from huggingface_hub import ModelCard

    from mydecide.training.model_card import model_card

    own = adapter / "README.md"
    plain = f"# Decision-model adapter\n\nA LoRA adapter on `{base}`.\n"
    text = ModelCard.load(own).text.lstrip() if own.is_file() else plain
    serve = f"mydecide serve --model {base} --adapter {repo}"
    if temperatures:
        serve += f" --temperatures $(hf download {repo} {TEMPERATURES_FILE})"
    usage = f"""## From the hub

```bash
{serve}
```

`--adapter {repo}` resolves through the Hugging Face cache (offline too, once downloaded). The repository holds the
LoRA adapter, the render config it was trained with (`mydecide_render.json`, which serving reads){
        ", the temperatures `mydecide calibrate` fitted (`temperatures.json`)" if temperatures else ""
    } and the base model's
record (`mydecide_base.json`: its name and weights fingerprint, checked when the adapter loads).

"""
    title, _, rest = text.partition("\n\n")
    return str(model_card(base, f"{title}\n\n{usage}{rest}" if rest else f"{text}\n\n{usage}"))


def push(run: Path, repo: str, *, temperatures: Path | None = None, private: bool = False, api: Any = None) -> str:
    """Upload ``run``'s adapter, render config, temperatures and a model card to ``repo`` in one commit (the
    repository created when new); the commit's URL."""
    from huggingface_hub import CommitOperationAdd, HfApi

    adapter, files = pushed_files(run, temperatures)
    base = base_name(adapter)
    if Path(base).is_absolute():
        typer.echo(
            f"warning: the base model is recorded as the local path {base}; others need the same model there "
            "(train with a hub id or an alias to push a portable adapter)",
            err=True,
        )
    card = pushed_card(adapter, repo, base, TEMPERATURES_FILE in files)
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(path)) for name, path in files.items()]
    operations.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card.encode("utf-8")))
    api = api or HfApi()
    api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
    commit = api.create_commit(
        repo, operations=operations, commit_message=f"mydecide push: adapter on {base}", repo_type="model"
    )
    return str(getattr(commit, "commit_url", commit))
