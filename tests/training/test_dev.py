"""Which adapter becomes RUN/adapter (training/dev.py ``replaces_best``, ``KeptAdapter``), and the collapse check:
it fires on a model that always answers one letter and stays silent on one that reads content."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from mydecide.training.dev import DevLoss, KeptAdapter, collapse_report, replaces_best


def best_of(losses: list[float], update: int = 100) -> KeptAdapter:
    """The adapter kept at ``update``, the lowest so far."""
    this = DevLoss(float(np.mean(losses)), update, tuple(losses))
    return KeptAdapter(this.log_loss, update, this.dev_losses, 0.5, 0.4, this)


def test_the_first_evaluation_is_the_best_unless_its_loss_is_not_finite() -> None:
    start = KeptAdapter()
    assert replaces_best([0.7, 0.9], start, 1.0)
    assert not replaces_best([0.7, math.nan], start, 1.0)
    assert not replaces_best([0.7, math.inf], start, 1.0)


def test_a_later_adapter_within_the_noise_of_the_paired_differences_replaces_the_best() -> None:
    rng = np.random.default_rng(0)
    before = list(rng.uniform(0.1, 1.5, 48))
    # higher on average by 0.01, question by question differences of sd 0.2: standard error 0.029
    noise = rng.normal(0.0, 0.2, 48)
    later = list(np.asarray(before) + noise - noise.mean() + 0.01)
    se = float(np.std(np.asarray(later) - before, ddof=1)) / 48**0.5
    assert se > 0.01
    assert replaces_best(later, best_of(before), 1.0)
    assert not replaces_best(later, best_of(before), 0.0)  # margin 0: strictly lower only (the rule before)
    assert not replaces_best(later, best_of(before), 0.01 / se - 1e-6)  # just short of the margin it needs
    # higher by more than one standard error: the earlier adapter stays
    worse = list(np.asarray(later) + 2 * se)
    assert not replaces_best(worse, best_of(before), 1.0)
    assert replaces_best(list(np.asarray(before) - 0.001), best_of(before), 1.0)  # lower: always


def test_ties_do_not_chain_the_kept_adapter_away_from_the_lowest() -> None:
    """b is within one standard error of a, and c of b, but c is far above a, the lowest: the comparison is with
    the lowest so far, so c is not kept (a choice-only run of the demo kept update 225 at dev log loss 0.397 after
    update 100's 0.186 by such a chain)."""
    rng = np.random.default_rng(1)
    a = rng.uniform(0.1, 0.5, 48)
    noise = rng.normal(0.0, 0.4, 48)
    b = a + noise - noise.mean() + 0.03  # noisy, 0.03 above a
    c = a + 0.06 + rng.normal(0.0, 0.01, 48)  # steady, 0.06 above a
    metrics = [{"log_loss": float(np.mean(x)), "accuracy": 0.5, "majority_accuracy": 0.4} for x in (a, b, c)]

    def se(x: np.ndarray, y: np.ndarray) -> float:
        return float(np.std(x - y, ddof=1)) / len(x) ** 0.5

    assert np.mean(b - a) < se(b, a) and np.mean(c - b) < se(c, b)  # each step within the noise of the one before
    assert np.mean(c - a) > se(c, a)  # but c is not within the noise of a

    best = KeptAdapter().after(metrics[0], list(a), 100)
    assert replaces_best(list(b), best, 1.0)
    assert best.within_margin_note(metrics[1]["log_loss"], 200, 1.0) == (
        "update 200 is kept as the best adapter: its dev log loss is within 1 standard error(s) of update 100's "
        f"{metrics[0]['log_loss']:.4f}, the lowest so far (best_margin)"
    )
    assert best.within_margin_note(metrics[0]["log_loss"] - 0.01, 200, 1.0) is None  # the lowest: nothing to say
    best = best.after(metrics[1], list(b), 200)
    assert best.update == 200 and best.lowest.update == 100
    assert best.lowest.log_loss == metrics[0]["log_loss"]
    assert replaces_best(list(c), best_of(list(b), 200), 1.0)  # the rule before: against the adapter kept last
    assert not replaces_best(list(c), best, 1.0)  # now: against the lowest
    # an adapter below the lowest becomes the lowest too
    lower = best.after({**metrics[0], "log_loss": metrics[0]["log_loss"] - 0.01}, list(a - 0.01), 300)
    assert lower.lowest.update == 300


def test_the_kept_adapter_reads_back_from_its_json_and_leaves_its_terms_out_of_the_summary() -> None:
    metrics = {"log_loss": 0.5, "accuracy": 0.75, "majority_accuracy": 0.5}
    best = KeptAdapter().after(metrics, [0.25, 0.75], 10).after({**metrics, "log_loss": 0.55}, [0.3, 0.8], 20)
    saved = json.loads(json.dumps(best.to_json()))  # as a checkpoint's trainer state holds it
    assert saved == {
        "log_loss": 0.55,
        "accuracy": 0.75,
        "majority_accuracy": 0.5,
        "update": 20,
        "dev_losses": [0.3, 0.8],
        "lowest": {"log_loss": 0.5, "update": 10, "dev_losses": [0.25, 0.75]},
    }
    assert KeptAdapter.from_json(saved) == best
    assert best.to_json(terms=False) == {
        "log_loss": 0.55,
        "accuracy": 0.75,
        "majority_accuracy": 0.5,
        "update": 20,
        "lowest": {"log_loss": 0.5, "update": 10},
    }


def test_terms_that_cannot_be_paired_keep_the_plain_rule() -> None:
    before = best_of([0.5, 0.5, 0.5], 50)  # three dev terms against two: no question-by-question difference
    assert not replaces_best([0.4, 0.62], before, 1.0)
    assert replaces_best([0.4, 0.58], before, 1.0)


def test_dev_metrics_calls_no_to_every_yes_no_question_one_answer_not_an_answer_position(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import mydecide.scoring.engine as engine
    from mydecide.evaluation.baselines import LabelPrior
    from mydecide.records import parse_record
    from mydecide.training.dev import dev_metrics

    rows = [
        {"task": "t", "state": f"mail {i}", "question": {"type": "noul", "instructions": "Spam?"}, "answer": i < 3}
        for i in range(10)
    ]
    dev = [r for row in rows for r in parse_record(row)]

    def always_no(model: object, items: list, orders: object = None, batch_size: int = 0) -> list:
        return [np.array([-1.0, 1.0]) for _ in items]  # yes, no

    monkeypatch.setattr(engine, "score_questions", always_no)
    out = dev_metrics(None, dev, LabelPrior.from_records(dev, "train"), seed=0, batch_size=4)
    assert out["top_letter"] == "B" and out["top_letter_share"] == 1.0 and out["accuracy"] == pytest.approx(0.7)
    collapse = [w for w in out["warnings"] if "letter B" in w]
    assert len(collapse) == 1 and "giving one answer to most questions" in collapse[0]
    assert "answer position" not in collapse[0]


def test_train_warns_at_the_end_when_the_kept_adapter_does_not_beat_the_majority_class() -> None:
    from dataclasses import replace

    from mydecide.training.dev import collapsed_warning

    collapsed = KeptAdapter(0.978, 400, (), 0.444, 0.444)
    warning = collapsed_warning(collapsed)
    assert warning is not None
    assert warning.startswith("the kept adapter's dev accuracy 0.444 does not beat always answering the majority")
    assert "optim.lr" in warning
    assert collapsed_warning(replace(collapsed, accuracy=0.822)) is None
    assert collapsed_warning(KeptAdapter(0.1, 50, (), None, None)) is None  # only span questions: no accuracy
    assert collapsed_warning(KeptAdapter()) is None  # no dev evaluation kept an adapter


def _gold_positions(n: int, k: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(k) for _ in range(n)]


def test_always_letter_a_fires() -> None:
    gold = _gold_positions(200, 4, 0)
    predicted = [0] * 200  # always "A", whatever the options are
    flips = [g != 0 for g in gold]  # its canonical-order answer moves whenever the option order does
    accuracy = sum(g == 0 for g in gold) / 200
    report = collapse_report(predicted, gold, flips, accuracy, majority_accuracy=0.3)
    assert report.top_letter == "A" and report.top_letter_share == 1.0
    assert any("letter A" in w for w in report.warnings)
    assert any("majority" in w for w in report.warnings)


def test_content_model_is_silent() -> None:
    gold = _gold_positions(200, 4, 1)
    rng = random.Random(2)
    predicted = [g if rng.random() < 0.8 else rng.randrange(4) for g in gold]  # right 80%+, by content
    flips = [rng.random() < 0.05 for _ in gold]
    accuracy = sum(p == g for p, g in zip(predicted, gold, strict=True)) / 200
    report = collapse_report(predicted, gold, flips, accuracy, majority_accuracy=0.3)
    assert report.warnings == []


def test_skewed_gold_is_not_mistaken_for_collapse() -> None:
    gold = [0] * 150 + [1] * 50  # most gold answers really are on letter A
    report = collapse_report(gold, gold, [False] * 200, accuracy=1.0, majority_accuracy=0.75)
    assert report.warnings == []


def test_one_answer_to_every_yes_no_question_is_not_called_an_answer_position() -> None:
    gold = [1] * 140 + [0] * 60  # yes / no questions: B is always "no", 70% of the gold answers
    predicted = [1] * 200  # "no" to everything
    accuracy = 140 / 200
    report = collapse_report(predicted, gold, [], accuracy, majority_accuracy=0.7, letters_shuffled=False)
    assert report.top_letter == "B" and report.top_letter_share == 1.0
    collapse = [w for w in report.warnings if "letter B" in w]
    assert collapse == [
        "100% of dev answers are letter B (gold: 70%): the model is giving one answer to most questions (each "
        "letter is one answer in these questions), not the task"
    ]
    shuffled = collapse_report(predicted, gold, [], accuracy, majority_accuracy=0.7)
    assert "answer position" in next(w for w in shuffled.warnings if "letter B" in w)
