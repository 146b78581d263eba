"""Evaluation: score decision records and say how good, how calibrated and how robust the answers are.

The steps, in the order :func:`run_evaluation` runs them:

1. score every record (batched, questions on one state share the state's computation; progress on stderr)
   and turn the logits into probabilities with the fitted temperatures;
2. score every choice question again with its options shown in other orders (the reversed order plus
   ``permutations`` random ones) to measure the option-order flip rate;
3. metrics for all questions, per type, per task and per slice (language, option count, state length,
   confidence bin), from one flat list of scored rows;
4. baselines beside the model: the majority class per task (its label distribution taken from the training
   split when one sits beside the data) and the base model without its adapter;
5. the auto-act threshold from payoffs and the coverage / accuracy / payoff table around it;
6. optionally, coherence checks: noul + negation sum to 1, anonymised option ids keep the answer, an answer
   does not depend on the other questions scored with it.

``set`` questions are scored as one yes/no row per label; every metric below counts those label rows (``n``)
and the questions they come from (``questions``) separately.

:func:`write_outputs` writes ``predictions.jsonl``, ``report.json``, ``report.md`` and ``reliability.png``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mydecide import metrics
from mydecide.calibration import option_bucket
from mydecide.prompting import render_state
from mydecide.records import QUESTION_TYPES, Question, Record

if TYPE_CHECKING:
    from mydecide.config import EvalRecipe
    from mydecide.modeling import LoadedModel

Orders = Sequence[Sequence[int] | None] | None
Scorer = Callable[[Sequence[tuple[Any, Question]], Orders], list[np.ndarray]]
"""(state, question) items and optional option orders → logits in canonical option order (set: yes−no per label)."""
TemperatureFn = Callable[[str, int], float]

DEFAULT_COSTS = {"right": 1.0, "wrong": -3.0, "escalate": -0.5}
DEFAULT_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
NEGATION_TEMPLATE = "Is it NOT the case that: {instructions}"
NEGATION_TOLERANCE = 0.05
"""A noul and its negation violate coherence when |P(yes) + P(yes | negated) − 1| exceeds this."""
CONTEXT_TOLERANCE = 0.01
"""An answer depends on its companions when a probability moves by more than this (bf16 noise is ~1e-3)."""
STATE_TOKEN_BUCKETS = (128, 512, 2048)
METRIC_KEYS = (
    "n",
    "questions",
    "accuracy",
    "chance_corrected",
    "log_loss",
    "brier",
    "ece",
    "rps",
    "aurc",
    "soft_accuracy",
    "total_variation",
    "n_soft",
    "flip_rate",
    "flip_n",
    "latency_p50_ms",
    "latency_p95_ms",
)


# ------------------------------------------------------------------------------------------------- scoring


def model_scorer(model: LoadedModel, *, batch_size: int = 16, shared_prefix: bool = True) -> Scorer:
    """The default scorer: ``score_questions`` on a loaded model."""
    from mydecide.modeling import score_questions

    def score(items: Sequence[tuple[Any, Question]], orders: Orders = None) -> list[np.ndarray]:
        return score_questions(model, items, orders=orders, batch_size=batch_size, shared_prefix=shared_prefix)

    return score


@contextmanager
def adapter_disabled(model: LoadedModel) -> Iterator[None]:
    """Score the base model through the same loaded weights: PEFT's ``disable_adapter()`` context."""
    lm = model.lm
    if not hasattr(lm, "disable_adapter"):
        raise ValueError(f"{model.name}: no adapter is loaded, so there is no base model to compare with")
    with lm.disable_adapter():
        yield


def has_adapter(model: LoadedModel | None) -> bool:
    return model is not None and hasattr(model.lm, "disable_adapter") and hasattr(model.lm, "peft_config")


def prompt_counter(model: LoadedModel | None) -> Callable[[Question], int]:
    """Prompts one question costs with ``model``'s scoring form (letters without a model)."""
    from mydecide.many_options import prompt_count

    if model is None:
        return prompt_count
    renderer = model.renderer
    return lambda question: prompt_count(question, renderer.form(question))


def score_records(
    scorer: Scorer,
    items: Sequence[tuple[Any, Question]],
    orders: Orders = None,
    *,
    chunk_prompts: int = 64,
    desc: str = "scoring",
    progress: bool = True,
    prompts_of: Callable[[Question], int] | None = None,
) -> tuple[list[np.ndarray], list[float]]:
    """Logits and per-question latency (seconds) for each (state, question).

    Questions are scored in chunks of about ``chunk_prompts`` prompts, questions on one state kept together so
    the state is computed once. A question's latency is its share of its chunk's wall time (set questions
    count one prompt per label, per-option questions one per option: ``prompts_of``): the amortised cost of a
    question in a batched server.
    """
    from tqdm import tqdm

    prompts_of = prompts_of or prompt_counter(None)
    keys = [render_state(state) for state, _ in items]
    index = sorted(range(len(items)), key=lambda i: (len(keys[i]), keys[i]))  # similar lengths, same state adjacent
    logits: list[np.ndarray] = [np.empty(0)] * len(items)
    latency = [0.0] * len(items)
    bar = tqdm(total=len(items), desc=desc, unit="q", file=sys.stderr, disable=not progress, leave=False)
    start = 0
    while start < len(index):
        stop, prompts = start, 0
        while stop < len(index) and (
            prompts < chunk_prompts or (stop > start and keys[index[stop]] == keys[index[stop - 1]])
        ):
            prompts += prompts_of(items[index[stop]][1])
            stop += 1
        chunk = index[start:stop]
        started = time.perf_counter()
        out = scorer([items[i] for i in chunk], [orders[i] for i in chunk] if orders is not None else None)
        elapsed = time.perf_counter() - started
        for i, z in zip(chunk, out, strict=True):
            logits[i] = np.asarray(z, dtype=float)
            latency[i] = elapsed * prompts_of(items[i][1]) / prompts
        bar.update(len(chunk))
        start = stop
    bar.close()
    return logits, latency


def probabilities(qtype: str, logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """softmax(z / T) over the options; set → sigmoid(z / T) per label (same as ``modeling.to_probabilities``)."""
    from scipy.special import expit, softmax

    z = np.asarray(logits, dtype=float) / temperature
    return expit(z) if qtype == "set" else softmax(z)


# ----------------------------------------------------------------------------------------- order robustness


def permuted_orders(records: Sequence[Record], permutations: int, seed: int) -> list[tuple[int, tuple[int, ...]]]:
    """(record index, shown order) pairs for the flip-rate pass: reversed + ``permutations`` random orders.

    Only choice questions: a client gives their options in some order, while yes / no questions (and set labels)
    are always rendered "A. yes, B. no" and score levels in their order (prompting.py), so no request can reorder those.
    Orders equal to the identity or to one already listed are skipped, so K = 2 gets one.
    """
    rng = np.random.default_rng(seed)
    pairs: list[tuple[int, tuple[int, ...]]] = []
    for n, record in enumerate(records):
        q = record.question
        if q.type != "choice" or q.k < 2:
            continue
        identity = tuple(range(q.k))
        seen = {identity}
        candidates = [identity[::-1]] + [tuple(int(i) for i in rng.permutation(q.k)) for _ in range(permutations)]
        for order in candidates:
            if order not in seen:
                seen.add(order)
                pairs.append((n, order))
    return pairs


def flip_flags(
    records: Sequence[Record],
    logits: Sequence[np.ndarray],
    pairs: Sequence[tuple[int, tuple]],
    permuted: Sequence[np.ndarray],
) -> list[bool | None]:
    """Per record: True when any other option order changes the argmax, None when not applicable."""
    flags: list[bool | None] = [None] * len(records)
    for (n, _), z in zip(pairs, permuted, strict=True):
        changed = int(np.argmax(z)) != int(np.argmax(logits[n]))
        flags[n] = bool(flags[n]) or changed
    return flags


# ------------------------------------------------------------------------------------------------ metric rows


@dataclass(frozen=True)
class Row:
    """One scored probability row: a question, or one label of a set question (a yes/no row)."""

    question: int  # index of the question the row comes from
    qtype: str
    task: str
    lang: str
    k: int  # options of the question (set: labels)
    state_tokens: int
    probs: np.ndarray  # (K,) predicted distribution (set label: (P(yes), P(no)))
    target: np.ndarray  # (K,) target distribution
    soft: bool
    flipped: bool | None = None
    latency: float | None = None
    file: str = ""
    label: str = ""  # set label rows: the label


def question_rows(
    n: int,
    record: Record,
    probs: np.ndarray,
    *,
    state_tokens: int = 0,
    flipped: bool | None = None,
    latency: float | None = None,
    file: str = "",
) -> list[Row]:
    """The metric rows of one question: itself, or one binary row per set label."""
    q = record.question
    base: dict[str, Any] = {
        "question": n,
        "qtype": q.type,
        "task": record.task,
        "lang": record.lang,
        "k": q.k,
        "state_tokens": state_tokens,
        "soft": record.soft,
        "latency": latency,
        "file": file,
    }
    if q.type != "set":
        return [
            Row(
                probs=np.asarray(probs, dtype=float),
                target=np.asarray(record.target, dtype=float),
                flipped=flipped,
                **base,
            )
        ]
    return [
        Row(probs=np.array([p, 1.0 - p]), target=np.array([y, 1.0 - y]), label=label, **base)
        for p, y, label in zip(probs, record.target, q.options, strict=True)
    ]


def _percentile_ms(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values) * 1000.0, q)) if values else None


def block(rows: Sequence[Row]) -> dict[str, Any]:
    """Every metric of one group of rows (all keys of ``METRIC_KEYS``; values None where not defined)."""
    if not rows:
        return dict.fromkeys(METRIC_KEYS, None) | {"n": 0, "questions": 0}
    probs = [r.probs for r in rows]
    targets = [r.target for r in rows]
    out: dict[str, Any] = metrics.summarize(probs, targets, [r.qtype == "score" for r in rows])
    out["questions"] = len({r.question for r in rows})
    out["types"] = [t for t in QUESTION_TYPES if any(r.qtype == t for r in rows)]
    soft = [r for r in rows if r.soft]
    out["n_soft"] = len(soft)
    out["soft_accuracy"] = metrics.soft_accuracy([r.probs for r in soft], [r.target for r in soft]) if soft else None
    out["total_variation"] = (
        metrics.total_variation([r.probs for r in soft], [r.target for r in soft]) if soft else None
    )
    flips = [r.flipped for r in rows if r.flipped is not None]
    out["flip_rate"] = float(np.mean(flips)) if flips else None
    out["flip_n"] = len(flips)
    latencies = list({r.question: r.latency for r in rows if r.latency is not None}.values())
    out["latency_p50_ms"] = _percentile_ms(latencies, 50)
    out["latency_p95_ms"] = _percentile_ms(latencies, 95)
    set_rows = [r for r in rows if r.qtype == "set"]
    if set_rows:
        out.update(set_metrics(set_rows))
    return {key: out.get(key) for key in METRIC_KEYS} | {k: v for k, v in out.items() if k not in METRIC_KEYS}


def _f1(tp: int, fp: int, fn: int) -> float:
    """F1 of counts; 1.0 when there is nothing to find and nothing was predicted."""
    return 2 * tp / (2 * tp + fp + fn) if (tp + fp + fn) else 1.0


def set_metrics(rows: Sequence[Row]) -> dict[str, Any]:
    """Metrics of the label rows of set questions, each label a yes/no decision at 0.5.

    ``exact_set_accuracy``: every label of a question right; ``micro_f1``: F1 of the pooled label decisions;
    ``macro_f1``: the mean F1 of each label (a task's label; a label never gold nor predicted counts 1.0);
    ``label_log_loss``: the mean binary log loss per label row; ``by_label``: n, log loss and F1 per label.
    """
    right: dict[int, bool] = {}
    counts: dict[str, list[int]] = {}  # label → [tp, fp, fn]
    per_label: dict[str, list[Row]] = {}
    for r in rows:
        predicted, gold = bool(r.probs[0] >= 0.5), bool(r.target[0] >= 0.5)
        right[r.question] = right.get(r.question, True) and predicted == gold
        key = f"{r.task}/{r.label}" if r.label else r.task
        c = counts.setdefault(key, [0, 0, 0])
        c[0] += predicted and gold
        c[1] += predicted and not gold
        c[2] += gold and not predicted
        per_label.setdefault(key, []).append(r)
    tp, fp, fn = (sum(c[i] for c in counts.values()) for i in range(3))
    return {
        "exact_set_accuracy": float(np.mean(list(right.values()))),
        "micro_f1": _f1(tp, fp, fn),
        "macro_f1": float(np.mean([_f1(*c) for c in counts.values()])),
        "label_log_loss": metrics.log_loss([r.probs for r in rows], [r.target for r in rows]),
        "by_label": {
            key: {
                "n": len(got),
                "log_loss": metrics.log_loss([r.probs for r in got], [r.target for r in got]),
                "f1": _f1(*counts[key]),
            }
            for key, got in sorted(per_label.items())
        },
    }


def state_bucket(tokens: int) -> str:
    """State length bucket in tokens: 0-127, 128-511, 512-2047, 2048+."""
    low = 0
    for edge in STATE_TOKEN_BUCKETS:
        if tokens < edge:
            return f"{low}-{edge - 1}"
        low = edge
    return f"{low}+"


def confidence_bin(row: Row, bins: int = 10) -> str:
    """The equal-width bin of the row's top probability, e.g. "0.6-0.7" (1.0 falls in the last bin)."""
    b = min(math.floor(float(np.max(row.probs)) * bins), bins - 1)
    return f"{b / bins:.1f}-{(b + 1) / bins:.1f}"


SLICES: dict[str, Callable[[Row], str]] = {
    "lang": lambda r: r.lang,
    "option_count": lambda r: option_bucket(r.k),
    "state_tokens": lambda r: state_bucket(r.state_tokens),
    "confidence": confidence_bin,
}


def _group(rows: Sequence[Row], key: Callable[[Row], str]) -> dict[str, list[Row]]:
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return groups


def _bucket_order(name: str) -> tuple[float, str]:
    head = name.split("-")[0].rstrip("+")
    try:
        return float(head), name
    except ValueError:
        return math.inf, name


def metric_blocks(rows: Sequence[Row], *, slices: bool = True) -> dict[str, Any]:
    """ "all", one block per question type, "by_task", "by_file" (several files) and, optionally, "slices"."""
    out: dict[str, Any] = {"all": block(rows)}
    for qtype in QUESTION_TYPES:
        out[qtype] = block([r for r in rows if r.qtype == qtype])
    out["by_task"] = {task: block(group) for task, group in sorted(_group(rows, lambda r: r.task).items())}
    files = _group(rows, lambda r: r.file)
    if len(files) > 1:
        out["by_file"] = {name: block(group) for name, group in files.items()}
    if slices:
        out["slices"] = {
            name: {
                value: block(group)
                for value, group in sorted(_group(rows, key).items(), key=lambda kv: _bucket_order(kv[0]))
            }
            for name, key in SLICES.items()
        }
    return out


# ------------------------------------------------------------------------------------------ majority baseline


@dataclass
class LabelPrior:
    """Label distributions per task, from which the majority baseline predicts (add-one smoothed).

    ``mass[(task, type)][option]`` sums the target mass of each option id; ``count`` the questions seen.
    """

    source: str
    mass: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    count: dict[tuple[str, str], int] = field(default_factory=dict)

    @classmethod
    def from_records(cls, records: Sequence[Record], source: str) -> LabelPrior:
        prior = cls(source)
        for r in records:
            key = (r.task, r.question.type)
            mass = prior.mass.setdefault(key, {})
            for option, y in zip(r.question.options, r.target, strict=True):
                mass[option] = mass.get(option, 0.0) + y
            prior.count[key] = prior.count.get(key, 0) + 1
        return prior

    @classmethod
    def from_file(cls, path: str | Path) -> LabelPrior:
        """The label distribution of a training split file (rows that do not validate are skipped)."""
        from mydecide.records import read_records

        return cls.from_records(read_records(path)[0], str(path))

    def knows(self, record: Record) -> bool:
        return (record.task, record.question.type) in self.count

    def predict(self, record: Record) -> np.ndarray:
        """The prior over this record's options; set → P(label) per label (add-one smoothed)."""
        key = (record.task, record.question.type)
        mass, n = self.mass.get(key, {}), self.count.get(key, 0)
        counts = np.array([mass.get(o, 0.0) for o in record.question.options])
        if record.question.type == "set":
            return (counts + 1.0) / (n + 2.0)
        return (counts + 1.0) / (counts.sum() + len(counts))


def training_split_beside(paths: Sequence[str | Path]) -> Path | None:
    """The training split that belongs to these eval files: the train output a manifest.json beside one of them
    lists, else a train.jsonl beside it; None when there is none (or when the eval file is that split)."""
    import json

    for path in map(Path, paths):
        candidates = []
        manifest = path.parent / "manifest.json"
        if manifest.is_file():
            try:
                data = json.loads(manifest.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                data = {}
            outputs = data.get("outputs") if isinstance(data, dict) else None
            entry = outputs.get("train") if isinstance(outputs, dict) else None
            if isinstance(entry, dict):
                entry = entry.get("path") or entry.get("file")
            if isinstance(entry, str):
                candidates.append(path.parent / Path(entry).name)
        candidates.append(path.parent / "train.jsonl")
        for candidate in candidates:
            if candidate.is_file() and candidate.resolve() != path.resolve():
                return candidate
    return None


def majority_rows(records: Sequence[Record], prior: LabelPrior | None) -> tuple[list[Row], dict[str, Any]]:
    """Rows of the majority baseline and a description of where its label distribution came from.

    Tasks the training split does not have (held-out tasks), or every task when there is no training split,
    use the eval records' own label distribution: an "in-sample majority", said so in the report.
    """
    in_sample_tasks = sorted({r.task for r in records if prior is None or not prior.knows(r)})
    in_sample = LabelPrior.from_records([r for r in records if r.task in in_sample_tasks], "in-sample")
    rows: list[Row] = []
    for n, record in enumerate(records):
        source = prior if prior is not None and prior.knows(record) else in_sample
        flipped = False if record.question.type == "choice" else None
        rows += question_rows(n, record, source.predict(record), flipped=flipped)
    info = {"source": prior.source if prior is not None else "in-sample majority", "in_sample_tasks": in_sample_tasks}
    if prior is not None and in_sample_tasks:
        info["note"] = "tasks absent from the training split use the in-sample majority of the eval data"
    return rows, info


# -------------------------------------------------------------------------------------------------- coherence


def negated(question: Question) -> Question:
    """The noul question with its instruction negated and its yes / no criteria swapped."""
    yes, no = question.descriptions
    return Question("noul", NEGATION_TEMPLATE.format(instructions=question.instructions), question.options, (no, yes))


def anonymised(question: Question) -> Question:
    """The choice question with its option ids replaced by option_1 … option_K (descriptions kept)."""
    ids = tuple(f"option_{i + 1}" for i in range(question.k))
    return Question(question.type, question.instructions, ids, question.descriptions)


def coherence_checks(
    scorer: Scorer,
    records: Sequence[Record],
    logits: Sequence[np.ndarray],
    temperature: TemperatureFn,
    *,
    progress: bool = True,
) -> dict[str, Any]:
    """JevBench-style coherence laws, each as a violation rate over the questions it applies to."""

    def probs(record: Record, z: np.ndarray) -> np.ndarray:
        q = record.question
        return probabilities(q.type, z, temperature(q.type, q.k))

    out: dict[str, Any] = {}

    # 1. a noul and its negation sum to ~1
    nouls = [i for i, r in enumerate(records) if r.question.type == "noul"]
    neg, _ = score_records(
        scorer,
        [(records[i].state, negated(records[i].question)) for i in nouls],
        desc="coherence: negation",
        progress=progress,
    )
    gaps = [
        abs(probs(records[i], logits[i])[0] + probabilities("noul", z, temperature("noul", 2))[0] - 1.0)
        for i, z in zip(nouls, neg, strict=True)
    ]
    out["negation"] = {
        "n": len(gaps),
        "tolerance": NEGATION_TOLERANCE,
        "template": NEGATION_TEMPLATE,
        "violation_rate": float(np.mean([g > NEGATION_TOLERANCE for g in gaps])) if gaps else None,
        "mean_gap": float(np.mean(gaps)) if gaps else None,
    }

    # 2. anonymised option ids keep the answer (only where descriptions carry the meaning)
    choices = [i for i, r in enumerate(records) if r.question.type == "choice" and all(r.question.descriptions)]
    renamed, _ = score_records(
        scorer,
        [(records[i].state, anonymised(records[i].question)) for i in choices],
        desc="coherence: renaming",
        progress=progress,
    )
    changed = [int(np.argmax(z)) != int(np.argmax(logits[i])) for i, z in zip(choices, renamed, strict=True)]
    out["renaming"] = {
        "n": len(changed),
        "violation_rate": float(np.mean(changed)) if changed else None,
        "note": "choice questions whose options all have descriptions; ids → option_1 … option_K",
    }

    # 3. an answer does not depend on the other questions scored with it
    out["context"] = context_independence(scorer, records, temperature, progress=progress)
    return out


def context_independence(
    scorer: Scorer, records: Sequence[Record], temperature: TemperatureFn, *, companions: int = 2, progress: bool = True
) -> dict[str, Any]:
    """Each question scored alone vs in one request with the other questions of its state.

    A state with a single question borrows ``companions`` questions from other records (different states) so
    the law is tested everywhere. Violation: a probability moves by more than ``CONTEXT_TOLERANCE``.
    """
    from tqdm import tqdm

    by_state: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        by_state.setdefault(render_state(r.state), []).append(i)
    diffs: list[float] = []
    argmax_changed: list[bool] = []
    bar = tqdm(
        total=len(records), desc="coherence: context", unit="q", file=sys.stderr, disable=not progress, leave=False
    )
    order = list(by_state.values())
    for g, members in enumerate(order):
        state = records[members[0]].state
        questions = [records[i].question for i in members]
        if len(members) == 1:
            others = [records[j[0]].question for j in order[g + 1 :] + order[:g]][:companions]
            questions += others
        together = scorer([(state, q) for q in questions], None)
        for pos, i in enumerate(members):
            q = records[i].question
            alone = scorer([(state, q)], None)[0]
            t = temperature(q.type, q.k)
            p_alone, p_together = probabilities(q.type, alone, t), probabilities(q.type, together[pos], t)
            diffs.append(float(np.max(np.abs(p_alone - p_together))))
            if q.type != "set":
                argmax_changed.append(int(np.argmax(p_alone)) != int(np.argmax(p_together)))
            bar.update(1)
    bar.close()
    return {
        "n": len(diffs),
        "tolerance": CONTEXT_TOLERANCE,
        "violation_rate": float(np.mean([d > CONTEXT_TOLERANCE for d in diffs])) if diffs else None,
        "argmax_change_rate": float(np.mean(argmax_changed)) if argmax_changed else None,
        "max_abs_diff": max(diffs) if diffs else None,
    }


# ------------------------------------------------------------------------------------------------- evaluation


@dataclass
class Evaluation:
    """Everything one evaluation produced: the report, the per-question predictions, the plot's data."""

    report: dict[str, Any]
    predictions: list[dict[str, Any]]
    base_predictions: list[dict[str, Any]] | None = None
    rows: list[Row] = field(default_factory=list)  # calibrated rows of the model
    raw_rows: list[Row] | None = None  # the same at T = 1, when temperatures were given


def _keyed(question: Question, values: Sequence[float] | np.ndarray) -> dict[str, float]:
    """Probabilities keyed by option id (noul: yes/no, score: level index as a string, set: label)."""
    return {option: float(v) for option, v in zip(question.options, values, strict=True)}


def prediction_row(
    record: Record,
    logits: np.ndarray,
    probs: np.ndarray,
    temperature: float,
    *,
    latency: float | None,
    flipped: bool | None,
    state_tokens: int,
    file: str,
) -> dict[str, Any]:
    q = record.question
    return {
        "id": record.id,
        "task": record.task,
        "type": q.type,
        "lang": record.lang,
        "k": q.k,
        "file": file,
        "state_tokens": state_tokens,
        "probabilities": _keyed(q, probs),
        "gold": record.answer_json(),
        "target": _keyed(q, record.target),
        "soft": record.soft,
        "logits": [float(z) for z in logits],
        "temperature": temperature,
        "latency_ms": None if latency is None else latency * 1000.0,
        "flipped": flipped,
    }


def rows_from_predictions(predictions: Sequence[dict[str, Any]]) -> list[Row]:
    """Metric rows rebuilt from predictions.jsonl rows (the report is a function of this file)."""
    rows: list[Row] = []
    for n, p in enumerate(predictions):
        options = list(p["probabilities"])
        probs = np.array([p["probabilities"][o] for o in options])
        target = np.array([p["target"][o] for o in options])
        latency = None if p.get("latency_ms") is None else p["latency_ms"] / 1000.0
        common: dict[str, Any] = {
            "question": n,
            "qtype": p["type"],
            "task": p["task"],
            "lang": p["lang"],
            "k": p["k"],
            "state_tokens": p["state_tokens"],
            "soft": p["soft"],
            "latency": latency,
            "file": p.get("file", ""),
        }
        if p["type"] == "set":
            rows += [
                Row(probs=np.array([q, 1 - q]), target=np.array([y, 1 - y]), label=label, **common)
                for q, y, label in zip(probs, target, options, strict=True)
            ]
        else:
            rows.append(Row(probs=probs, target=target, flipped=p["flipped"], **common))
    return rows


def threshold_report(
    rows: Sequence[Row], costs: dict[str, float], thresholds: Sequence[float] = DEFAULT_THRESHOLDS
) -> dict[str, Any]:
    """The auto-act threshold from payoffs and the coverage / accuracy / payoff table around it."""
    auto = metrics.auto_act_threshold(costs["right"], costs["wrong"], costs["escalate"])
    points = sorted({round(t, 6) for t in (*thresholds, auto)})
    table = metrics.threshold_table(
        [r.probs for r in rows], [r.target for r in rows], points, costs["right"], costs["wrong"], costs["escalate"]
    )
    for entry in table:
        entry["auto_act"] = math.isclose(entry["threshold"] or 0.0, auto, abs_tol=1e-6)
    return {"costs": dict(costs), "auto_act_threshold": auto, "table": table}


def _check_scorable(records: Sequence[Record]) -> None:
    """Choices of 27–255 options are scored in groups + a final round (``many_options``); more are refused."""
    from mydecide.records import MAX_CHOICE_OPTIONS, MAX_SCORE_LEVELS

    limits = {"choice": MAX_CHOICE_OPTIONS, "score": MAX_SCORE_LEVELS}
    for r in records:
        most = limits.get(r.question.type)
        if most is not None and r.question.k > most:
            raise ValueError(
                f"record {r.id!r} ({r.task}): {r.question.k} options, but a {r.question.type} "
                f"question has at most {most}"
            )


def run_evaluation(
    model: LoadedModel | None,
    records: Sequence[Record],
    temperatures: TemperatureFn | str | Path | None = None,
    *,
    permutations: int = 4,
    seed: int = 13,
    costs: dict[str, float] | None = None,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    coherence: bool = False,
    base: bool = True,
    prior: LabelPrior | None = None,
    files: Sequence[str] | None = None,
    batch_size: int = 16,
    shared_prefix: bool = True,
    progress: bool = True,
    scorer: Scorer | None = None,
    base_scorer: Scorer | None = None,
) -> Evaluation:
    """Score ``records`` and build the full report (see the module docstring for the steps).

    ``temperatures``: a callable (qtype, K) → T, a temperatures.json path, or None (T = 1). ``prior``: the
    training split's label distribution for the majority baseline (None → in-sample majority). ``files``: the
    source file name of each record (for "by_file"). ``scorer`` / ``base_scorer`` replace the model's scoring
    (tests; a base scorer is otherwise the model under ``disable_adapter()`` when an adapter is loaded).
    """
    if not records:
        raise ValueError("nothing to evaluate: no records")
    if permutations < 0:
        raise ValueError(f"permutations must be >= 0, got {permutations}")
    if model is None and scorer is None:
        raise ValueError("run_evaluation needs a model or a scorer")
    costs = dict(DEFAULT_COSTS if costs is None else costs)
    metrics.auto_act_threshold(costs["right"], costs["wrong"], costs["escalate"])  # validate early
    temperature_path: str | None = None
    if isinstance(temperatures, (str, Path)):
        from mydecide.calibration import load_temperatures

        temperature_path = str(temperatures)
        temperatures = load_temperatures(temperatures)
    calibrated = temperatures is not None
    temperature: TemperatureFn = temperatures if temperatures is not None else (lambda qtype, k: 1.0)
    if model is not None:
        _check_scorable(records)
    scorer = scorer or model_scorer(model, batch_size=batch_size, shared_prefix=shared_prefix)  # type: ignore[arg-type]
    files = list(files) if files is not None else [""] * len(records)
    state_tokens = _state_tokens(model, records)
    items = [(r.state, r.question) for r in records]

    prompts_of = prompt_counter(model)

    def scored(score: Scorer, label: str) -> tuple[list[np.ndarray], list[float], list[bool | None]]:
        logits, latency = score_records(
            score, items, chunk_prompts=batch_size, desc=label, progress=progress, prompts_of=prompts_of
        )
        pairs = permuted_orders(records, permutations, seed)
        permuted, _ = score_records(
            score,
            [items[n] for n, _ in pairs],
            [o for _, o in pairs],
            chunk_prompts=batch_size,
            desc=f"{label}: option orders",
            progress=progress,
            prompts_of=prompts_of,
        )
        return logits, latency, flip_flags(records, logits, pairs, permuted)

    def rows_and_predictions(
        logits: list[np.ndarray], latency: list[float] | None, flips: list[bool | None], temp: TemperatureFn
    ) -> tuple[list[Row], list[dict[str, Any]]]:
        rows: list[Row] = []
        predictions = []
        for n, (record, z) in enumerate(zip(records, logits, strict=True)):
            q = record.question
            t = temp(q.type, q.k)
            p = probabilities(q.type, z, t)
            lat = latency[n] if latency is not None else None
            rows += question_rows(
                n, record, p, state_tokens=state_tokens[n], flipped=flips[n], latency=lat, file=files[n]
            )
            predictions.append(
                prediction_row(
                    record, z, p, t, latency=lat, flipped=flips[n], state_tokens=state_tokens[n], file=files[n]
                )
            )
        return rows, predictions

    started = time.perf_counter()
    logits, latency, flips = scored(scorer, "scoring")
    rows, predictions = rows_and_predictions(logits, latency, flips, temperature)
    report: dict[str, Any] = {
        "model": model.name if model is not None else "(scorer)",
        "adapter": _adapter_path(model),
        "temperatures": temperature_path or ("(given)" if calibrated else None),
        "records": len(records),
        "settings": {
            "permutations": permutations,
            "seed": seed,
            "batch_size": batch_size,
            "shared_prefix": shared_prefix,
            "coherence": coherence,
            "base": base,
            **(
                {"option_form": model.renderer.config.option_form, "score_form": model.renderer.config.score_form}
                if model is not None
                else {}
            ),
        },
        **metric_blocks(rows),
    }
    raw_rows = None
    if calibrated:
        raw_rows, _ = rows_and_predictions(logits, latency, flips, lambda qtype, k: 1.0)
        report["uncalibrated"] = metric_blocks(raw_rows, slices=False)
        report["temperatures_used"] = _temperatures_used(records, temperature)

    baselines: dict[str, Any] = {}
    majority, info = majority_rows(records, prior)
    baselines["majority"] = {**info, **metric_blocks(majority, slices=False)}
    base_predictions = None
    if base and (base_scorer is not None or has_adapter(model)):
        if base_scorer is not None:
            b_logits, b_latency, b_flips = scored(base_scorer, "base model")
        else:
            assert model is not None
            with adapter_disabled(model):
                b_logits, b_latency, b_flips = scored(scorer, "base model")
        b_rows, base_predictions = rows_and_predictions(b_logits, b_latency, b_flips, lambda qtype, k: 1.0)
        baselines["base_model"] = {
            "note": "the same weights without the adapter, T = 1",
            **metric_blocks(b_rows, slices=False),
        }
    report["baselines"] = baselines
    report["thresholds"] = threshold_report(rows, costs, thresholds)
    if coherence:
        report["coherence"] = coherence_checks(scorer, records, logits, temperature, progress=progress)
    report["wall_s"] = time.perf_counter() - started
    return Evaluation(report, predictions, base_predictions, rows, raw_rows)


def evaluate(
    model: LoadedModel | None,
    records: Sequence[Record],
    temperatures: TemperatureFn | str | Path | None = None,
    **options: Any,
) -> dict[str, Any]:
    """The report dict of :func:`run_evaluation` (for in-process callers: the demo, the ablation sweep)."""
    return run_evaluation(model, records, temperatures, **options).report


def _adapter_path(model: LoadedModel | None) -> str | None:
    """ "(loaded)" when the model carries an adapter (``evaluate_files`` writes the adapter's path instead)."""
    return "(loaded)" if has_adapter(model) else None


def _state_tokens(model: LoadedModel | None, records: Sequence[Record]) -> list[int]:
    """Tokens of each record's state (after the renderer's cut); characters / 4 without a model."""
    if model is None:
        return [len(render_state(r.state)) // 4 for r in records]
    renderer = model.renderer
    head = len(model.tokenizer(renderer.head, add_special_tokens=False)["input_ids"])
    return [len(renderer.encode_state(r.state)[0]) - head for r in records]


def _temperatures_used(records: Sequence[Record], temperature: TemperatureFn) -> dict[str, dict[str, float]]:
    used: dict[str, dict[str, float]] = {}
    for r in records:
        used.setdefault(r.question.type, {})[str(r.question.k)] = temperature(r.question.type, r.question.k)
    return {t: dict(sorted(v.items(), key=lambda kv: int(kv[0]))) for t, v in sorted(used.items())}


# --------------------------------------------------------------------------------------------------- outputs


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}" if math.isfinite(value) else str(value)
    return str(value).replace("|", "\\|")  # a bare | would end the table cell


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return [*lines, ""]


FULL_COLUMNS = (
    ("n", "n"),
    ("questions", "questions"),
    ("accuracy", "accuracy"),
    ("chance_corrected", "chance-corr."),
    ("log_loss", "log loss"),
    ("brier", "Brier"),
    ("ece", "ECE"),
    ("rps", "RPS"),
    ("aurc", "AURC"),
    ("flip_rate", "flip rate"),
    ("latency_p50_ms", "p50 ms"),
    ("latency_p95_ms", "p95 ms"),
)
SHORT_COLUMNS = (
    ("n", "n"),
    ("accuracy", "accuracy"),
    ("chance_corrected", "chance-corr."),
    ("log_loss", "log loss"),
    ("ece", "ECE"),
    ("flip_rate", "flip rate"),
)


def _rows_for(blocks: dict[str, dict[str, Any]], columns: Sequence[tuple[str, str]]) -> list[list[Any]]:
    return [[name, *(b.get(key) for key, _ in columns)] for name, b in blocks.items() if b.get("n")]


def render_markdown(report: dict[str, Any]) -> str:
    """report.md: readable tables of report.json (overall, baselines, per task, slices, thresholds, coherence)."""
    model = report["model"] + (f" + {report['adapter']}" if report.get("adapter") else "")
    lines = [f"# Evaluation: {model}", ""]
    data = report.get("data") or []
    lines += [
        f"- data: {', '.join(data) if data else '(in process)'} — {report['records']} questions",
        f"- temperatures: {report.get('temperatures') or 'none (T = 1)'}",
        f"- option orders per question: reversed + {report['settings']['permutations']} random "
        f"(seed {report['settings']['seed']})",
        "",
    ]

    lines += ["## Overall", ""]
    overall = {name: report[name] for name in ("all", *QUESTION_TYPES)}
    lines += _table(["", *(label for _, label in FULL_COLUMNS)], _rows_for(overall, FULL_COLUMNS))
    extra = [
        (t, report[t])
        for t in QUESTION_TYPES
        if report[t].get("n") and (report[t].get("n_soft") or report[t].get("exact_set_accuracy") is not None)
    ]
    if extra:
        lines += _table(
            ["", "soft accuracy", "total variation", "exact-set accuracy", "micro F1", "macro F1", "label log loss"],
            [
                [
                    t,
                    b.get("soft_accuracy"),
                    b.get("total_variation"),
                    b.get("exact_set_accuracy"),
                    b.get("micro_f1"),
                    b.get("macro_f1"),
                    b.get("label_log_loss"),
                ]
                for t, b in extra
            ],
        )

    lines += ["## Baselines", ""]
    side: dict[str, dict[str, Any]] = {"model" + (" (calibrated)" if report.get("uncalibrated") else ""): report["all"]}
    if report.get("uncalibrated"):
        side["model, T = 1"] = report["uncalibrated"]["all"]
    baselines = report.get("baselines", {})
    if "base_model" in baselines:
        side["base model (no adapter)"] = baselines["base_model"]["all"]
    if "majority" in baselines:
        side[f"majority ({baselines['majority']['source']})"] = baselines["majority"]["all"]
    lines += _table(["", *(label for _, label in SHORT_COLUMNS)], _rows_for(side, SHORT_COLUMNS))
    if baselines.get("majority", {}).get("in_sample_tasks") and baselines["majority"]["source"] != "in-sample majority":
        lines += [
            f"In-sample majority for tasks absent from the training split: "
            f"{', '.join(baselines['majority']['in_sample_tasks'])}.",
            "",
        ]

    lines += ["## Per task", ""]
    header = ["task", "type", *(label for _, label in SHORT_COLUMNS), "RPS", "majority acc."]
    has_base = "base_model" in baselines
    if has_base:
        header.append("base acc.")
    task_rows = []
    for task, b in report["by_task"].items():
        row = [
            task,
            "/".join(b.get("types") or ["—"]),
            *(b.get(key) for key, _ in SHORT_COLUMNS),
            b.get("rps"),
            baselines.get("majority", {}).get("by_task", {}).get(task, {}).get("accuracy"),
        ]
        if has_base:
            row.append(baselines["base_model"]["by_task"].get(task, {}).get("accuracy"))
        task_rows.append(row)
    lines += _table(header, task_rows)

    lines += ["## Slices", ""]
    for name, groups in report.get("slices", {}).items():
        lines += [f"### {name.replace('_', ' ')}", ""]
        lines += _table([name, *(label for _, label in SHORT_COLUMNS)], _rows_for(groups, SHORT_COLUMNS))

    th = report["thresholds"]
    costs = th["costs"]
    lines += [
        "## Thresholds",
        "",
        f"Payoffs right = {costs['right']:g}, wrong = {costs['wrong']:g}, escalate = {costs['escalate']:g}: "
        f"auto-act when p > {th['auto_act_threshold']:.3f}, escalate otherwise.",
        "",
    ]
    lines += _table(
        ["threshold", "coverage", "accuracy", "payoff / question", "auto-act"],
        [
            [e["threshold"], e["coverage"], e["accuracy"], e["payoff"], "◀" if e["auto_act"] else ""]
            for e in th["table"]
        ],
    )

    if report.get("coherence"):
        c = report["coherence"]
        lines += ["## Coherence", ""]
        lines += _table(
            ["law", "n", "violation rate", "detail"],
            [
                [
                    "noul + negation ≈ 1",
                    c["negation"]["n"],
                    c["negation"]["violation_rate"],
                    f"mean |p + p_neg − 1| = {_fmt(c['negation']['mean_gap'])}",
                ],
                ["anonymised option ids keep the answer", c["renaming"]["n"], c["renaming"]["violation_rate"], ""],
                [
                    "answer independent of other questions",
                    c["context"]["n"],
                    c["context"]["violation_rate"],
                    f"max |Δp| = {_fmt(c['context']['max_abs_diff'], 5)}, argmax changed "
                    f"{_fmt(c['context']['argmax_change_rate'])}",
                ],
            ],
        )

    if report.get("temperatures_used"):
        lines += ["## Temperatures", ""]
        lines += _table(
            ["type", "K", "T"], [[t, k, v] for t, ks in report["temperatures_used"].items() for k, v in ks.items()]
        )
    lines += ["## Reliability", "", "![reliability diagram](reliability.png)", ""]
    return "\n".join(lines)


def plot_reliability(
    rows: Sequence[Row], path: str | Path, raw_rows: Sequence[Row] | None = None, bins: int = 10
) -> None:
    """reliability.png: accuracy vs confidence per bin (before and after temperatures when both are known)
    beside the histogram of top probabilities. Written atomically."""
    import os
    import tempfile

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [("after temperatures" if raw_rows is not None else "model", rows)]
    if raw_rows is not None:
        curves.insert(0, ("before (T = 1)", raw_rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    left.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=1, label="perfect calibration")
    width = 1.0 / bins
    for n, (label, group) in enumerate(curves):
        rb = metrics.reliability_bins([r.probs for r in group], [r.target for r in group], bins)
        filled = rb.counts > 0
        ece = metrics.ece([r.probs for r in group], [r.target for r in group], bins)
        left.plot(rb.confidence[filled], rb.accuracy[filled], marker="o", label=f"{label} (ECE {ece:.3f})")
        offset = (n - (len(curves) - 1) / 2) * width / len(curves)
        right.bar(rb.edges[:-1] + width / 2 + offset, rb.counts, width=width / len(curves), label=label, alpha=0.8)
    left.set(
        xlim=(0, 1), ylim=(0, 1), xlabel="confidence (top probability)", ylabel="accuracy", title="Reliability diagram"
    )
    left.legend(loc="upper left", fontsize=8)
    right.set(
        xlim=(0, 1), xlabel="confidence (top probability)", ylabel="questions (rows)", title="Confidence histogram"
    )
    right.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        Path(tmp).unlink(missing_ok=True)


def write_outputs(evaluation: Evaluation, out_dir: str | Path) -> dict[str, Path]:
    """predictions.jsonl (and base_predictions.jsonl), report.json, report.md, reliability.png in ``out_dir``."""
    from mydecide.io import atomic_write_json, atomic_write_text
    from mydecide.records import write_jsonl

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "predictions": out / "predictions.jsonl",
        "report": out / "report.json",
        "markdown": out / "report.md",
        "plot": out / "reliability.png",
    }
    write_jsonl(paths["predictions"], evaluation.predictions)
    if evaluation.base_predictions is not None:
        paths["base_predictions"] = out / "base_predictions.jsonl"
        write_jsonl(paths["base_predictions"], evaluation.base_predictions)
    atomic_write_json(paths["report"], evaluation.report)
    atomic_write_text(paths["markdown"], render_markdown(evaluation.report))
    plot_reliability(evaluation.rows, paths["plot"], evaluation.raw_rows)
    return paths


def evaluate_files(recipe: EvalRecipe, *, progress: bool = True) -> Evaluation:
    """``mydecide evaluate``: read the files (strictly: the first bad line is an error naming file and line),
    load the model, evaluate, and write every output into ``recipe.out``."""
    from mydecide.calibration import protected_split
    from mydecide.config import dump_recipe
    from mydecide.io import atomic_write_text, provenance
    from mydecide.modeling import load_model
    from mydecide.records import load_records

    if not recipe.data:
        raise ValueError("give the records to evaluate: --data FILE.jsonl [MORE.jsonl ...]")
    records: list[Record] = []
    files: list[str] = []
    warnings: list[str] = []
    for path in map(Path, recipe.data):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such data file")
        loaded = load_records(path)
        if recipe.limit is not None:
            loaded = loaded[: recipe.limit]
        records += loaded
        files += [path.name] * len(loaded)
        reason = protected_split(path)
        if reason and "training" in reason:
            warnings.append(f"{reason}: these numbers are in-sample")
    for warning in warnings:
        print(f"[mydecide] warning: {warning}", file=sys.stderr)
    if recipe.temperatures is not None and not Path(recipe.temperatures).is_file():
        raise FileNotFoundError(f"{recipe.temperatures}: no such temperatures file")
    train = training_split_beside(recipe.data)
    prior = LabelPrior.from_file(train) if train is not None else None
    model = load_model(recipe.model, recipe.adapter, option_form=recipe.option_form)
    evaluation = run_evaluation(
        model,
        records,
        recipe.temperatures,
        permutations=recipe.permutations,
        seed=recipe.seed,
        costs=recipe.costs.model_dump(),
        thresholds=recipe.thresholds,
        coherence=recipe.coherence,
        base=recipe.base,
        prior=prior,
        files=files,
        batch_size=recipe.batch_size,
        shared_prefix=recipe.shared_prefix,
        progress=progress,
    )
    report = evaluation.report
    report["adapter"] = recipe.adapter
    report["data"] = [str(p) for p in recipe.data]
    report["warnings"] = warnings
    report["recipe"] = recipe.model_dump(mode="json")
    report["provenance"] = provenance()
    write_outputs(evaluation, recipe.out)
    atomic_write_text(Path(recipe.out) / "recipe.yaml", dump_recipe(recipe, report["provenance"]))
    return evaluation
