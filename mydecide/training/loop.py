"""The training loop: one readable function, top to bottom.

set up (accelerator, data, model + LoRA, optimiser, schedule) → resume if asked → for each optimiser update:
accumulate micro-batches, clip, step → every ``eval_every`` updates and at each epoch end: dev metrics + collapse
check, keep the best adapter → every ``save_every`` updates: a resumable checkpoint → save the last adapter.

The same code runs on one CPU, one GPU, or N processes under ``accelerate launch`` (each process takes every N-th
micro-batch; gradients are averaged by DDP). Checkpoints, resume and adapter saving are in checkpoints.py, the dev
metrics in dev.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
import time
from collections import Counter
from collections.abc import Collection
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from mydecide.config import TrainRecipe, dump_recipe
from mydecide.evaluation.baselines import LabelPrior
from mydecide.io import atomic_write_text, directory_lock, provenance
from mydecide.manifest import SPLIT_FILES, check_against_manifest, split_digest, split_path
from mydecide.record_files import NO_RECORDS, load_records
from mydecide.records import Record, RecordError
from mydecide.training.checkpoints import check_resumable
from mydecide.training.dev import dev_line, dev_metrics
from mydecide.training.diagnostics import span_log_odds, span_prior_note
from mydecide.training.objectives import batch_loss, loss_for
from mydecide.training.tracking import check_trackers, tracked, tracker_config


def log(message: str) -> None:
    print(f"[train] {message}", file=sys.stderr, flush=True)


# -------------------------------------------------------------------------------------------------------- data


def prepared_data(data: str | None) -> Path:
    """The `mydecide prepare` output directory named by ``data``; a missing one, a file (``DIR/train.jsonl``), a
    directory without train.jsonl and dev.jsonl, or one whose recipe.yaml is not the one its manifest records, is an
    error that says which (the splits themselves are checked against the manifest as they are read)."""
    if data is None:
        raise ValueError("no training data: give --data DIR (a `mydecide prepare` output) or set data: in the recipe")
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
        raise ValueError(
            f"tasks: {missing} have no records in {data_dir / 'train.jsonl'}; its tasks are {sorted(present)}"
        )
    wanted = set(tasks)
    dev = [r for r in dev_records if r.task in wanted]
    if dev_records and not dev:
        raise ValueError(f"tasks: {tasks} have no records in {split_path(data_dir, 'dev')}; {DEV_NEEDED}")
    return [r for r in train_records if r.task in wanted], dev


DEV_NEEDED = "train keeps the adapter that is best on dev, so it needs dev records"


def dev_split(data_dir: Path) -> list[Record]:
    """The dev records; an empty dev split (prepared with split.dev_fraction 0) is an error that says why train needs
    one (with none, the first dev evaluation's untrained adapter would stay the best: an empty dev's log loss is 0)."""
    try:
        return load_records(split_path(data_dir, "dev"))
    except RecordError as err:
        if err.rule != NO_RECORDS:
            raise
        raise ValueError(
            f"{err.where}: {NO_RECORDS}; {DEV_NEEDED} (prepare {data_dir} with split.dev_fraction > 0)"
        ) from None


# ------------------------------------------------------------------------------------------------ model pieces


def lora_targets(lm: Any, spec: str | list[str], last_layers: int | None = None) -> str | list[str]:
    """A regex naming every linear layer of the language model's decoder (attention, MLP, Gated DeltaNet
    projections), never the output head or a vision tower; with ``last_layers``, only those of the last N decoder
    layers (the backward pass then stops at the lowest adapted layer)."""
    import torch

    if spec != "all-linear":
        if last_layers:
            raise ValueError("lora.last_layers works with lora.target_modules: all-linear, not an explicit list")
        return spec
    decoder = lm.get_decoder()
    prefix = next(name for name, module in lm.named_modules() if module is decoder)
    leaves = sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in decoder.named_modules()
            if isinstance(module, torch.nn.Linear) and not re.search(r"vision|visual", name)
        }
    )
    if not leaves:
        raise ValueError(f"no linear layers found in the decoder of {type(lm).__name__}")
    layers = ""
    if last_layers:
        n = len(decoder.layers)
        if last_layers > n:
            raise ValueError(f"lora.last_layers={last_layers}, but {type(lm).__name__} has {n} decoder layers")
        layers = rf"layers\.(?:{'|'.join(str(i) for i in range(n - last_layers, n))})\."
    return rf"^{re.escape(prefix)}\.(?!.*(?:vision|visual)){layers}.*\.({'|'.join(map(re.escape, leaves))})$"


def set_checkpointing(lm: Any, on: bool) -> None:
    """Non-reentrant activation checkpointing on or off (transformers 5's names; the deprecated
    ``gradient_checkpointing_*`` aliases, which warn on every call, only where the new ones are missing)."""
    if on and hasattr(lm, "activation_checkpointing_enable"):
        lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif on:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif hasattr(lm, "activation_checkpointing_disable"):
        lm.activation_checkpointing_disable()
    else:
        lm.gradient_checkpointing_disable()


def build_module(lm: Any, label_ids: Any, span_offset: float = 0.0) -> Any:
    """An nn.Module whose forward returns (B, K) option logits (and span reads), so DDP sees one forward call."""
    import torch

    from mydecide.scoring.forward import forward_option_logits
    from mydecide.scoring.spans import span_read_logits

    class DecisionModule(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = lm
            self.register_buffer("label_ids", torch.tensor(label_ids), persistent=False)

        def forward(self, batch: Any, spans: Any = None) -> Any:
            label_ids: torch.Tensor = self.label_ids  # type: ignore[assignment]
            logits = forward_option_logits(self.lm, batch, label_ids) if batch is not None else None
            if spans is None:  # (B, K); with span questions also their (M,) reads (scoring.spans)
                return logits
            return logits, span_read_logits(self.lm, spans.sequences, label_ids, spans.pad_id, offset=span_offset)

    return DecisionModule()


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
    train_records = load_records(split_path(data_dir, "train"))
    dev_records = dev_split(data_dir)
    trackers = check_trackers(recipe.report_to)
    data_sha256 = {split_path(data_dir, s).name: split_digest(split_path(data_dir, s)) for s in ("train", "dev")}
    if resume:
        check_resumable(Path(recipe.out), recipe, data_sha256, allow_change)
    elif allow_change:
        raise ValueError("--allow-change applies to --resume only")
    resolve_model_path(recipe.model, convert=False)

    import torch
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, ProjectConfiguration, broadcast_object_list, set_seed
    from peft import LoraConfig, get_peft_model
    from transformers import get_scheduler

    from mydecide.modeling import (
        LoadedModel,
        load_model,
        peft_warnings_silenced,
        save_render_config,
        weights_fingerprint,
    )
    from mydecide.scoring.packed import batch_packing, packing_mode
    from mydecide.scoring.span_head import HEAD_NAME, attach_span_head
    from mydecide.training import checkpoints
    from mydecide.training.batches import OrderSchedule, epoch_units, make_batch, plan_batches
    from mydecide.training.model_card import record_base_model, write_model_card

    # ---- data (first: whether a span head is trained decides how DDP is set up)
    counts = len(train_records), len(dev_records)
    if recipe.tasks:
        train_records, dev_records = select_tasks(train_records, dev_records, recipe.tasks, data_dir)
        kept = f"{len(train_records)} of {counts[0]} train and {len(dev_records)} of {counts[1]} dev records kept"
    if recipe.train_limit:
        train_records = train_records[: recipe.train_limit]
    if recipe.dev_limit:  # a fixed sample across tasks (dev files are often grouped by task)
        dev_records = sorted(dev_records, key=lambda r: hashlib.sha256(r.id.encode()).hexdigest())[: recipe.dev_limit]
    # a span head (scoring/span_head.py) is trained with the adapter when asked, or by default (auto) for span data
    span = recipe.prompt.span.resolve(any(r.question.type == "span" for r in train_records))
    head = span.read == "head"

    # ---- set up
    run = Path(recipe.out)
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
    is_main = accelerator.is_main_process
    set_seed(recipe.seed)
    if is_main:
        held.enter_context(directory_lock(run, "train"))
        if resume:  # checked again under the lock: another run may have written a checkpoint since
            against = check_resumable(run, recipe, data_sha256, allow_change)
            if problem := checkpoints.recipe_file_problem(run):
                log(
                    f"WARNING: {problem}; resuming against the recipe {against} was trained with (every checkpoint "
                    f"carries it), and writing {run / 'recipe.yaml'} again"
                )
        if run.exists() and not resume and any(run.iterdir()):
            raise FileExistsError(f"{run}: run directory exists; pass --resume to continue it or choose --out")
        (run / "checkpoints").mkdir(parents=True, exist_ok=True)
        atomic_write_text(run / "recipe.yaml", dump_recipe(recipe, {**provenance(), "data_sha256": data_sha256}))
        if trackers:  # TensorBoard: RUN/logs/mydecide/; wandb / mlflow: a run named after the run directory
            names = {"wandb": {"name": run.name}, "mlflow": {"run_name": run.name}}
            accelerator.init_trackers("mydecide", config=tracker_config(recipe), init_kwargs=names)
    if is_main and recipe.tasks:
        log(f"tasks {recipe.tasks}: {kept}")
    majority = LabelPrior.from_records(train_records, "training split")
    if is_main and (note := span_prior_note(train_records, recipe.prompt.span.prior)):
        log(note)

    # ---- model + LoRA
    base = load_model(
        recipe.model,
        render=recipe.prompt.model_copy(update={"span": span}),
        device=str(accelerator.device),
        dtype=torch.bfloat16 if precision == "bf16" else torch.float32,
    )
    renderer, tokenizer = base.renderer, base.tokenizer
    base_weights = weights_fingerprint(base.lm)  # saved beside each adapter: loading it checks the base (modeling)
    head_module = attach_span_head(base.lm, bias=span_log_odds(train_records) - span.offset) if head else None
    targets = lora_targets(base.lm, recipe.lora.target_modules, recipe.lora.last_layers)
    lora = LoraConfig(
        r=recipe.lora.r,
        lora_alpha=int(recipe.lora.alpha or 2 * recipe.lora.r),
        lora_dropout=recipe.lora.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
        modules_to_save=[HEAD_NAME] if head else None,
    )
    with peft_warnings_silenced():
        lm = get_peft_model(base.lm, lora)
    # A state's questions share it in one packed forward call (scoring/packed.py): checkpointing can recompute it and it
    # runs Gated DeltaNet layers. Where the KV cache also works (no checkpointing, no recurrent layers), a batch is
    # packed only when a state in it has several questions (batch_packing); the cache is the fallback for models
    # that cannot take a packed batch.
    recurrent = "linear_attention" in (getattr(base.lm.config, "layer_types", None) or [])
    cache_fails = recipe.gradient_checkpointing or recurrent
    packing = packing_mode(lm) if recipe.shared_prefix else None
    shared_prefix = recipe.shared_prefix and (packing is not None or not cache_fails)
    if recipe.gradient_checkpointing:
        set_checkpointing(lm, True)
    n_trainable = sum(p.numel() for p in lm.parameters() if p.requires_grad)
    with_head = ""
    if head_module is not None:
        with_head = f", a span head's {sum(p.numel() for p in head_module.parameters()):,} among them"
    log(f"LoRA r={lora.r} on {len(lm.targeted_module_names)} modules: {n_trainable:,} trainable parameters{with_head}")
    route = f"packed ({packing})" if packing else "KV cache" if shared_prefix else "none"
    if packing and not cache_fails:
        route += ", KV cache for batches with one question per state"
    log(f"state sharing: {route}")
    module = build_module(lm, renderer.label_ids, renderer.config.span.offset)

    # ---- schedule
    world, rank = accelerator.num_processes, accelerator.process_index

    def plan(epoch: int, phase: int) -> list[list[Any]]:
        """Phase 0: every option in its given order; phase 1: the recipe's shuffling and rotations."""
        if phase == 0:
            units = epoch_units(renderer, train_records, recipe.seed, epoch, False)
        else:
            units = epoch_units(
                renderer,
                train_records,
                recipe.seed,
                epoch,
                recipe.shuffle_options,
                recipe.shuffle_fraction,
                recipe.orders_per_record,
            )
        return plan_batches(units, recipe.optim.batch_size, recipe.seed, epoch)

    # epoch 0's plans, kept for the first pass of the loop; the ordered one only when there is an ordered phase
    first_plans = {(phase, 0): plan(0, phase) for phase in ((0, 1) if recipe.shuffle_start else (1,))}
    shuffled_per_epoch = len(first_plans[(1, 0)]) // world
    per_epoch = (len(first_plans[(0, 0)]) // world if (0, 0) in first_plans else shuffled_per_epoch, shuffled_per_epoch)
    if min(per_epoch) == 0:
        raise ValueError(f"{len(train_records)} training records make fewer batches than processes ({world})")
    micro_per_epoch = per_epoch[1]
    accum = recipe.optim.grad_accum
    total_updates = recipe.optim.max_steps or math.ceil(micro_per_epoch * recipe.optim.epochs / accum)
    schedule = OrderSchedule(round(recipe.shuffle_start * total_updates) * accum, per_epoch)
    optimizer = torch.optim.AdamW(
        [p for p in lm.parameters() if p.requires_grad], lr=recipe.optim.lr, weight_decay=recipe.optim.weight_decay
    )
    scheduler = get_scheduler(
        recipe.optim.schedule,
        optimizer,
        num_warmup_steps=round(recipe.optim.warmup_ratio * total_updates),
        num_training_steps=total_updates,
    )
    module, optimizer, scheduler = accelerator.prepare(module, optimizer, scheduler)
    log(
        f"{len(train_records)} train / {len(dev_records)} dev records; {micro_per_epoch} micro-batches of "
        f"{recipe.optim.batch_size} per epoch per process × {world} process(es); {total_updates} updates "
        f"(accumulation {accum}); objective {recipe.objective.kind}; {precision} on {accelerator.device}"
    )

    def scoring_model() -> LoadedModel:
        return LoadedModel(accelerator.unwrap_model(module).lm, tokenizer, renderer, recipe.model)

    # ---- resume
    checkpoints.save_lora_only(accelerator)
    training = checkpoints.trained_with(recipe, data_sha256)  # every checkpoint carries it: the resume guard
    update, best = 0, {"log_loss": math.inf, "update": None}
    found = checkpoints.resume_newest(accelerator, run, module) if resume else None
    if found is not None:
        update, best = found[1]["update"], found[1]["best"]
        log(f"resumed from {found[0].name} at update {update}/{total_updates}")
        if is_main:
            forget_updates_after(run, update, best)

    def save_adapter(name: str) -> None:
        def beside_the_weights(folder: Path) -> None:
            save_render_config(folder, renderer.config)  # span.read resolved
            record_base_model(folder, recipe.model, base_weights)  # its portable name, not the path of a cache
            kind = "best on dev" if name == "adapter" else "last"
            write_model_card(
                folder, recipe, kind, update, {"train": train_records, "dev": dev_records}, run / "metrics.jsonl"
            )

        checkpoints.save_adapter(accelerator, module, run / name, beside_the_weights)

    def evaluate_dev(epoch: float) -> None:
        """Dev metrics on the main process (on every process when the weights are sharded: each forward pass
        gathers them), written by the main process; all processes then agree on the best update and save it."""
        nonlocal best
        if is_main or checkpoints.is_sharded(accelerator):
            module.eval()
            started = time.perf_counter()
            metrics = dev_metrics(scoring_model(), dev_records, majority, recipe.seed, recipe.eval_batch_size)
            module.train()
        if is_main:
            row = {
                "kind": "dev",
                "update": update,
                "epoch": round(epoch, 3),
                **metrics,
                "seconds": round(time.perf_counter() - started, 1),
                "time": round(time.time(), 3),
            }
            write_metrics(run, row)
            accelerator.log(tracked("dev", {**row, "collapse_warnings": len(metrics["warnings"])}), step=update)
            log(dev_line(update, metrics))
            if update >= recipe.collapse_after * total_updates:
                for warning in metrics["warnings"]:
                    log(f"WARNING: {warning}")
            if metrics["log_loss"] < best["log_loss"]:
                best = {"log_loss": metrics["log_loss"], "accuracy": metrics["accuracy"], "update": update}
        best = broadcast_object_list([best])[0]
        if best["update"] == update:
            save_adapter("adapter")

    # ---- train
    module.train()
    cached, batches = (-1, -1), []
    started, last_log, start_update = time.perf_counter(), time.perf_counter(), update
    if update == 0:
        evaluate_dev(0.0)
    while update < total_updates:
        losses = []
        update_started, questions = time.perf_counter(), 0
        for a in range(accum):
            micro = update * accum + a
            phase, epoch, j = schedule.locate(micro)
            if (phase, epoch) != cached:
                if phase == 1 and cached[0] == 0 and is_main:
                    log(f"update {update}: options shuffled from now on (shuffle_start {recipe.shuffle_start})")
                batches = first_plans.pop((phase, epoch), []) or plan(epoch, phase)
                cached = (phase, epoch)
            micro_units = batches[j * world + rank]
            layout = batch_packing(micro_units, packing, cache_fails)
            tb = make_batch(micro_units, tokenizer.pad_token_id, shared_prefix, layout).to(accelerator.device)
            generator = torch.Generator(device=accelerator.device).manual_seed(recipe.seed * 1_000_003 + micro)
            sync = a == accum - 1
            with accelerator.no_sync(module) if not sync else _null():
                objective = loss_for(recipe.objective, update / total_updates)  # span questions: on their grid
                loss = batch_loss(module, tb, objective, progress=update / total_updates, generator=generator)
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
            row = {
                "kind": "train",
                "update": update,
                "epoch": round(schedule.epoch_float(update * accum), 4),
                "loss": mean_loss,
                "lr": scheduler.get_last_lr()[0],
                "grad_norm": float(grad_norm) if grad_norm is not None else None,
                "updates_per_s": round(1.0 / seconds, 4),
                "questions_per_s": round(all_questions / seconds, 2),
                "time": round(time.time(), 3),
            }
            write_metrics(run, row)
            accelerator.log(tracked("train", row), step=update)
            if time.perf_counter() - last_log > 10 or update == total_updates:
                elapsed = time.perf_counter() - started
                eta = elapsed / max(update - start_update, 1) * (total_updates - update)
                log(
                    f"update {update}/{total_updates} loss {mean_loss:.4f} lr {scheduler.get_last_lr()[0]:.2e} "
                    f"elapsed {elapsed:.0f}s eta {eta:.0f}s"
                )
                last_log = time.perf_counter()
        epoch_end = schedule.locate(update * accum)[1] != schedule.locate(update * accum - 1)[1]
        if update % recipe.eval_every == 0 or epoch_end or update == total_updates:
            evaluate_dev(schedule.epoch_float(update * accum))
        if update % recipe.save_every == 0 or update == total_updates:
            checkpoints.save_checkpoint(accelerator, run, update, best, recipe.keep_checkpoints, training)

    save_adapter("last")
    if best["update"] is None:  # dev log loss never improved on infinity (NaN): the last adapter is the best
        save_adapter("adapter")
    if is_main:
        atomic_write_text(run / "summary.json", json.dumps({"updates": update, "best": best}, indent=2) + "\n")
        log(
            f"done: best dev log loss {best['log_loss']:.4f} at update {best['update']} → {run / 'adapter'}; "
            f"last → {run / 'last'}"
        )
    for tracker in accelerator.trackers:  # flush and close (not end_training(): it ends the process group too)
        tracker.finish()
    accelerator.wait_for_everyone()
    return run


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def forget_updates_after(run: Path, update: int, best: dict[str, Any]) -> None:
    """Before a run resumed from update N trains N + 1, N + 2 … again: metrics.jsonl loses its lines of later
    updates, and a half-written line a killed run left (rewritten atomically), so that each (kind, update) is there
    once. A best adapter saved at one of those updates is named: it stays RUN/adapter until a dev evaluation beats
    the checkpoint's best."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return
    kept, dropped, later_dev = [], [], []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict) or not isinstance(row.get("update"), int):
            dropped.append(line)  # not a line this loop wrote whole
        elif row["update"] > update:
            dropped.append(line)
            if row.get("kind") == "dev" and isinstance(row.get("log_loss"), (int, float)):
                later_dev.append(row)
        else:
            kept.append(line + "\n")
    if not dropped:
        return
    atomic_write_text(path, "".join(kept))
    log(f"{path}: {len(dropped)} line(s) of updates after {update} dropped; they are trained again")
    beaten = [row for row in later_dev if row["log_loss"] < best["log_loss"]]
    if beaten and (run / "adapter").is_dir():
        saved_at = min(beaten, key=lambda row: row["log_loss"])["update"]
        until = (
            f"a dev log loss below {best['log_loss']:.4f} (update {best['update']}'s, the best up to update {update})"
            if best["update"] is not None
            else "the next dev evaluation"
        )
        log(
            f"WARNING: {run / 'adapter'} is the best adapter of update {saved_at}, after update {update} that this "
            f"run resumes from; it stays until {until} replaces it"
        )


def write_metrics(run: Path, row: dict[str, Any]) -> None:
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")
