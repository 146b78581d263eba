"""Checkpoints and resume: ``accelerator.save_state`` / ``load_state`` under a name only a complete checkpoint has.

A checkpoint is the directory ``RUN/checkpoints/update-NNNNNN``: what ``accelerator.save_state`` writes (the
trainable LoRA weights in model.safetensors — the frozen base is left out —, optimizer.bin, scheduler.bin and
random_states_<rank>.pkl for every process; under FSDP Accelerate's own sharded layout) and ``trainer_state.json``
(the update reached, the best dev result, and the resolved recipe and data hashes the run was trained with: JSON,
never a pickle, stamped with its format: one that another version of mydecide wrote is refused). The data order
needs no saved sampler: the batches of an update are a function of the seed, the epoch and the update number
(training/epochs.py). Because the recipe travels in the checkpoint, ``--resume`` checks a changed recipe or changed
data against what the checkpoint was trained with, whatever became of the run's ``recipe.yaml`` (see
:func:`check_resumable`).

It is written under a hidden ``.update-NNNNNN.tmp`` name by every process and renamed by the main process once all
of them have written their part, so a checkpoint is complete or absent. Resume loads the newest one that every
process can read, with ``weights_only`` unpickling (a file that carries code is refused, never run); a damaged newer
one is named and skipped. Every function here is called by all processes (they meet at collectives).
"""

from __future__ import annotations

import contextlib
import errno
import json
import re
import shutil
import sys
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mydecide.config import TrainRecipe
from mydecide.errors import UserError
from mydecide.formats import check_format, stamped
from mydecide.io import atomic_write_text
from mydecide.recipe_parsing import RecipeError, read_yaml

if TYPE_CHECKING:
    from mydecide.training.dev import DevLoss

CHECKPOINT = re.compile(r"update-\d+")  # a complete checkpoint; one being written is .update-N.tmp (never matches)
STATE_FILE = "trainer_state.json"  # update, best, recipe, data_sha256: what the loop needs besides Accelerate's state
STATE_FORMAT = 1  # trainer_state.json's format stamp (mydecide/formats.py): another is refused, never read
NEW_RUN = "start a new run with another --out"  # what to do when a run cannot be resumed
WEIGHTS_FILE = "model.safetensors"  # Accelerate's name for the first model's weights (LoRA only, see save_lora_only)


def log(message: str) -> None:
    print(f"[train] {message}", file=sys.stderr, flush=True)


def checkpoint_dirs(run: Path) -> list[Path]:
    """The run's complete checkpoints, oldest first."""
    folder = run / "checkpoints"
    found = [p for p in folder.iterdir() if CHECKPOINT.fullmatch(p.name) and p.is_dir()] if folder.is_dir() else []
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def trainable_names(model: Any) -> set[str]:
    """The state-dict keys of the parameters that train (the LoRA weights), as ``model`` names them."""
    return {name for name, p in model.named_parameters() if p.requires_grad}


def save_lora_only(accelerator: Any) -> None:
    """Make ``save_state`` write only the trainable weights of each model, not the frozen base (a checkpoint of a
    4B model stays megabytes). Under FSDP the weights list is empty and Accelerate saves its shards itself."""

    def keep_trainable(models: list[Any], weights: list[dict[str, Any]], output_dir: str) -> None:
        for model, state in zip(models, weights, strict=False):
            keep = trainable_names(model)
            for key in [k for k in state if k not in keep]:
                del state[key]

    accelerator.register_save_state_pre_hook(keep_trainable)


def all_agree(accelerator: Any, ok: bool) -> bool:
    """True when ``ok`` holds on every process (a collective: every process must call it)."""
    import torch

    flags = accelerator.gather(torch.tensor([1 if ok else 0], device=accelerator.device))
    return bool(int(flags.min()) == 1)


def trained_with(recipe: TrainRecipe, data_sha256: dict[str, str]) -> dict[str, Any]:
    """What every checkpoint records about how it was trained: the resolved recipe and the sha256 of each data
    split, by file name (the resume guard compares them, :func:`check_resumable`)."""
    return {"recipe": recipe.model_dump(mode="json"), "data_sha256": dict(data_sha256)}


def save_checkpoint(
    accelerator: Any, run: Path, update: int, best: dict[str, Any], keep: int, training: dict[str, Any]
) -> Path:
    """Write checkpoint ``update`` (every process writes its part) with ``training`` (:func:`trained_with`) in its
    trainer state, then name it complete and keep the newest ``keep``; a checkpoint that cannot be written (a full
    disk) is an OSError naming it, on every process."""
    target = run / "checkpoints" / f"update-{update:06d}"
    tmp = target.with_name(f".{target.name}.tmp")  # a half-written checkpoint never looks like one
    if accelerator.is_main_process:
        for leftover in target.parent.glob(".update-*.tmp"):
            shutil.rmtree(leftover, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    failure = ""
    try:
        accelerator.save_state(str(tmp))
        if accelerator.is_main_process:
            state = stamped({"update": update, "best": best, **training}, STATE_FORMAT)
            atomic_write_text(tmp / STATE_FILE, json.dumps(state, indent=2) + "\n")
    except (RuntimeError, OSError) as err:  # torch's word for a full disk or a file-size limit: "file write failed"
        failure = " ".join(str(err).split())[-120:] or type(err).__name__
    if not all_agree(accelerator, not failure):
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        reason = failure or "another process could not write its part"
        raise OSError(errno.EIO, f"could not write the checkpoint ({reason}); is the disk full?", str(tmp))
    if accelerator.is_main_process:
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        # newer ones are an earlier attempt's that resume skipped as damaged; of the rest keep the newest few
        older = [p for p in checkpoint_dirs(run) if int(p.name.split("-")[1]) <= update]
        for old in [p for p in checkpoint_dirs(run) if p not in older] + older[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return target


def read_trainer_state(path: Path) -> dict[str, Any]:
    """trainer_state.json of a checkpoint; KeyError / ValueError when it is not a complete one, a UserError in one
    line when another version of mydecide wrote it (its format stamp is not this version's)."""
    state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    check_format(state, path / STATE_FILE, version=STATE_FORMAT, remedy=NEW_RUN)
    missing = [key for key in ("update", "best", "recipe", "data_sha256") if key not in state]
    if missing:
        raise KeyError(f"no {', '.join(missing)} in {STATE_FILE}")
    return state


def check_readable(accelerator: Any, path: Path, model: Any) -> None:
    """Raise unless this process's part of checkpoint ``path`` reads back: the LoRA weights are exactly the model's
    trainable ones, and the pickled files unpickle with ``weights_only`` (Accelerate would skip an unreadable RNG
    state with a log line, and the resumed run would then differ from an uninterrupted one)."""
    from accelerate.utils import load
    from safetensors import safe_open

    read_trainer_state(path)
    if (path / WEIGHTS_FILE).is_file():  # not under FSDP, whose shards Accelerate checks as it loads them
        with safe_open(str(path / WEIGHTS_FILE), framework="pt") as weights:
            keys = set(weights.keys())
        wanted = trainable_names(accelerator.unwrap_model(model))  # Accelerate saves the unwrapped model's names
        if keys != wanted:
            raise KeyError(f"{WEIGHTS_FILE} holds {len(keys)} tensors, the model trains {len(wanted)}")
    rng = load(path / f"random_states_{accelerator.process_index}.pkl")
    if not isinstance(rng, dict) or "torch_manual_seed" not in rng:
        raise KeyError(f"random_states_{accelerator.process_index}.pkl holds no RNG state")


def resume_newest(accelerator: Any, run: Path, model: Any) -> tuple[Path, dict[str, Any]] | None:
    """Load the newest checkpoint every process can read into the prepared model, optimiser, scheduler and RNGs;
    returns it with its trainer state. A damaged newer one is named and skipped; None when the run has none; an
    error when none of them loads."""
    damaged = []
    for path in reversed(checkpoint_dirs(run)):
        reason = ""
        try:
            check_readable(accelerator, path, model)
            state = read_trainer_state(path)
            # strict=False: the file holds the LoRA weights only (check_readable made sure it holds all of them)
            accelerator.load_state(str(path), **({} if is_sharded(accelerator) else {"strict": False}))
        except Exception as err:  # any failure to read (truncated, not a checkpoint, code inside) means damaged
            reason = " ".join(str(err).split())[:160] or type(err).__name__
        if all_agree(accelerator, not reason):  # all processes resume from the same checkpoint or none
            return path, state
        log(f"checkpoint {path.name} is damaged or unreadable ({reason or 'on another process'}); skipped")
        damaged.append(path.name)
    if damaged:
        raise UserError(f"--resume {run}: no checkpoint could be read ({', '.join(damaged)} are damaged); {NEW_RUN}")
    return None


def is_sharded(accelerator: Any) -> bool:
    """FSDP or DeepSpeed: the weights are spread over the processes, so every process takes part in each forward
    pass and in gathering the weights to save them."""
    from accelerate.utils import DistributedType

    return accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)


def save_adapter(accelerator: Any, module: Any, target: Path, finish: Callable[[Path], None]) -> None:
    """Write the LoRA adapter of the prepared ``module`` (its ``lm`` is the PEFT model) to ``target`` atomically;
    ``finish(folder)`` adds what goes beside the weights. Every process calls it: ``get_state_dict`` gathers the
    full weights from the shards under FSDP / ZeRO-3 (a no-op otherwise); only the main process writes."""
    state = accelerator.get_state_dict(module)
    if accelerator.is_main_process:
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        lm_state = {key.removeprefix("lm."): value for key, value in state.items() if key.startswith("lm.")}
        accelerator.unwrap_model(module).lm.save_pretrained(tmp, state_dict=lm_state)
        finish(tmp)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    accelerator.wait_for_everyone()


def forget_updates_after(run: Path, update: int, best: DevLoss) -> None:
    """Before a run resumed from update N trains N + 1, N + 2 … again: metrics.jsonl loses its lines of later
    updates, and a half-written line a killed run left (rewritten atomically), so that each (kind, update) is there
    once. A best adapter saved at one of those updates is named: it stays RUN/adapter until a dev evaluation
    replaces the checkpoint's best."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return
    kept, dropped, replaced = [], [], []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict) or not isinstance(row.get("update"), int):
            dropped.append(line)  # not a line this loop wrote whole
        elif row["update"] > update:
            dropped.append(line)
            if row.get("kind") == "dev" and row.get("kept") is True:  # it became RUN/adapter
                replaced.append(row["update"])
        else:
            kept.append(line + "\n")
    if not dropped:
        return
    atomic_write_text(path, "".join(kept))
    log(f"{path}: {len(dropped)} line(s) of updates after {update} dropped; they are trained again")
    saved_at = max(replaced, default=None)  # the last that became RUN/adapter is the one there
    if saved_at is not None and (run / "adapter").is_dir():
        until = (
            f"a dev evaluation replaces update {best.update}'s (the best up to update {update}, dev log loss "
            f"{best.log_loss:.4f})"
            if best.update is not None
            else "the next dev evaluation"
        )
        log(
            f"WARNING: {run / 'adapter'} is the best adapter of update {saved_at}, after update {update} that this "
            f"run resumes from; it stays until {until}"
        )


# ---------------------------------------------------------------------------------- may the run be resumed?

# what --resume --allow-change KEY may change: how long to train and how often to look; nothing the saved weights,
# optimiser or data order depend on
SAFE_CHANGES = (
    "optim.max_steps",
    "optim.epochs",
    "eval_every",
    "save_every",
    "keep_checkpoints",
    "eval_batch_size",
    "collapse_after",
    "report_to",
)


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 1e-4}}`` → ``{"optim.lr": 1e-4}`` (lists stay whole)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        out.update(flat(value, name + ".") if isinstance(value, dict) and value else {name: value})
    return out


def saved_training(run: Path) -> tuple[dict[str, Any], dict[str, str], str]:
    """(recipe, data sha256 by file name, where they were read) of the run in ``run``: from its newest checkpoint whose
    trainer state reads (a damaged newer one is passed over, as :func:`resume_newest` skips it).

    No such directory, no checkpoint in it, or no checkpoint whose trainer state reads is an error naming what is
    missing: ``--resume`` never starts a fresh run. A checkpoint that another version of mydecide saved is refused
    in one line: this version does not resume it."""
    if not run.is_dir():
        what = "is not a directory" if run.exists() else "no such run directory"
        raise FileNotFoundError(f"--resume {run}: {what}; give the --out of the run to continue")
    found = checkpoint_dirs(run)
    if not found:
        raise FileNotFoundError(
            f"--resume {run}: no checkpoint to resume from (no complete update-N in {run / 'checkpoints'}); "
            "to start the run again, remove it or choose another --out, without --resume"
        )
    unreadable = []
    for path in reversed(found):
        try:
            state = read_trainer_state(path)
        except UserError:  # saved by another version of mydecide
            raise
        except (OSError, ValueError, KeyError) as err:  # not JSON, not UTF-8, cut short, a key missing
            unreadable.append(f"{path / STATE_FILE} ({' '.join(str(err).split())[:120] or type(err).__name__})")
            continue
        recipe, data = state.get("recipe"), state.get("data_sha256")
        if not isinstance(recipe, dict) or not isinstance(data, dict):
            unreadable.append(f"{path / STATE_FILE} (its recipe or data_sha256 is not a mapping)")
            continue
        return recipe, data, f"checkpoint {path.name}"
    raise UserError(f"--resume {run}: no checkpoint could be read: {'; '.join(unreadable)}; {NEW_RUN}")


def recipe_file_problem(run: Path) -> str | None:
    """What is wrong with the run's recipe.yaml (missing, not text, not YAML, not a mapping), or None when it reads.
    Resuming does not need it (every checkpoint carries its recipe), but a run whose record of its recipe is gone
    should say so."""
    path = run / "recipe.yaml"
    if not path.is_file():
        return f"{path} is missing"
    try:
        read_yaml(path)
    except RecipeError as err:
        return f"{path} is unreadable ({str(err).removeprefix(f'{path}: ')})"
    except (OSError, UnicodeDecodeError) as err:
        return f"{path} is unreadable ({getattr(err, 'reason', None) or getattr(err, 'strerror', None) or err})"
    return None


def recipe_changes(
    saved: dict[str, Any], trained_on: dict[str, str], recipe: TrainRecipe, data_sha256: dict[str, str]
) -> list[tuple[str, Any, Any]]:
    """(key, saved, new) for each recipe value, and each data file, that differs from what a run trained with
    (``saved``, ``trained_on``: :func:`saved_training`); ``out`` and the ``data`` path are not compared, the data
    files' hashes are."""
    from pydantic import ValidationError

    with contextlib.suppress(ValidationError):  # keys added since the run was saved take their defaults
        saved = TrainRecipe.model_validate(saved).model_dump(mode="json")
    before, after = flat(saved), flat(recipe.model_dump(mode="json"))
    absent = "(absent)"
    changes = [
        (key, before.get(key, absent), after.get(key, absent))
        for key in [*before, *after]
        if key not in ("out", "data") and before.get(key, absent) != after.get(key, absent)
    ]
    changes = list(dict.fromkeys(changes))
    for name, digest in trained_on.items():
        if data_sha256.get(name) != digest:
            changes.append((f"data {name} (sha256)", str(digest)[:12], str(data_sha256.get(name, absent))[:12]))
    return changes


def check_resumable(run: Path, recipe: TrainRecipe, data_sha256: dict[str, str], allow_change: Collection[str]) -> str:
    """Refuse to resume a run that has no checkpoint, or with another recipe or other data than its newest readable
    checkpoint was trained with, listing every difference; the keys in ``allow_change`` (only ``SAFE_CHANGES``) may
    differ. Returns what the recipe was checked against (``checkpoint update-N``)."""
    unsafe = sorted(set(allow_change) - set(SAFE_CHANGES))
    if unsafe:
        raise UserError(
            f"--allow-change: {', '.join(unsafe)} cannot change on resume (only "
            f"{', '.join(SAFE_CHANGES)} can); start a new run with another --out"
        )
    saved, trained_on, where = saved_training(run)
    changes = [c for c in recipe_changes(saved, trained_on, recipe, data_sha256) if c[0] not in allow_change]
    if not changes:
        return where
    listed = "; ".join(f"{key}: {old} → {new}" for key, old, new in changes)
    if all(key in SAFE_CHANGES for key, _, _ in changes):
        hint = "to continue with it, pass " + " ".join(f"--allow-change {key}" for key, _, _ in changes)
    else:
        hint = (
            f"start a new run with another --out (only {', '.join(SAFE_CHANGES)} may change, with --allow-change KEY)"
        )
    raise UserError(f"--resume {run}: the recipe or data differs from what {where} was trained with: {listed}; {hint}")
