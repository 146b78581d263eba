"""Temperature fits compared on synthetic dev sets of 20 to 500 questions and 2 to 77 options, judged on held-out rows.

Each dev set is drawn from a known model: row logits z* = s·g (g standard normal per option, s uniform in 0.3-3, so
rows range from near-uniform to confident), the answer drawn from softmax(z*), and the scored logits z = T·z*, so the
temperature that calibrates z is the planted T (0.5: an underconfident model, 1, 2: an overconfident one). Every fit
sees the dev set only and is judged on 2,000 held-out rows of the same model, by its excess held-out log loss over the
planted T (the oracle) and by the held-out ECE; a second table does the same for a confident model (margins 2-5). A
third table takes dev sets the model happens to separate (every
answer right: rows drawn from the model, only the right ones kept, margins s in 2-5) and judges each fit against
T = 1 on held-out rows that include the model's mistakes.

The fits:

* ``per_option``: the earlier fit, one pseudo-count per option ((n·y + 1)/(n + K): K / (n + K) of every target moved);
* ``raw``: the real targets, no guard (a separated dev set drives T to the search's lower bound);
* ``prior``: the real targets with a normal prior on log T (σ = 1), the MAP;
* ``platt``: Platt's right/wrong pseudo-counts for any K (1/(n + 2) of each target moved, spread over the other
  options), ``fit_temperature``;
* ``binary``: the same pair on the right answer's probability alone, −[(1 − ε) log p + ε log(1 − p)]: the ε goes to
  "any other option" rather than to each;
* ``shipped``: ``platt`` with calibrate's check (``checked_temperature``: T = 1 kept where the fit does not lower the
  dev log loss), what ``mydecide calibrate`` does;
* ``platt_cv``: ``platt`` with a 5-fold cross-validated check instead (T = 1 kept unless the fit's cross-validated
  dev log loss is below T = 1's).

    .venv/bin/python bench/bench_calibration.py [--reps 10]

Prints both tables and the ratio of the shipped fit's excess held-out log loss to the earlier fit's, and writes
bench/results/calibration.json.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable

import numpy as np
from _common import RESULTS, ROOT

from mydecide.calibration.temperatures import LOG_T_BOUNDS, checked_temperature, fit_temperature
from mydecide.metrics import ece

SIZES = (20, 36, 100, 500)
OPTIONS = (2, 4, 7, 77)
PLANTED = (0.5, 1.0, 2.0)
HELD_OUT = 2000
Fit = Callable[[np.ndarray, np.ndarray], float]


def log_softmax(z: np.ndarray) -> np.ndarray:
    top = z.max(axis=1, keepdims=True)
    return z - top - np.log(np.exp(z - top).sum(axis=1, keepdims=True))


def mean_log_loss(z: np.ndarray, gold: np.ndarray, t: float) -> float:
    return float(-log_softmax(z / t)[np.arange(len(gold)), gold].mean())


def draw(rng: np.random.Generator, n: int, k: int, planted: float, margins: tuple[float, float] = (0.3, 3.0)):
    """(z, gold): n rows of K scored logits and answers drawn from the model that ``planted`` calibrates."""
    true = rng.standard_normal((n, k)) * rng.uniform(*margins, size=(n, 1))  # (n, K) z*
    p = np.exp(log_softmax(true))
    gold = np.minimum((p.cumsum(axis=1) < rng.random((n, 1))).sum(axis=1), k - 1)  # (n,) a draw from p
    return true * planted, gold


def separated(rng: np.random.Generator, n: int, k: int, planted: float):
    """A dev set the model separates: rows of the model with margins 2-5, only those it answers right."""
    while True:
        z, gold = draw(rng, 30 * n, k, planted, (2.0, 5.0))
        right = np.flatnonzero(z.argmax(axis=1) == gold)[:n]
        if len(right) == n:
            return z[right], gold[right]


def rows(z: np.ndarray, gold: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    eye = np.eye(z.shape[1])
    return list(z), list(eye[gold])


def minimise(loss: Callable[[float], float]) -> float:
    from scipy.optimize import minimize_scalar

    found = minimize_scalar(loss, bounds=LOG_T_BOUNDS, method="bounded", options={"xatol": 1e-6})
    return math.exp(found.x)


def per_option(z: np.ndarray, gold: np.ndarray) -> float:
    n, k = z.shape
    targets = np.full((n, k), 1.0 / (n + k))
    targets[np.arange(n), gold] = (n + 1.0) / (n + k)
    return minimise(lambda lt: float(-(targets * log_softmax(z / math.exp(lt))).sum(axis=1).mean()))


def raw(z: np.ndarray, gold: np.ndarray) -> float:
    return fit_temperature(*rows(z, gold), smooth=False)


def prior(z: np.ndarray, gold: np.ndarray, sigma: float = 1.0) -> float:
    n = len(gold)
    return minimise(lambda lt: n * mean_log_loss(z, gold, math.exp(lt)) + lt * lt / (2 * sigma * sigma))


def platt(z: np.ndarray, gold: np.ndarray) -> float:
    return fit_temperature(*rows(z, gold))


def binary(z: np.ndarray, gold: np.ndarray) -> float:
    n = len(gold)
    eps = 1.0 / (n + 2)

    def loss(lt: float) -> float:
        right = log_softmax(z / math.exp(lt))[np.arange(n), gold]  # (n,) log p of the given answer
        wrong = np.log(-np.expm1(np.minimum(right, -1e-300)))  # log(1 − p)
        return float(-((1 - eps) * right + eps * wrong).mean())

    return minimise(loss)


def shipped(z: np.ndarray, gold: np.ndarray) -> float:
    return checked_temperature(*rows(z, gold))[0]


def platt_cv(z: np.ndarray, gold: np.ndarray, folds: int = 5) -> float:
    fold = np.arange(len(gold)) % folds
    held = sum(
        mean_log_loss(z[fold == f], gold[fold == f], platt(z[fold != f], gold[fold != f])) * (fold == f).sum()
        for f in range(folds)
    ) / len(gold)
    return platt(z, gold) if held < mean_log_loss(z, gold, 1.0) else 1.0


FITS: dict[str, Fit] = {
    "per_option": per_option,
    "raw": raw,
    "prior": prior,
    "platt": platt,
    "binary": binary,
    "shipped": shipped,
    "platt_cv": platt_cv,
}


def judge(fit: Fit, z, gold, z_held, gold_held, reference: float) -> tuple[float, float, float]:
    """(excess held-out log loss over T = reference, held-out ECE, fitted T / planted T)."""
    t = fit(z, gold)
    probs = np.exp(log_softmax(z_held / t))
    eye = np.eye(z.shape[1])
    excess = mean_log_loss(z_held, gold_held, t) - mean_log_loss(z_held, gold_held, reference)
    return excess, ece(list(probs), list(eye[gold_held])), t


def table(title: str, cells: dict[tuple[int, int], dict[str, list[tuple[float, float, float]]]]) -> None:
    print(f"\n{title}")
    print(f"{'K':>3} {'n':>4}  " + "  ".join(f"{name:>16}" for name in FITS))
    for (k, n), by_fit in cells.items():
        line = "  ".join(
            f"{1000 * np.mean([e for e, _, _ in v]):+7.1f} / {np.mean([c for _, c, _ in v]):.3f}"
            for v in by_fit.values()
        )
        print(f"{k:>3} {n:>4}  {line}")


def summary(cells: dict) -> dict:
    return {
        f"K={k} n={n}": {
            name: {
                "excess_log_loss": float(np.mean([e for e, _, _ in v])),
                "ece": float(np.mean([c for _, c, _ in v])),
                "t_ratio_p10_p50_p90": [float(q) for q in np.quantile([t for _, _, t in v], [0.1, 0.5, 0.9])],
            }
            for name, v in by_fit.items()
        }
        for (k, n), by_fit in cells.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10, help="Dev sets per (K, n, planted T) cell.")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    started = time.perf_counter()

    def cells(margins: tuple[float, float]) -> dict:
        out: dict = {}
        for k in OPTIONS:
            for n in SIZES:
                cell: dict[str, list] = {name: [] for name in FITS}
                for planted in PLANTED:
                    for _ in range(args.reps):
                        z, gold = draw(rng, n, k, planted, margins)
                        z_held, gold_held = draw(rng, HELD_OUT, k, planted, margins)
                        for name, fit in FITS.items():
                            e, c, t = judge(fit, z, gold, z_held, gold_held, planted)
                            cell[name].append((e, c, t / planted))
                out[(k, n)] = cell
        return out

    ordinary = cells((0.3, 3.0))
    table(
        "Held-out log loss above the planted T's (×1000) / held-out ECE, mean over planted T 0.5, 1, 2 "
        f"and {args.reps} dev sets each",
        ordinary,
    )
    confident = cells((2.0, 5.0))
    table("The same for a confident model (margins 2-5)", confident)
    separable: dict = {}
    for k in (2, 7):
        for n in (20, 36):
            cell = {name: [] for name in FITS}
            for planted in PLANTED:
                for _ in range(args.reps):
                    z, gold = separated(rng, n, k, planted)
                    z_held, gold_held = draw(rng, HELD_OUT, k, planted, (2.0, 5.0))
                    for name, fit in FITS.items():
                        e, c, t = judge(fit, z, gold, z_held, gold_held, 1.0)
                        cell[name].append((e, c, t / planted))
            separable[(k, n)] = cell
    table("Dev sets the model separates: held-out log loss above T = 1's (×1000) / held-out ECE", separable)

    def excess(cells: dict, name: str) -> float:
        return float(np.mean([e for cell in cells.values() for e, _, _ in cell[name]]))

    ratio = excess(ordinary, "shipped") / excess(ordinary, "per_option")
    small = {key: cell for key, cell in ordinary.items() if key[1] <= 36}
    print(
        f"\nshipped / per_option excess held-out log loss: {ratio:.3f} over all cells, "
        f"{excess(small, 'shipped') / excess(small, 'per_option'):.3f} at n <= 36"
    )
    results = {
        "reps": args.reps,
        "held_out_rows": HELD_OUT,
        "shipped_over_per_option_excess_log_loss": ratio,
        "ordinary": summary(ordinary),
        "confident": summary(confident),
        "separable": summary(separable),
        "seconds": round(time.perf_counter() - started, 1),
    }
    out = RESULTS / "calibration.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)} ({results['seconds']:.0f}s)")


if __name__ == "__main__":
    main()
