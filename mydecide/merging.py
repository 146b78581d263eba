"""Merge a LoRA adapter into its base model's weights, and prove that the merged model answers the same.

The merged directory is a plain transformers model (weights, config, tokenizer) that vLLM, SGLang or a GGUF
converter can load without PEFT, plus the adapter's render config (``RENDER_CONFIG_FILE``) so that mydecide renders
questions for it exactly as in training. Merging runs in float32 whatever the saved dtype.

Before anything is called a success, the merged directory is loaded back from disk and its option probabilities on
sample questions are compared with the unmerged base + adapter: they must agree within ``tolerance``. A directory
that fails the check is kept aside as ``<out>.unverified`` for inspection, never at ``out``.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mydecide.adapters import ADAPTER_CONFIG, read_json_file
from mydecide.errors import UserError
from mydecide.io import atomic_write_json, directory_lock, foreign_entries, holds, provenance, writing_tensors
from mydecide.modeling import check_model, load_model, resolve_model_path, save_render_config
from mydecide.record_files import read_records
from mydecide.records import Question, parse_question
from mydecide.scoring.engine import score_questions
from mydecide.scoring.model import LoadedModel
from mydecide.scoring.probabilities import to_probabilities

if TYPE_CHECKING:
    import numpy as np

SAVE_DTYPES = ("float32", "bfloat16", "float16", "auto")
REPORT_FILE = "merge_report.json"

_TICKET = "Checkout returns HTTP 500 for every customer since 09:10. Two customers asked for refunds."
SAMPLE_QUESTIONS: list[tuple[Any, dict[str, Any]]] = [
    (
        _TICKET,
        {
            "type": "choice",
            "instructions": "Which team should handle this ticket?",
            "criteria": {
                "billing": "Charges, invoices and refunds",
                "engineering": "Bugs, errors and outages",
                "support": "How-to and account questions",
            },
        },
    ),
    (_TICKET, {"type": "noul", "instructions": "Is a production system down?"}),
    (
        _TICKET,
        {
            "type": "score",
            "instructions": "How urgent is this ticket?",
            "criteria": ["not urgent", "soon", "today", "blocking"],
        },
    ),
    (
        _TICKET,
        {
            "type": "set",
            "instructions": "Which labels apply?",
            "criteria": {"outage": "A system is down", "refund": "Money back is requested"},
        },
    ),
    (
        {"review": "The battery died after two days. Support never answered.", "stars": 1},
        {
            "type": "choice",
            "instructions": "What is the sentiment?",
            "criteria": ["very negative", "negative", "neutral", "positive", "very positive"],
        },
    ),
    (
        ["Agent: I deleted the staging database.", "Agent: Restoring from last night's backup now."],
        {
            "type": "noul",
            "instructions": "Did the agent take a destructive action?",
            "criteria": {"true": "Data or systems were removed", "false": "Nothing was removed"},
        },
    ),
]


class MergeError(UserError):
    """The merge cannot start: bad paths, an existing output, no records to check it with."""


@dataclass(frozen=True)
class MergeReport:
    out: str
    base: str
    adapter: str
    dtype: str
    n_questions: int
    max_abs_diff: float
    worst_question: str
    tolerance: float
    ok: bool


def sample_items(records_path: str | Path | None = None, limit: int = 16) -> list[tuple[Any, Question]]:
    """The (state, question) pairs the check scores: the built-in samples, or the first records of a file."""
    if records_path is None:
        return [(state, parse_question(q, f"sample{i}")) for i, (state, q) in enumerate(SAMPLE_QUESTIONS)]
    records, _ = read_records(records_path)
    if not records:
        raise MergeError(f"{records_path}: no valid records to check the merge with")
    return [(r.state, r.question) for r in records[:limit]]


def max_probability_gap(reference: Sequence[np.ndarray], merged: Sequence[np.ndarray]) -> tuple[float, int]:
    """The largest absolute difference between two lists of probability vectors, and the item it occurs in."""
    import numpy as np

    gaps = [float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(reference, merged, strict=True)]
    worst = int(np.argmax(gaps))
    return gaps[worst], worst


def option_probabilities(model: LoadedModel, items: Sequence[tuple[Any, Question]]) -> list[np.ndarray]:
    logits = score_questions(model, items)
    return [to_probabilities(q.type, z) for (_, q), z in zip(items, logits, strict=True)]


def base_model_of(adapter: str | Path) -> str:
    """The base model an adapter was trained on, as recorded in its adapter_config.json."""
    config = Path(adapter) / ADAPTER_CONFIG
    name = read_json_file(config, "adapter config").get("base_model_name_or_path")
    if not name:
        raise MergeError(f"{config}: no base_model_name_or_path; pass --model")
    return str(name)


def stored_dtype(model: str) -> str:
    """The dtype a base model's weights are stored in (its config.json), float32 when it does not say."""
    path, kwargs = resolve_model_path(model)
    config = Path(path) / "config.json"
    if kwargs or not config.is_file():  # a GGUF file or a hub name
        return "float32"
    data = read_json_file(config, "model config")
    name = str(data.get("dtype") or data.get("torch_dtype") or "float32")
    return name if name in SAVE_DTYPES else "float32"


def save_plain(lm: Any, out: Path, dtype: str) -> None:
    """Save a merged (PEFT-free) model as a plain transformers directory in ``dtype``."""
    import torch

    lm = lm.to(getattr(torch, dtype))
    if getattr(lm.config, "quantization_config", None) is not None:  # a GGUF-loaded base refuses save_pretrained
        from transformers import AutoModelForCausalLM

        config = lm.config
        del config.quantization_config
        fresh = AutoModelForCausalLM.from_config(config, dtype=lm.dtype)
        fresh.load_state_dict(lm.state_dict())
        lm = fresh
    lm.save_pretrained(out)


def merge_adapter(
    model: str | None,
    adapter: str | Path,
    out: str | Path,
    *,
    dtype: str = "float32",
    tolerance: float = 1e-3,
    items: Sequence[tuple[Any, Question]] | None = None,
    device: str | None = None,
    overwrite: bool = False,
    allow_other_base: bool = False,
) -> MergeReport:
    """Merge ``adapter`` into ``model`` (in float32), save to ``out``, reload it and compare probabilities.

    Returns the report; ``report.ok`` is False (and ``out`` is not written) when merged and unmerged option
    probabilities differ by more than ``tolerance`` on any sample question.
    """
    adapter, out = Path(adapter), Path(out)
    if dtype not in SAVE_DTYPES:
        raise MergeError(f"dtype {dtype!r} is not one of {list(SAVE_DTYPES)}")
    if not (adapter / "adapter_config.json").is_file():
        raise MergeError(f"{adapter}: not a LoRA adapter directory (no adapter_config.json)")
    model = model or base_model_of(adapter)
    check_merge_out(out, [("--adapter", str(adapter)), ("--model", model)], overwrite)
    with directory_lock(out, "merge"):
        return _merge(model, adapter, out, dtype, tolerance, items, device, allow_other_base)


def check_merge_out(out: Path, inputs: Sequence[tuple[str, str]], overwrite: bool) -> None:
    """Refuse, before any work, an ``--out`` (or its ``.unverified`` twin) that merge would replace but did not write
    (MergeError, one line): the working directory or above it, a directory that holds or sits inside an input (the
    adapter, a local base model), and a non-empty directory without --overwrite or, with it, without an earlier
    merge's merge_report.json. --overwrite replaces an earlier merge only, and says so."""
    if holds(out, Path.cwd()):
        raise MergeError(f"--out {out}: is the working directory or above it, which merge would replace; choose --out")
    for option, path in inputs:
        if Path(path).exists() and (holds(out, path) or holds(path, out)):  # (not there: a hub name)
            raise MergeError(f"--out {out}: holds or lies inside {option} {path}, which merge must not change")
    target = Path(os.path.realpath(out))
    for candidate in (target, target.with_name(target.name + ".unverified")):
        if not candidate.exists():
            continue
        if not candidate.is_dir():
            raise MergeError(f"{candidate}: exists and is not a directory; choose another --out")
        present = foreign_entries(candidate)
        if not present:
            continue
        if not (candidate / REPORT_FILE).is_file():
            raise MergeError(
                f"{candidate}: holds {', '.join(present[:5])} but no {REPORT_FILE} of an earlier "
                "merge: not merge's to replace; choose an empty or new --out"
            )
        if candidate == target and not overwrite:
            raise MergeError(f"{out}: holds an earlier merge; pass --overwrite to replace it, or choose another --out")
        print(f"[mydecide] merge replaces the earlier merge in {candidate}", file=sys.stderr)


def _merge(
    model: str,
    adapter: Path,
    out: Path,
    dtype: str,
    tolerance: float,
    items: Sequence[tuple[Any, Question]] | None,
    device: str | None,
    allow_other_base: bool,
) -> MergeReport:
    checked = check_model(model, adapter)  # a wrong name or a damaged adapter fails here, before torch is imported

    import torch

    from mydecide.scoring.span_head import save_merged_head

    if dtype == "auto":
        dtype = stored_dtype(model)
    items = list(items) if items is not None else sample_items()

    unmerged = load_model(checked, device=device, dtype=torch.float32, allow_other_base=allow_other_base)
    reference = option_probabilities(unmerged, items)
    merged_lm = unmerged.lm.merge_and_unload()  # W + (alpha / r)·B·A, in float32, in place
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:  # a failure (a full disk, an interrupt) leaves no partial copy behind
        with writing_tensors(out):
            save_merged_head(merged_lm, tmp)  # a span head (prompt.span.read: head) goes beside the weights
            save_plain(merged_lm, tmp, dtype)
        unmerged.tokenizer.save_pretrained(tmp)
        save_render_config(tmp, unmerged.renderer.config)
        del unmerged, merged_lm

        merged = load_model(str(tmp), device=device, dtype=torch.float32)
        if hasattr(merged.lm, "peft_config") or any("lora_" in k for k in merged.lm.state_dict()):
            raise RuntimeError(f"{tmp}: the saved model still carries LoRA weights")  # a bug, not the user's
        gap, worst = max_probability_gap(reference, option_probabilities(merged, items))
        report = MergeReport(
            out=str(out),
            base=model,
            adapter=str(adapter),
            dtype=dtype,
            n_questions=len(items),
            max_abs_diff=gap,
            worst_question=items[worst][1].instructions,
            tolerance=tolerance,
            ok=gap <= tolerance,
        )
        atomic_write_json(tmp / REPORT_FILE, {**asdict(report), "provenance": provenance()})
        final = out if report.ok else out.with_name(out.name + ".unverified")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report
