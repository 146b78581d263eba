"""Temperature scaling: fit one temperature per question type (and option-count bucket), temperatures.json.

The pure part, at the top: ``fit_temperature`` finds the one temperature T that minimises the mean log
loss of softmax(z / T) over a set of rows, and ``apply_temperature`` turns logits into calibrated
probabilities. Dividing all logits of a row by the same T > 0 never changes which option is largest, so
calibration changes confidence, never the answer.

Rows are 1-D numpy arrays of option logits, each row its own number of options K; targets are the
matching target distributions (one-hot for hard labels).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mydecide.calibration.conformal_table import ConformalTable, conformal_section
from mydecide.calibration.level_maps import LevelMap, fit_level_maps, level_map_from_json
from mydecide.calibration.spans import decisions_from_json
from mydecide.config import CalibrateRecipe
from mydecide.errors import UserError
from mydecide.metrics import ece, ece_band, log_loss
from mydecide.records import QUESTION_TYPES
from mydecide.scoring.probabilities import answer_rows, softmax
from mydecide.spans import SpanDecisions

LOG_T_BOUNDS = (-4.0, 4.0)
"""Search interval of log T: T from e^-4 ≈ 0.018 to e^4 ≈ 54.6."""
TEMPERATURE_RANGE = (math.exp(LOG_T_BOUNDS[0]) * (1 - 1e-9), math.exp(LOG_T_BOUNDS[1]) * (1 + 1e-9))
"""The temperatures a temperatures.json may hold: the interval ``fit_temperature`` searches (≈ 0.018 to 54.6), so
every file ``calibrate`` writes loads, and a value no fit can give (``5e-324``, which turns every logit into
±inf and every answer into NaN) is refused when the file is read, not on every request."""


def _padded(logits: Sequence[np.ndarray], targets: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Stack variable-K rows into (N, K_max) arrays: logits padded with -inf, targets with 0."""
    if len(logits) != len(targets):
        raise ValueError(f"{len(logits)} logit rows but {len(targets)} target rows")
    if len(logits) == 0:
        raise ValueError("cannot fit a temperature on zero rows")
    k_max = max(len(z) for z in logits)
    z_pad = np.full((len(logits), k_max), -np.inf)
    y_pad = np.zeros((len(logits), k_max))
    for i, (z, y) in enumerate(zip(logits, targets, strict=True)):
        z, y = np.asarray(z, dtype=float), np.asarray(y, dtype=float)
        if z.ndim != 1 or z.shape != y.shape or z.size == 0:
            raise ValueError(f"row {i}: logits shape {z.shape} and target shape {y.shape} must be equal, 1-D")
        if not np.all(np.isfinite(z)):
            raise ValueError(f"row {i}: logits must be finite")
        z_pad[i, : len(z)] = z
        y_pad[i, : len(y)] = y
    return z_pad, y_pad


def _mean_log_loss(z_pad: np.ndarray, y_pad: np.ndarray, temperature: float) -> float:
    """Mean −Σ y log softmax(z / T) over padded rows (padding: z = -inf, y = 0)."""
    from scipy.special import log_softmax

    log_q = log_softmax(z_pad / temperature, axis=1)  # (N, K_max), -inf at padding
    terms = np.where(y_pad > 0, y_pad * np.where(np.isfinite(log_q), log_q, 0.0), 0.0)
    return float(-terms.sum(axis=1).mean())


def platt_targets(z_pad: np.ndarray, y_pad: np.ndarray) -> np.ndarray:
    """Platt's out-of-sample targets on n rows, for any K: the right answer's mass y becomes
    y·(n + 1)/(n + 2) + (1 − y)/((n + 2)(K − 1)), i.e. ε = 1/(n + 2) of each target moves to the other options.

    Fitting the raw targets of a dev set that the model separates (every answer right and confident) drives T to its
    lower bound: on such rows the log loss keeps falling as T → 0. That T then makes one later mistake cost ~ |z| / T
    (a held-out log loss of 18 in the demo). Platt (1999) fits binary calibration against (N+ + 1) / (N+ + 2) for
    this reason: one pseudo-count for "right" and one for "wrong". Here that pair is kept for any K, so the smoothing
    is 1/(n + 2) whatever the number of options (an earlier pseudo-count per option moved K / (n + K) of every
    target, 16% at n = 36 and K = 7, and calibrated such a dev set towards a much less confident model than its
    data showed). docs/calibration.md says why this fit; docs/LOG.md#calibration-seven-temperature-fits-compared
    compares it with the raw fit, a prior on log T and that earlier one.
    """
    n = len(y_pad)
    valid = np.isfinite(z_pad)
    k = valid.sum(axis=1, keepdims=True)  # (N, 1) options per row
    eps = 1.0 / (n + 2.0)
    return np.where(valid, y_pad * (1.0 - eps) + (1.0 - y_pad) * eps / np.maximum(k - 1, 1), 0.0)


def fit_temperature(logits: Sequence[np.ndarray], targets: Sequence[np.ndarray], *, smooth: bool = True) -> float:
    """The temperature T minimising the mean log loss of softmax(z / T) on these rows, against the targets of
    :func:`platt_targets` (so a dev set the model separates gives a finite T, not the lower bound).

    A bounded scalar minimisation over log T in ``LOG_T_BOUNDS`` (the log loss is smooth and unimodal in
    log T, and searching in log space treats T and 1/T symmetrically). ``smooth=False`` fits the raw targets
    (perfectly separable rows then push T to the lower bound). Raises ValueError on empty or malformed input.
    """
    return _fit_padded(*_padded(logits, targets), smooth=smooth)


def _fit_padded(z_pad: np.ndarray, y_pad: np.ndarray, *, smooth: bool = True) -> float:
    """:func:`fit_temperature` on rows already padded by ``_padded``."""
    from scipy.optimize import minimize_scalar

    fit_to = platt_targets(z_pad, y_pad) if smooth else y_pad
    result = minimize_scalar(
        lambda log_t: _mean_log_loss(z_pad, fit_to, math.exp(log_t)),
        bounds=LOG_T_BOUNDS,
        method="bounded",
        options={"xatol": 1e-6},
    )
    return float(math.exp(result.x))


def checked_temperature(
    logits: Sequence[np.ndarray], targets: Sequence[np.ndarray], *, keep_fit: bool = False
) -> tuple[float, float, str | None]:
    """(temperature to use, fitted temperature, why T = 1 was kept or None).

    The fit minimises a smoothed loss, so on the real targets it can end above T = 1's dev log loss: then it is not
    used (T = 1 is kept, and the reason says both log losses) unless ``keep_fit``. The dev log loss of the
    temperature returned is therefore never above T = 1's."""
    z_pad, y_pad = _padded(logits, targets)
    fitted = _fit_padded(z_pad, y_pad)
    at_one, at_fit = _mean_log_loss(z_pad, y_pad, 1.0), _mean_log_loss(z_pad, y_pad, fitted)
    if at_fit < at_one or math.isclose(fitted, 1.0, rel_tol=1e-9):
        return fitted, fitted, None
    reason = f"the fitted T = {fitted:.3f} does not lower the dev log loss ({at_fit:.4f} against {at_one:.4f} at T = 1)"
    if keep_fit:
        return fitted, fitted, reason + "; kept all the same (--keep-fit)"
    return 1.0, fitted, reason + ": T = 1 kept"


def apply_temperature(logits: Sequence[np.ndarray] | np.ndarray, temperature: float) -> list[np.ndarray] | np.ndarray:
    """softmax(z / T) per row.

    A list of 1-D rows (any K each) gives a list of probability rows; a numpy array gives an array of the
    same shape, with the softmax over its last axis.
    """
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    if isinstance(logits, np.ndarray):
        return softmax(logits, temperature)
    return [softmax(z, temperature) for z in logits]


# ------------------------------------------------------------------------------------------------------------
# Per-type temperatures, temperatures.json, and the guard against fitting on a training split.
# Everything below works on (question type, option count K, option logits z, target y) rows: the logits come
# from ``scoring.engine.score_questions`` (set questions: one yes−no logit per label, read with a sigmoid), and a
# question's rows are ``scoring.probabilities.answer_rows(..., logits=True)``.

BUCKET_STARTS = (2, 3, 5, 9, 17, 27)
"""Option-count buckets: K = 2, 3–4, 5–8, 9–16, 17–26, 27+ (26 is the last K shown in one prompt)."""

TEMPERATURES_FORMAT = "mydecide.temperatures/1"
DEFAULT_MIN_ROWS: int = CalibrateRecipe.model_fields["min_rows"].default
"""A type (or a type × bucket) needs this many dev questions for its own temperature (the recipe's default)."""


def option_bucket(k: int) -> str:
    """The option-count bucket of a question with K options, e.g. 4 → "3-4", 30 → "27+"."""
    if k < BUCKET_STARTS[0]:
        return str(k)
    for start, stop in zip(BUCKET_STARTS, (*BUCKET_STARTS[1:], None), strict=True):
        if stop is None:
            return f"{start}+"
        if k < stop:
            return str(start) if stop - start == 1 else f"{start}-{stop - 1}"
    raise AssertionError("unreachable")


def _calibrated(logits: Sequence[np.ndarray], temperature: float | Sequence[float]) -> list[np.ndarray]:
    """softmax(z / T) of each row (T: one for all rows, or one per row); rows of equal K and T go through one
    (N, K) softmax, so 10⁵ rows take milliseconds."""
    temps = [float(temperature)] * len(logits) if isinstance(temperature, (int, float)) else list(temperature)
    out: list[np.ndarray] = [np.empty(0)] * len(logits)
    groups: dict[tuple[int, float], list[int]] = {}
    for i, z in enumerate(logits):
        groups.setdefault((len(z), temps[i]), []).append(i)
    for (_, t), index in groups.items():
        stacked = np.asarray(apply_temperature(np.array([logits[i] for i in index], dtype=float), t))
        for i, row in zip(index, stacked, strict=True):
            out[i] = row
    return out


WEAK_FIT_QUESTIONS = 100
"""Below this many dev questions a type's (or bucket's) temperature is weakly determined: calibrate says so."""


def _fit_summary(
    rows: list[tuple[np.ndarray, np.ndarray]], temperature: float, n_questions: int, fitted: float | None = None
) -> dict:
    """Counts and dev log loss / ECE (with the ECE band of a calibrated model for that many rows, see
    ``metrics.ece_band``) at T = 1 and at ``temperature`` for these rows; ``fitted``: what the fit gave, when it
    differs from the temperature used."""
    logits = [z for z, _ in rows]
    targets = [y for _, y in rows]
    before = _calibrated(logits, 1.0)
    after = _calibrated(logits, temperature)
    log_t = math.log(fitted if fitted is not None else temperature)
    return {
        "temperature": temperature,
        "fitted_temperature": fitted if fitted is not None else temperature,
        # T at the edge of the search: the logits carry (almost) no signal (T → ∞) or the data is separable
        "at_bound": any(math.isclose(log_t, edge, abs_tol=1e-3) for edge in LOG_T_BOUNDS),
        "n": n_questions,
        "rows": len(rows),
        "weak": n_questions < WEAK_FIT_QUESTIONS,
        "log_loss_before": log_loss(before, targets),
        "log_loss_after": log_loss(after, targets),
        "ece_before": ece(before, targets),
        "ece_after": ece(after, targets),
        "ece_band_before": ece_band(before),
        "ece_band_after": ece_band(after),
    }


def _fitted_summary(rows: list[tuple[np.ndarray, np.ndarray]], n_questions: int, keep_fit: bool) -> dict:
    """Fit and check one group's temperature (:func:`checked_temperature`) and summarise it."""
    used, fitted, kept_one = checked_temperature([z for z, _ in rows], [y for _, y in rows], keep_fit=keep_fit)
    summary = _fit_summary(rows, used, n_questions, fitted)
    if kept_one:
        summary["kept_t1" if used == 1.0 else "kept_fit"] = kept_one
    return summary


def fit_temperatures(
    items: Sequence[tuple[str, int, np.ndarray, Sequence[float]]],
    *,
    by_bucket: bool = False,
    min_rows: int = DEFAULT_MIN_ROWS,
    keep_fit: bool = False,
    level_maps: bool = False,
) -> dict:
    """Fit one temperature per question type, and optionally per (type, option-count bucket); with ``level_maps``,
    then a level map per K of the score questions (:func:`~mydecide.calibration.level_maps.fit_level_maps`, in the
    ``level_maps`` block when there are score questions; the overall "after" counts the maps).

    ``items`` are (type, K, logits, target) per dev question. A type with fewer than ``min_rows`` questions
    keeps T = 1 (a handful of rows would fit an extreme T); a bucket with fewer falls back to its type's T. A fit that
    does not lower its rows' dev log loss is not used (:func:`checked_temperature`): the type keeps T = 1, the bucket
    its type's T, unless ``keep_fit``. Returns the ``types`` / ``buckets`` / ``overall`` part of temperatures.json.
    """
    if min_rows < 1:
        raise ValueError(f"min_rows must be >= 1, got {min_rows}")
    if not items:
        raise ValueError("cannot fit temperatures on zero questions")
    by_type: dict[str, list[tuple[str, int, np.ndarray, Sequence[float]]]] = {}
    for item in items:
        by_type.setdefault(item[0], []).append(item)

    def rows_of(group: list) -> list[tuple[np.ndarray, np.ndarray]]:
        return [row for qtype, _, z, y in group for row in answer_rows(qtype, z, y, logits=True)]

    types: dict[str, dict] = {}
    buckets: dict[str, dict[str, dict]] = {}
    for qtype in sorted(by_type):
        group = by_type[qtype]
        rows = rows_of(group)
        if len(group) >= min_rows:
            types[qtype] = _fitted_summary(rows, len(group), keep_fit)
        else:
            types[qtype] = _fit_summary(rows, 1.0, len(group))
            types[qtype]["fallback"] = f"fewer than {min_rows} questions: T = 1"
        t_type = types[qtype]["temperature"]
        if not by_bucket:
            continue
        per_bucket: dict[str, list] = {}
        for item in group:
            per_bucket.setdefault(option_bucket(item[1]), []).append(item)
        buckets[qtype] = {}
        for name in sorted(per_bucket, key=lambda b: int(b.rstrip("+").split("-")[0])):
            sub = per_bucket[name]
            sub_rows = rows_of(sub)
            if len(sub) < min_rows:
                buckets[qtype][name] = _fit_summary(sub_rows, t_type, len(sub))
                buckets[qtype][name]["fallback"] = f"fewer than {min_rows} questions: the {qtype} temperature"
                continue
            fit = _fitted_summary(sub_rows, len(sub), keep_fit)
            if "kept_t1" in fit:  # its own fit did not help: the type's T where that lowers this bucket's log loss
                inherited = _fit_summary(sub_rows, t_type, len(sub), fit["fitted_temperature"])
                if inherited["log_loss_after"] < inherited["log_loss_before"]:
                    fit = inherited | {"fallback": fit["kept_t1"].replace("T = 1 kept", f"the {qtype} temperature")}
            buckets[qtype][name] = fit

    # overall before / after with the temperature each question actually gets; span questions (hundreds of word ×
    # label rows each) only when there is nothing else, as in evaluate's "all" block: they have their own row
    table = TemperatureTable(
        {t: s["temperature"] for t, s in types.items()},
        {t: {b: s["temperature"] for b, s in bs.items() if "fallback" not in s} for t, bs in buckets.items()},
    )
    maps: dict[str, dict] = {}
    if level_maps and any(qtype == "score" for qtype, *_ in items):
        table.level_maps, maps = fit_level_maps(items, table)
    pooled = [item for item in items if item[0] != "span"] or list(items)
    all_rows = rows_of(pooled)
    targets = [y for _, y in all_rows]
    before = _calibrated([z for z, _ in all_rows], 1.0)
    row_temperatures = [table(qtype, k) for qtype, k, zs, ys in pooled for _ in answer_rows(qtype, zs, ys, logits=True)]
    after = _calibrated([z for z, _ in all_rows], row_temperatures)
    row = 0
    for qtype, k, zs, ys in pooled:  # a score question is one row; where its K has a map, the map's answer
        if qtype == "score" and k in table.level_maps:
            after[row] = table.level_maps[k].probabilities(zs, table(qtype, k))
        row += len(answer_rows(qtype, zs, ys, logits=True))
    overall = {
        "n": len(pooled),
        "rows": len(all_rows),
        "log_loss_before": log_loss(before, targets),
        "log_loss_after": log_loss(after, targets),
        "ece_before": ece(before, targets),
        "ece_after": ece(after, targets),
        "ece_band_before": ece_band(before),
        "ece_band_after": ece_band(after),
    }
    return {
        "by_bucket": by_bucket,
        "min_rows": min_rows,
        "keep_fit": keep_fit,
        "types": types,
        "buckets": buckets,
        **({"level_maps": maps} if maps else {}),
        "overall": overall,
    }


class TemperatureTable:
    """The temperature of a (question type, option count K): its bucket's if fitted, else its type's, else 1.

    Callable as ``table(qtype, k)``: the contract serve / predict / evaluate use. ``span_decisions``: the per-label
    thresholds and span probability map fitted with it (``calibration/spans.py``), None when the file has none.
    ``level_maps``: score questions' level maps by K (``calibration/level_maps.py``), applied after the temperature
    by ``scoring.probabilities.calibrated_probabilities``.
    """

    def __init__(
        self,
        types: dict[str, float],
        buckets: dict[str, dict[str, float]] | None = None,
        span_decisions: SpanDecisions | None = None,
        level_maps: dict[int, LevelMap] | None = None,
        conformal: ConformalTable | None = None,
    ):
        self.types = dict(types)
        self.buckets = {t: dict(b) for t, b in (buckets or {}).items()}
        self.span_decisions = span_decisions
        self.level_maps = dict(level_maps or {})
        self.conformal = conformal  # sets and auto-act rules (calibration/conformal_table.py)

    def __call__(self, qtype: str, k: int) -> float:
        bucket = self.buckets.get(qtype, {}).get(option_bucket(k))
        if bucket is not None:
            return bucket
        return self.types.get(qtype, 1.0)

    def __repr__(self) -> str:
        maps = f", level_maps=K {sorted(self.level_maps)}" if self.level_maps else ""
        return f"TemperatureTable(types={self.types}, buckets={self.buckets}{maps})"


def load_temperatures(path: str | Path) -> TemperatureTable:
    """Read temperatures.json (written by ``mydecide calibrate``). A type it does not list gets T = 1.

    Errors name the file and the key.
    """
    import json

    path = Path(path)
    if path.is_dir():
        inside = " (it holds temperatures.json: give that file)" if (path / "temperatures.json").is_file() else ""
        raise IsADirectoryError(
            f"{path} is a directory; --temperatures takes the temperatures.json file that "
            f"`mydecide calibrate` wrote{inside}"
        )
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such temperatures file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not a UTF-8 text file ({err.reason} at byte {err.start})") from None
    if not isinstance(data, dict) or not isinstance(data.get("types"), dict):
        raise UserError(f"{path}: a temperatures file needs a 'types' object (see mydecide calibrate)")

    low, high = TEMPERATURE_RANGE
    bucket_names = list(dict.fromkeys(option_bucket(k) for k in range(BUCKET_STARTS[0], 256)))

    def value(entry: object, key: str) -> float:
        t = entry.get("temperature") if isinstance(entry, dict) else entry
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t > 0):
            raise UserError(f"{path}: {key}: temperature must be a finite number > 0, got {t!r}")
        if not low <= t <= high:
            raise UserError(
                f"{path}: {key}: temperature {t!r} is outside the range {low:.4g} to {high:.4g} that "
                "mydecide calibrate fits in"
            )
        return float(t)

    def known_type(qtype: str, key: str) -> str:
        if qtype not in QUESTION_TYPES:
            raise UserError(
                f"{path}: {key}: unknown question type {qtype!r} (the types are {', '.join(QUESTION_TYPES)})"
            )
        return qtype

    types = {
        known_type(qtype, f"types.{qtype}"): value(entry, f"types.{qtype}") for qtype, entry in data["types"].items()
    }
    buckets: dict[str, dict[str, float]] = {}
    raw_buckets = data.get("buckets") or {}
    if not isinstance(raw_buckets, dict):
        raise UserError(f"{path}: buckets must be an object type → bucket → entry")
    for qtype, entries in raw_buckets.items():
        known_type(qtype, f"buckets.{qtype}")
        if not isinstance(entries, dict):
            raise UserError(f"{path}: buckets.{qtype} must be an object bucket → entry")
        for name in entries:
            if name not in bucket_names:
                raise UserError(
                    f"{path}: buckets.{qtype}.{name}: unknown option-count bucket {name!r} (the "
                    f"buckets are {', '.join(bucket_names)})"
                )
        buckets[qtype] = {
            name: value(entry, f"buckets.{qtype}.{name}")
            for name, entry in entries.items()
            if not (isinstance(entry, dict) and "fallback" in entry)
        }
    spans = data.get("spans")
    if spans is not None and not isinstance(spans, dict):
        raise UserError(f"{path}: spans must be an object (its decisions: thresholds and the span probability map)")
    try:
        decisions = None if spans is None else decisions_from_json(spans.get("decisions"), "spans.decisions")
    except ValueError as err:
        raise UserError(f"{path}: {err}") from None
    raw_maps = data.get("level_maps") or {}
    if not isinstance(raw_maps, dict):
        raise UserError(f"{path}: level_maps must be an object K → the map of score questions with K levels")
    level_maps: dict[int, LevelMap] = {}
    for name, entry in raw_maps.items():
        if isinstance(entry, dict) and "fallback" in entry:
            continue  # not fitted: its K keeps the temperature
        try:
            fitted = level_map_from_json(entry, f"level_maps.{name}")
        except ValueError as err:
            raise UserError(f"{path}: {err}") from None
        if str(fitted.k) != name:
            raise UserError(f"{path}: level_maps.{name}: a map of {fitted.k} levels is filed under K = {name}")
        level_maps[fitted.k] = fitted
    return TemperatureTable(types, buckets, decisions, level_maps, conformal_section(data, path))
