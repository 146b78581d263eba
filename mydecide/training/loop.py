"""The training loop: one readable function, top to bottom.

set up (accelerator, data, model + LoRA, optimiser, schedule) → resume if asked → for each optimiser update:
accumulate micro-batches, clip, step → every ``eval_every`` updates and at each epoch end: dev metrics + collapse
check, keep the best adapter → every ``save_every`` updates: a resumable checkpoint → save the last adapter.

The same code runs on one CPU, one GPU, or N processes under ``accelerate launch`` (each process takes every N-th
micro-batch; gradients are averaged by DDP). The trainable model is built in model.py, the batches of each epoch
planned in epochs.py; checkpoints, resume and adapter saving are in checkpoints.py, the dev metrics in dev.py.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections import Counter
from collections.abc import Collection
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import Any

from mydecide.config import TrainRecipe, dump_recipe
from mydecide.errors import UserError
from mydecide.evaluation.baselines import LabelPrior
from mydecide.io import atomic_write_text, directory_lock, provenance, unshare
from mydecide.manifest import SPLIT_FILES, Digests, check_against_manifest, split_digest, split_path
from mydecide.record_files import NO_RECORDS, load_records
from mydecide.records import Record, RecordError
from mydecide.training.checkpoints import check_resumable
from mydecide.training.dev import KeptAdapter, collapsed_warning, dev_line, dev_metrics, replaces_best
from mydecide.training.epochs import EpochPlan
from mydecide.training.model_card import record_base_model, write_model_card
from mydecide.training.objectives import training_loss
from mydecide.training.tracking import check_trackers, tracked, tracker_config


def log(message: str) -> None:
    print(f"[train] {message}", file=sys.stderr, flush=True)


# -------------------------------------------------------------------------------------------------------- data


def prepared_data(data: str | None) -> Path:
    """The `mydecide prepare` output directory named by ``data``; a missing one, a file (``DIR/train.jsonl``), a
    directory without train.jsonl and dev.jsonl, or one whose recipe.yaml is not the one its manifest records, is an
    error that says which (the splits themselves are checked against the manifest as they are read)."""
    if data is None:
        raise UserError("no training data: give --data DIR (a `mydecide prepare` output) or set data: in the recipe")
    path = Path(data)
    if path.is_file():
        if (path.parent / "train.jsonl").is_file():
            hint = f" (here: --data {path.parent})"
        elif path.suffix in (".yaml", ".yml"):
            hint = f"; for a data recipe, run `mydecide prepare {path} --out DIR` first"
        else:
            hint = ""
        raise NotADirectoryError(
            f"--data {path} is a file; train reads the directory `mydecide prepare` wrote, "
            f"with train.jsonl and dev.jsonl in it{hint}"
        )
    if not path.is_dir():
        raise FileNotFoundError(f"--data {path}: no such directory (give the output directory of `mydecide prepare`)")
    missing = [SPLIT_FILES[split] for split in ("train", "dev") if not split_path(path, split).exists()]
    if missing:
        raise FileNotFoundError(
            f"--data {path}: no {' or '.join(missing)} in it; it is not an output directory of `mydecide prepare`"
        )
    if (path / "recipe.yaml").is_file():  # the data recipe is the run's record of how the data was made
        check_against_manifest(path / "recipe.yaml")
    return path


def select_tasks(
    train_records: list[Record], dev_records: list[Record], tasks: list[str], data_dir: Path
) -> tuple[list[Record], list[Record]]:
    """The records of ``tasks`` only; a task with no training records is an error naming the tasks there are."""
    present = Counter(r.task for r in train_records)
    missing = [t for t in tasks if t not in present]
    if missing:
        raise UserError(
            f"tasks: {missing} have no records in {data_dir / 'train.jsonl'}; its tasks are {sorted(present)}"
        )
    wanted = set(tasks)
    dev = [r for r in dev_records if r.task in wanted]
    if dev_records and not dev:
        raise UserError(f"tasks: {tasks} have no records in {split_path(data_dir, 'dev')}; {DEV_NEEDED}")
    return [r for r in train_records if r.task in wanted], dev


DEV_NEEDED = "train keeps the adapter that is best on dev, so it needs dev records"


def dev_split(data_dir: Path, digests: Digests | None = None) -> list[Record]:
    """The dev records; an empty dev split (prepared with split.dev_fraction 0) is an error that says why train needs
    one (with none, the first dev evaluation's untrained adapter would stay the best: an empty dev's log loss is 0)."""
    try:
        return load_records(split_path(data_dir, "dev"), digests)
    except RecordError as err:
        if err.rule != NO_RECORDS:
            raise
        raise UserError(
            f"{err.where}: {NO_RECORDS}; {DEV_NEEDED} (prepare {data_dir} with split.dev_fraction > 0)"
        ) from None


# ---------------------------------------------------------------------------------------------------- the loop


def train(recipe: TrainRecipe, *, resume: bool = False, allow_change: Collection[str] = ()) -> Path:
    """Train a LoRA adapter as the recipe says; returns the run directory. ``resume`` continues the run in
    ``recipe.out`` from its newest readable checkpoint, if its recipe and data are the same but for
    ``allow_change`` (see :data:`SAFE_CHANGES`). The main process holds the run directory's lock throughout
    (:func:`~mydecide.io.directory_lock`): a second ``train`` on the same ``--out`` stops with one line."""
    with ExitStack() as held:
        return _train(recipe, resume, allow_change, held)


def _train(recipe: TrainRecipe, resume: bool, allow_change: Collection[str], held: ExitStack) -> Path:
    # What is cheap is checked first: the data directory, its records against the manifest, the run directory, and
    # only then the model's name (without converting the embedded default), all before torch is imported.
    from mydecide.modeling import resolve_model_path

    data_dir = prepared_data(recipe.data)
    digests: Digests = {}  # each split file is hashed once: against the manifest and for the run's recipe
    train_records = load_records(split_path(data_dir, "train"), digests)
    dev_records = dev_split(data_dir, digests)
    trackers = check_trackers(recipe.report_to)
    data_sha256 = {
        split_path(data_dir, s).name: split_digest(split_path(data_dir, s), digests) for s in ("train", "dev")
    }
    if resume:
        check_resumable(Path(recipe.out), recipe, data_sha256, allow_change)
    elif allow_change:
        raise UserError("--allow-change applies to --resume only")
    resolve_model_path(recipe.model, convert=False)

    import torch
    from accelerate.utils import broadcast_object_list, set_seed

    from mydecide.modeling import save_render_config
    from mydecide.scoring.model import LoadedModel
    from mydecide.training import checkpoints
    from mydecide.training.model import trainable_model

    # ---- data (first: whether a span head is trained decides how DDP is set up)
    train_records, dev_records, kept, warnings = selected_records(recipe, train_records, dev_records, data_dir)
    # a span head (scoring/span_head.py) is trained with the adapter when asked, or by default (auto) for span data
    span = recipe.prompt.span.resolve(any(r.question.type == "span" for r in train_records))

    # ---- set up
    run = Path(recipe.out)
    accelerator, precision = make_accelerator(recipe, run, trackers, head=span.read == "head")
    is_main = accelerator.is_main_process
    set_seed(recipe.seed)
    if is_main:
        held.enter_context(directory_lock(run, "train"))
        open_run(run, recipe, resume, allow_change, data_sha256, accelerator, trackers)
    for line in selection_lines(recipe, kept, warnings) if is_main else []:
        log(line)
    majority = LabelPrior.from_records(train_records, "training split")
    model = trainable_model(recipe, span, train_records, device=str(accelerator.device), precision=precision, log=log)
    renderer = model.renderer

    # ---- schedule
    world, rank = accelerator.num_processes, accelerator.process_index
    plan = EpochPlan(recipe, renderer, train_records, world, rank)
    accum, total_updates = plan.accum, plan.total_updates
    optimizer, scheduler = make_optimiser(model.lm, recipe, total_updates)
    module, optimizer, scheduler = accelerator.prepare(model.module, optimizer, scheduler)
    step_loss = training_loss(recipe.objective)
    log(f"{len(train_records)} train / {len(dev_records)} dev records; {plan.sizing()}")
    log(f"objective {recipe.objective.kind}; {precision} on {accelerator.device}")

    def scoring_model() -> LoadedModel:
        return LoadedModel(accelerator.unwrap_model(module).lm, model.base.tokenizer, renderer, recipe.model)

    # ---- resume
    checkpoints.save_lora_only(accelerator)
    training = checkpoints.trained_with(recipe, data_sha256)  # every checkpoint carries it: the resume guard
    update, best = 0, KeptAdapter()
    found = checkpoints.resume_newest(accelerator, run, module) if resume else None
    if found is not None:
        update, best = found[1]["update"], KeptAdapter.from_json(found[1]["best"])
        log(f"resumed from {found[0].name} at update {update}/{total_updates}")
        if is_main:
            checkpoints.forget_updates_after(run, update, best)

    def save_adapter(name: str) -> None:
        def beside_the_weights(folder: Path) -> None:
            save_render_config(folder, renderer.config)  # span.read resolved
            record_base_model(folder, recipe.model, model.base_weights)  # its portable name, not a cache's path
            kind = "best on dev" if name == "adapter" else "last"
            write_model_card(
                folder, recipe, kind, update, {"train": train_records, "dev": dev_records}, run / "metrics.jsonl"
            )

        checkpoints.save_adapter(accelerator, module, run / name, beside_the_weights)

    def evaluate_dev(epoch: float, best: KeptAdapter) -> KeptAdapter:
        """Dev metrics on the main process (on every process when the weights are sharded: each forward pass
        gathers them), written by the main process; all processes then agree on the best update, save it and
        return its record."""
        if is_main or checkpoints.is_sharded(accelerator):
            module.eval()
            started = time.perf_counter()
            metrics = dev_metrics(scoring_model(), dev_records, majority, recipe.seed, recipe.eval_batch_size)
            losses = metrics.pop("losses")
            module.train()
        if is_main:
            kept = replaces_best(losses, best, recipe.best_margin)  # RUN/adapter becomes this update's
            counted = best.evaluated(metrics["log_loss"])
            row = {"kind": "dev", "update": update, "epoch": round(epoch, 3), **metrics, "kept": kept}
            row.update(seconds=round(time.perf_counter() - started, 1), time=round(time.time(), 3))
            write_metrics(run, row)
            accelerator.log(tracked("dev", {**row, "collapse_warnings": len(metrics["warnings"])}), step=update)
            log(dev_line(update, metrics))
            if update >= recipe.collapse_after * total_updates:
                for warning in metrics["warnings"]:
                    log(f"WARNING: {warning}")
            if kept:
                if note := best.within_margin_note(metrics["log_loss"], update, recipe.best_margin):
                    log(note)
                counted = counted.after(metrics, losses, update)
            best = counted
        best = broadcast_object_list([best])[0]
        if best.update == update:
            save_adapter("adapter")
        return best

    # ---- train
    module.train()
    started, last_log, start_update = time.perf_counter(), time.perf_counter(), update
    if update == 0 and recipe.eval_at_start:
        best = evaluate_dev(0.0, best)
    # a run resumed after it stopped early stops again at once (--allow-change early_stopping.patience goes on)
    stopped = best.stop_reason(recipe.early_stopping.patience, update, total_updates)
    while update < total_updates and not stopped:
        losses = []
        update_started, questions = time.perf_counter(), 0
        for a in range(accum):
            micro = update * accum + a
            tb = model.batch(plan.units(micro), accelerator.device)
            generator = torch.Generator(device=accelerator.device).manual_seed(recipe.seed * 1_000_003 + micro)
            with accelerator.no_sync(module) if a < accum - 1 else nullcontext():
                loss = step_loss(module, tb, update / total_updates, generator)  # span questions: on their grid
                accelerator.backward(loss / accum)
            losses.append(loss.detach())
            questions += tb.questions
        grad_norm = accelerator.clip_grad_norm_(module.parameters(), recipe.optim.max_grad_norm)  # before clipping
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        update += 1
        mean_loss = accelerator.reduce(torch.stack(losses).mean(), "mean").item()
        seconds = time.perf_counter() - update_started  # this update's forward + backward + step, all processes
        all_questions = accelerator.reduce(torch.tensor(float(questions), device=accelerator.device), "sum").item()
        if is_main:
            row = train_row(update, plan.epoch(update), mean_loss, scheduler, grad_norm, seconds, all_questions)
            write_metrics(run, row)
            accelerator.log(tracked("train", row), step=update)
            if time.perf_counter() - last_log > 10 or update == total_updates:
                log(progress_line(update, total_updates, update - start_update, started, mean_loss, scheduler))
                last_log = time.perf_counter()
        if update % recipe.eval_every == 0 or plan.epoch_ends(update) or update == total_updates:
            best = evaluate_dev(plan.epoch(update), best)
        stopped = best.stop_reason(recipe.early_stopping.patience, update, total_updates)
        if update % recipe.save_every == 0 or update == total_updates or stopped:
            checkpoints.save_checkpoint(accelerator, run, update, best.to_json(), recipe.keep_checkpoints, training)
        if stopped:
            break

    save_adapter("last")
    if best.update is None:  # dev log loss never improved on infinity (NaN): the last adapter is the best
        save_adapter("adapter")
    close_run(accelerator, run, update, best, stopped)
    return run


def train_row(
    update: int, epoch: float, loss: float, scheduler: Any, grad_norm: Any, seconds: float, questions: float
) -> dict[str, Any]:
    """metrics.jsonl's line for an update: ``seconds`` its forward + backward + step, ``questions`` over all
    processes."""
    return {
        "kind": "train",
        "update": update,
        "epoch": round(epoch, 4),
        "loss": loss,
        "lr": scheduler.get_last_lr()[0],
        "grad_norm": float(grad_norm) if grad_norm is not None else None,
        "updates_per_s": round(1.0 / seconds, 4),
        "questions_per_s": round(questions / seconds, 2),
        "time": round(time.time(), 3),
    }


def progress_line(update: int, total: int, done: int, started: float, loss: float, scheduler: Any) -> str:
    """The loop's progress line after update ``update`` of ``total``, ``done`` of them in this process since
    ``started``."""
    elapsed = time.perf_counter() - started
    eta = elapsed / max(done, 1) * (total - update)
    lr = scheduler.get_last_lr()[0]
    return f"update {update}/{total} loss {loss:.4f} lr {lr:.2e} elapsed {elapsed:.0f}s eta {eta:.0f}s"


def close_run(accelerator: Any, run: Path, update: int, best: KeptAdapter, stopped: str | None) -> None:
    """summary.json and the last line (main process: with ``stopped``, why training stopped early), the trackers
    flushed and closed, every process done."""
    if accelerator.is_main_process:
        summary = {"updates": update, "stopped_early": stopped, "best": best.to_json(terms=False)}
        atomic_write_text(run / "summary.json", json.dumps(summary, indent=2) + "\n")
        if (warning := collapsed_warning(best)) is not None:
            log(f"WARNING: {warning}")
        log(
            f"done: {stopped + '; ' if stopped else ''}best on dev: update {best.update} (dev log loss "
            f"{best.log_loss:.4f}) → {run / 'adapter'}; last → {run / 'last'}"
        )
    for tracker in accelerator.trackers:  # flush and close (not end_training(): it ends the process group too)
        tracker.finish()
    accelerator.wait_for_everyone()


# ------------------------------------------------------------------------------------------------- set-up steps


def selected_records(
    recipe: TrainRecipe, train_records: list[Record], dev_records: list[Record], data_dir: Path
) -> tuple[list[Record], list[Record], str, list[str]]:
    """The records the recipe trains and evaluates on (``tasks``, ``train_limit``, ``dev_limit``), a note of how many
    ``tasks`` kept, and warnings: a ``task_weights`` task with no training records is one, not an error (a recipe
    tuned on other data names its tasks; a weight is a sampling rate, not a claim that the task is there). Naming the
    tasks in ``tasks`` is how a missing task becomes an error (:func:`select_tasks`)."""
    counts, kept, warnings = (len(train_records), len(dev_records)), "", []
    if recipe.tasks:
        train_records, dev_records = select_tasks(train_records, dev_records, recipe.tasks, data_dir)
        kept = f"{len(train_records)} of {counts[0]} train and {len(dev_records)} of {counts[1]} dev records kept"
    if recipe.train_limit:
        train_records = train_records[: recipe.train_limit]
    if recipe.task_weights:
        present = Counter(r.task for r in train_records)
        if missing := sorted(set(recipe.task_weights) - set(present)):
            warnings.append(
                f"task_weights: {missing} have no records to train on (unused); the training tasks are "
                f"{sorted(present)} (name them in tasks: to make a missing task an error)"
            )
        shown = {t: round(w * present[t]) for t, w in recipe.task_weights.items() if t in present}
        if shown:
            kept = "; ".join(filter(None, [kept, f"task weights show {shown} records of those tasks per epoch"]))
    if recipe.dev_limit:  # a fixed sample across tasks (dev files are often grouped by task)
        dev_records = sorted(dev_records, key=lambda r: hashlib.sha256(r.id.encode()).hexdigest())[: recipe.dev_limit]
    return train_records, dev_records, kept, warnings


def selection_lines(recipe: TrainRecipe, kept: str, warnings: list[str]) -> list[str]:
    """What train says about the records :func:`selected_records` kept."""
    lines = [f"tasks {recipe.tasks}: {kept}" if recipe.tasks else kept] if kept else []
    return lines + [f"WARNING: {warning}" for warning in warnings]


def make_accelerator(recipe: TrainRecipe, run: Path, trackers: list[str], *, head: bool) -> tuple[Any, str]:
    """The run's Accelerator and its precision (``auto``: bf16 on a GPU, else fp32)."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, ProjectConfiguration

    on_gpu = torch.cuda.is_available()
    precision = ("bf16" if on_gpu else "fp32") if recipe.precision == "auto" else recipe.precision
    accelerator = Accelerator(
        mixed_precision="bf16" if precision == "bf16" else "no",
        cpu=not on_gpu,
        log_with=trackers or None,
        project_config=ProjectConfiguration(project_dir=str(run), logging_dir=str(run / "logs")) if trackers else None,
        # one scheduler step per update: total_updates already counts per process (Accelerate's default steps it
        # once per process, which ran an N-process schedule N times too fast)
        step_scheduler_with_optimizer=False,
        # the span head gets no gradient from a batch without span questions
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)] if head else None,
    )
    return accelerator, precision


def open_run(
    run: Path,
    recipe: TrainRecipe,
    resume: bool,
    allow_change: Collection[str],
    data_sha256: dict[str, str],
    accelerator: Any,
    trackers: list[str],
) -> None:
    """The main process, holding the run directory's lock: the resume check again, a new run's directory (a run
    directory that holds anything is refused without ``resume``), recipe.yaml, and the trackers started."""
    from mydecide.training import checkpoints

    if resume:  # checked again under the lock: another run may have written a checkpoint since
        against = check_resumable(run, recipe, data_sha256, allow_change)
        if problem := checkpoints.recipe_file_problem(run):
            log(
                f"WARNING: {problem}; resuming against the recipe {against} was trained with (every checkpoint "
                f"carries it), and writing {run / 'recipe.yaml'} again"
            )
        unshare(run / "metrics.jsonl")  # a run copied with `cp -al` appends to its own log, not the original's
    if run.exists() and not resume and any(run.iterdir()):
        raise FileExistsError(f"{run}: run directory exists; pass --resume to continue it or choose --out")
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    atomic_write_text(run / "recipe.yaml", dump_recipe(recipe, {**provenance(), "data_sha256": data_sha256}))
    if trackers:  # TensorBoard: RUN/logs/mydecide/; wandb / mlflow: a run named after the run directory
        names = {"wandb": {"name": run.name}, "mlflow": {"run_name": run.name}}
        accelerator.init_trackers("mydecide", config=tracker_config(recipe), init_kwargs=names)


ADAM_BETAS = (0.9, 0.999)
"""AdamW's decay rates (a lower β₂ lost on the demo, docs/LOG.md: not a recipe key)."""


def make_optimiser(lm: Any, recipe: TrainRecipe, total_updates: int) -> tuple[Any, Any]:
    """AdamW over the trainable parameters, and the recipe's learning-rate schedule over ``total_updates``."""
    import torch
    from transformers import get_scheduler

    optim = recipe.optim
    optimizer = torch.optim.AdamW(
        [p for p in lm.parameters() if p.requires_grad],
        lr=optim.lr,
        betas=ADAM_BETAS,
        weight_decay=optim.weight_decay,
    )
    scheduler = get_scheduler(
        optim.schedule,
        optimizer,
        num_warmup_steps=round(optim.warmup_ratio * total_updates),
        num_training_steps=total_updates,
    )
    return optimizer, scheduler


def write_metrics(run: Path, row: dict[str, Any]) -> None:
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")
