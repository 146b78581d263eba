"""`mydecide evaluate`: the report is what predictions.jsonl implies, flip rate, baselines, coherence, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.special import expit, softmax
from typer.testing import CliRunner

from mydecide.cli import app
from mydecide.commands.evaluate import parse_costs
from mydecide.commands.options import recipe_from_command_line, split_args
from mydecide.config import CalibrateRecipe, EvalRecipe
from mydecide.evaluation.baselines import LabelPrior, majority_rows
from mydecide.evaluation.classes import class_tables
from mydecide.evaluation.rows import METRIC_KEYS, block, question_rows, rows_from_predictions
from mydecide.evaluation.run import permuted_orders, run_evaluation, threshold_report
from mydecide.recipe_loading import load_recipe
from mydecide.records import Record, parse_record

REPO = Path(__file__).resolve().parents[2]
CHOICE = {
    "type": "choice",
    "instructions": "Which team should handle this ticket?",
    "criteria": {"billing": "Charges and refunds", "engineering": "Bugs and outages", "support": "How-to questions"},
}
NOUL = {"type": "noul", "instructions": "Is a production system down?"}
SCORE = {"type": "score", "instructions": "How urgent is it?", "criteria": ["not urgent", "today", "blocking"]}
SET = {"type": "set", "instructions": "Which tags apply?", "criteria": {"bug": "a defect", "money": "payments"}}


def record_rows(n: int = 6) -> list[dict[str, Any]]:
    """Mixed questions; choice and noul share their state (two questions of one request)."""
    rows: list[dict[str, Any]] = []
    for i in range(n):
        outage = f"Checkout returns HTTP 500 for every customer since 09:{10 + i}."
        invoice = f"The invoice {i} was charged twice and the customer wants a refund."
        rows.append(
            {
                "task": "routing",
                "state": outage,
                "question": CHOICE,
                "answer": ("billing", "engineering", "support")[i % 3],
            }
        )
        rows.append({"task": "outage", "state": outage, "question": NOUL, "answer": i % 2 == 0})
        rows.append(
            {
                "task": "urgency",
                "lang": "de",
                "state": invoice,
                "question": SCORE,
                "target": {"0": 0.2, "1": 0.5, "2": 0.3},
            }
        )
        rows.append(
            {
                "task": "tags",
                "state": {"ticket": invoice, "id": i},
                "question": SET,
                "answer": ["money"] if i % 3 else ["bug", "money"],
            }
        )
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def records(rows: list[dict[str, Any]]) -> list[Record]:
    return [r for row in rows for r in parse_record(row)]


def make_adapter(model_dir: Path, out: Path) -> Path:
    """A LoRA adapter with random (non-zero) B matrices, so the adapter changes the answers."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from mydecide.adapters import weights_fingerprint
    from mydecide.training.model_card import record_base_model

    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_pretrained(model_dir)
    fingerprint = weights_fingerprint(lm)
    peft = get_peft_model(
        lm, LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    )
    peft.save_pretrained(out)
    record_base_model(out, str(model_dir), fingerprint)
    return out


# ------------------------------------------------------------------------------------------------ end to end


def assert_same_block(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert set(got) == set(expected)
    for key, value in expected.items():
        if isinstance(value, float):
            assert got[key] == pytest.approx(value, rel=1e-9), key
        else:
            assert got[key] == value, key


def _expected_all(predictions: list[dict[str, Any]]) -> dict[str, float]:
    """Headline metrics recomputed from predictions.jsonl with plain numpy (independent of the package)."""
    p_rows, y_rows = [], []
    for pred in predictions:
        p = np.array(list(pred["probabilities"].values()))
        y = np.array([pred["target"][o] for o in pred["probabilities"]])
        if pred["type"] == "set":
            p_rows += [np.array([q, 1 - q]) for q in p]
            y_rows += [np.array([t, 1 - t]) for t in y]
        else:
            p_rows.append(p)
            y_rows.append(y)
    conf = np.array([p.max() for p in p_rows])
    right = np.array([np.argmax(p) == np.argmax(y) for p, y in zip(p_rows, y_rows, strict=True)])
    bins = np.minimum((conf * 10).astype(int), 9)
    ece = sum(
        abs(right[bins == b].mean() - conf[bins == b].mean()) * (bins == b).mean()
        for b in range(10)
        if (bins == b).any()
    )
    flips = [pred["flipped"] for pred in predictions if pred["flipped"] is not None]
    chance = np.mean([1 / len(p) for p in p_rows])
    return {
        "n": len(p_rows),
        "questions": len(predictions),
        "accuracy": right.mean(),
        "chance_corrected": (right.mean() - chance) / (1 - chance),
        "log_loss": np.mean([-(y * np.log(p)).sum() for p, y in zip(p_rows, y_rows, strict=True)]),
        "brier": np.mean([((p - y) ** 2).sum() for p, y in zip(p_rows, y_rows, strict=True)]),
        "ece": ece,
        "flip_rate": np.mean(flips),
        "latency_p50_ms": np.percentile([pred["latency_ms"] for pred in predictions], 50),
    }


def test_cli_end_to_end_and_the_report_is_what_predictions_imply(tiny_llama_dir: Path, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    dev = write_jsonl(data_dir / "dev.jsonl", record_rows(3))
    train_rows = [
        dict(r, state=f"train {i}", answer="support") if r["task"] == "routing" else r
        for i, r in enumerate(record_rows(4))
    ]
    train = write_jsonl(data_dir / "train.jsonl", train_rows)
    adapter = make_adapter(tiny_llama_dir, tmp_path / "adapter")
    temperatures = tmp_path / "temperatures.json"
    temperatures.write_text(
        json.dumps(
            {"types": {"choice": {"temperature": 0.5}, "noul": {"temperature": 2.0}, "set": {"temperature": 1.5}}}
        )
    )
    out = tmp_path / "eval"
    result = CliRunner().invoke(
        app,
        [
            "evaluate",
            "--model",
            str(tiny_llama_dir),
            "--adapter",
            str(adapter),
            "-t",
            str(temperatures),
            "--data",
            str(dev),
            "--out",
            str(out),
            "--permutations",
            "1",
            "--coherence",
            "--costs",
            "right=1,wrong=-3,escalate=-0.5",
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "auto-act when p > 0.625" in result.output

    for name in ("predictions.jsonl", "base_predictions.jsonl", "report.json", "report.md", "recipe.yaml"):
        assert (out / name).is_file(), name
    assert (out / "reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((out / "report.json").read_text())
    predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 12 == report["records"]

    # the contract's keys
    for key in ("all", "choice", "noul", "score", "set"):
        assert set(METRIC_KEYS) <= set(report[key]), key
    assert set(report["by_task"]) == {"routing", "outage", "urgency", "tags"}
    assert set(report["slices"]) == {"lang", "option_count", "state_tokens", "confidence"}

    # probabilities: keyed by option id, softmax / sigmoid of the logits at the file's temperature
    first = {p["type"]: p for p in predictions}
    assert list(first["noul"]["probabilities"]) == ["yes", "no"]
    assert list(first["score"]["probabilities"]) == ["0", "1", "2"]
    assert list(first["choice"]["probabilities"]) == ["billing", "engineering", "support"]
    assert [p["temperature"] for p in first.values()] == [0.5, 2.0, 1.0, 1.5]  # score: not in the file → 1
    for p in predictions:
        z, t = np.array(p["logits"]), p["temperature"]
        expected = expit(z / t) if p["type"] == "set" else softmax(z / t)
        assert np.allclose(list(p["probabilities"].values()), expected, atol=1e-12)

    # the report's numbers are what predictions.jsonl implies
    for key, value in _expected_all(predictions).items():
        assert report["all"][key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    rebuilt = rows_from_predictions(predictions)
    for qtype in ("choice", "noul", "score", "set"):
        assert_same_block(report[qtype], block([r for r in rebuilt if r.qtype == qtype]))
    for task, got in report["by_task"].items():
        assert_same_block(got, block([r for r in rebuilt if r.task == task]))
    scores = [p for p in predictions if p["type"] == "score"]
    soft = np.mean([p["target"][max(p["probabilities"], key=p["probabilities"].get)] for p in scores])
    assert report["score"]["n_soft"] == 3 and report["score"]["soft_accuracy"] == pytest.approx(soft)
    assert report["score"]["rps"] is not None and report["choice"]["rps"] is None
    from mydecide.metrics import ordinal_summary

    ordinal = ordinal_summary(
        [np.array(list(p["probabilities"].values())) for p in scores],
        [np.array(list(p["target"].values())) for p in scores],
    )
    assert report["score"]["ordinal"] == pytest.approx(ordinal) and "ordinal" not in report["choice"]
    assert report["score"]["ordinal"]["rps"] == pytest.approx(report["score"]["rps"])
    markdown = (out / "report.md").read_text()
    assert "## Score questions" in markdown and "| task urgency |" in markdown
    assert "score (ordinal)              MAE" in result.output
    assert report["set"]["n"] == 6 and report["set"]["questions"] == 3

    # baselines: the base model is the same weights with the adapter disabled; majority from train.jsonl
    base = [json.loads(line) for line in (out / "base_predictions.jsonl").read_text().splitlines()]
    from mydecide.modeling import load_model
    from mydecide.scoring.engine import score_questions

    plain = load_model(str(tiny_llama_dir))
    recs = records(record_rows(3))
    plain_logits = score_questions(plain, [(r.state, r.question) for r in recs])
    by_id = {p["id"]: p for p in base}
    for r, z in zip(recs, plain_logits, strict=True):
        assert np.allclose(by_id[r.id]["logits"], z, atol=1e-4)
    assert not np.allclose(
        [v for p in predictions for v in p["logits"]], [v for p in base for v in p["logits"]], atol=1e-3
    )  # the adapter does change the answers
    assert report["baselines"]["base_model"]["all"]["accuracy"] == pytest.approx(_expected_all(base)["accuracy"])
    majority = report["baselines"]["majority"]
    assert majority["source"] == str(train) and majority["in_sample_tasks"] == []
    assert majority["by_task"]["routing"]["accuracy"] == pytest.approx(1 / 3)  # train says "support" always
    assert report["uncalibrated"]["all"]["accuracy"] == report["all"]["accuracy"]
    assert report["uncalibrated"]["all"]["log_loss"] != report["all"]["log_loss"]

    thresholds = report["thresholds"]
    assert thresholds["auto_act_threshold"] == pytest.approx(0.625)
    assert [row["threshold"] for row in thresholds["table"] if row["auto_act"]] == [0.625]
    coherence = report["coherence"]  # jevbench on every state (6 of 9: the 3 with only a set question have none)
    assert (coherence["cases"], coherence["questions"], coherence["left_out"]) == (6, 9, {"set": 3})
    assert list(coherence["dimensions"]) == ["REP", "BAT", "MEA", "LOG", "CHO"]
    assert coherence["groups"]["BAT.isolation"] == {"score": 1.0, "n": 21}  # by construction
    assert "coherence (jevbench 0.1.0, 6 states, 9 questions, seed 13): overall" in result.output
    assert "  BAT 100.0 (n " in result.output

    markdown = (out / "report.md").read_text()
    for heading in (
        "## Overall",
        "## Baselines",
        "## Per task",
        "## Slices",
        "## Thresholds",
        "## Coherence (JevBench)",
        "## Temperatures",
        "reliability.png",
    ):
        assert heading in markdown, heading
    assert "base model (no adapter)" in markdown and f"majority ({train})" in markdown
    assert "| **BAT** | **100.0** |" in markdown

    # per option tables, intervals and the confusion plot: what the predictions imply
    assert [(t["task"], t["type"]) for t in report["classes"]] == [("routing", "choice"), ("tags", "set")]
    assert report["classes"] == class_tables(predictions)
    assert sum(map(sum, report["classes"][0]["confusion"])) == report["by_task"]["routing"]["n"]
    low, high = report["intervals"]["all"]["log_loss"]
    assert low <= report["all"]["log_loss"] <= high
    assert (out / "confusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for heading in ("## Intervals", "## Per option", "### routing (choice, 3 questions", "| gold \\ predicted |"):
        assert heading in markdown, heading


# ------------------------------------------------------------------------------------------ order robustness


def first_position_scorer(items, orders=None):
    """Prefers whatever option is shown first (label A): the classic order bias."""
    out = []
    for n, (_, q) in enumerate(items):
        order = (orders[n] if orders is not None else None) or tuple(range(q.k))
        z = np.zeros(q.k)
        if q.type == "set":
            out.append(np.full(q.k, 0.5))
            continue
        z[order[0]] = 3.0
        out.append(z)
    return out


def content_scorer(items, orders=None):
    """Answers by content (prefers the last option id alphabetically): no order dependence."""
    out = []
    for _, q in items:
        z = np.zeros(q.k)
        z[max(range(q.k), key=lambda i: q.options[i])] = 2.0
        out.append(z)
    return out


def test_flip_rate_with_an_order_dependent_scorer(tiny_llama_dir: Path) -> None:
    from mydecide.modeling import load_model

    model = load_model(str(tiny_llama_dir))
    recs = records(record_rows(3))
    biased = run_evaluation(model, recs, scorer=first_position_scorer, permutations=3, progress=False).report
    assert biased["choice"]["flip_rate"] == 1.0 and biased["noul"]["flip_rate"] is None  # yes / no: one order
    assert biased["choice"]["flip_n"] == 3 and biased["score"]["flip_rate"] is None
    assert biased["set"]["flip_rate"] is None and biased["all"]["flip_rate"] == 1.0
    steady = run_evaluation(model, recs, scorer=content_scorer, permutations=3, progress=False).report
    assert steady["all"]["flip_rate"] == 0.0 and steady["all"]["flip_n"] == 3  # the choice questions
    assert steady["slices"]["state_tokens"]  # state lengths come from the model's renderer


def test_several_files_get_their_own_blocks_and_no_model_means_char_lengths() -> None:
    recs = records(record_rows(2))
    files = ["a.jsonl"] * 5 + ["b.jsonl"] * 3
    report = run_evaluation(None, recs, scorer=content_scorer, files=files, progress=False).report
    assert {name: b["questions"] for name, b in report["by_file"].items()} == {"a.jsonl": 5, "b.jsonl": 3}
    assert report["baselines"]["majority"]["source"] == "in-sample majority"
    assert "base_model" not in report["baselines"]  # no adapter, no base scorer


def test_permuted_orders_are_distinct_non_identity_and_seeded() -> None:
    recs = records(record_rows(1))
    four = records(
        [
            {
                "task": "t",
                "state": "s",
                "question": {"type": "choice", "instructions": "Pick", "criteria": ["a", "b", "c", "d"]},
                "answer": "a",
            }
        ]
    )
    two = records(
        [
            {
                "task": "t",
                "state": "s",
                "question": {"type": "choice", "instructions": "Pick", "criteria": ["a", "b"]},
                "answer": "b",
            }
        ]
    )
    pairs = permuted_orders(recs + four + two, permutations=4, seed=3)
    by_record: dict[int, list[tuple[int, ...]]] = {}
    for n, order in pairs:
        by_record.setdefault(n, []).append(order)
    assert set(by_record) == {0, 4, 5}  # the choices; not noul (always yes / no), score or set
    assert by_record[5] == [(1, 0)]  # K = 2: only the reversed order exists
    assert by_record[0][0] == (2, 1, 0) and by_record[4][0] == (3, 2, 1, 0)  # reversed first
    for orders in by_record.values():
        assert len(set(orders)) == len(orders) and all(o != tuple(range(len(o))) for o in orders)
    assert 2 <= len(by_record[4]) <= 5
    assert permuted_orders(recs + four + two, permutations=4, seed=3) == pairs


# -------------------------------------------------------------------------------------------------- baselines


def test_majority_uses_the_training_distribution_and_names_in_sample_tasks() -> None:
    train = records([{"task": "outage", "state": f"s{i}", "question": NOUL, "answer": i < 3} for i in range(4)])
    evals = records(
        [{"task": "outage", "state": f"e{i}", "question": NOUL, "answer": False} for i in range(4)]
        + [{"task": "new", "state": "x", "question": CHOICE, "answer": "support"}]
    )
    rows, info = majority_rows(evals, LabelPrior.from_records(train, "train.jsonl"))
    assert info["source"] == "train.jsonl" and info["in_sample_tasks"] == ["new"]
    # train says yes 3 of 4 → add-one smoothed (3 + 1) / (4 + 2); the eval file's own majority (no) is ignored
    assert rows[0].probs == pytest.approx([4 / 6, 2 / 6])
    assert block(rows[:4])["accuracy"] == 0.0
    assert rows[4].probs == pytest.approx([1 / 4, 1 / 4, 2 / 4])  # in-sample for the unseen task
    _, no_train = majority_rows(evals, None)
    assert no_train["source"] == "in-sample majority" and no_train["in_sample_tasks"] == ["new", "outage"]


# ------------------------------------------------------------------------------------------ metrics and tables


def test_set_metrics_count_label_rows_and_whole_sets() -> None:
    recs = records(
        [
            {"task": "t", "state": "a", "question": SET, "answer": ["money"]},
            {"task": "t", "state": "b", "question": SET, "answer": ["bug", "money"]},
        ]
    )
    rows = question_rows(0, recs[0], np.array([0.2, 0.9])) + question_rows(1, recs[1], np.array([0.3, 0.6]))
    got = block(rows)
    assert (got["n"], got["questions"]) == (4, 2)
    assert got["accuracy"] == 0.75  # 3 of 4 labels on the right side of 0.5
    assert got["exact_set_accuracy"] == 0.5  # the second set misses "bug"
    assert got["micro_f1"] == pytest.approx(2 * 2 / (2 * 2 + 0 + 1))  # tp 2, fp 0, fn 1


def test_empty_blocks_keep_every_key_and_thresholds_follow_the_payoffs() -> None:
    assert block([]) == {**dict.fromkeys(METRIC_KEYS), "n": 0, "questions": 0}
    recs = records([{"task": "t", "state": f"s{i}", "question": NOUL, "answer": True} for i in range(4)])
    rows = [
        r
        for n, (rec, p) in enumerate(zip(recs, (0.95, 0.7, 0.6, 0.3), strict=True))
        for r in question_rows(n, rec, np.array([p, 1 - p]))
    ]
    report = threshold_report(rows, {"right": 1.0, "wrong": -3.0, "escalate": -0.5}, thresholds=(0.5, 0.9))
    table = {row["threshold"]: row for row in report["table"]}
    assert list(table) == [0.5, 0.625, 0.9]
    # above 0.625: 0.95 and 0.7 (right), and P(yes) = 0.3, whose top probability 0.7 is on "no" (wrong)
    assert table[0.625] == {
        "threshold": 0.625,
        "coverage": 0.75,
        "accuracy": pytest.approx(2 / 3),
        "auto_act": True,
        "payoff": pytest.approx((1 + 1 - 3 - 0.5) / 4),
    }
    assert table[0.9] == {
        "threshold": 0.9,
        "coverage": 0.25,
        "accuracy": 1.0,
        "auto_act": False,
        "payoff": pytest.approx((1 - 0.5 * 3) / 4),
    }
    assert table[0.5]["coverage"] == 1.0 and table[0.5]["accuracy"] == 0.75


# ------------------------------------------------------------------------------------------------------ errors


def test_empty_and_malformed_eval_files_name_the_file_and_line(tiny_llama_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    result = runner.invoke(
        app, ["evaluate", "--model", str(tiny_llama_dir), "--data", str(empty), "-q", "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 2 and f"{empty}: file holds no records" in result.output

    good = json.dumps(record_rows(1)[1])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good + '\n{"task": \n')
    result = runner.invoke(app, ["evaluate", "--data", str(bad), "--model", str(tiny_llama_dir), "-q"])
    assert result.exit_code == 2 and "bad.jsonl:2: invalid JSON" in result.output
    bad.write_text(good + "\n" + good + "\n" + json.dumps({**record_rows(1)[0], "answer": "legal"}) + "\n")
    result = runner.invoke(app, ["evaluate", "--data", str(bad), "--model", str(tiny_llama_dir), "-q"])
    assert result.exit_code == 2 and "bad.jsonl:3: answer 'legal' is not one of the options" in result.output
    result = runner.invoke(app, ["evaluate", "--model", str(tiny_llama_dir), "-q"])
    assert result.exit_code == 2 and "--data" in result.output
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="no records"):
        run_evaluation(None, [], scorer=content_scorer)


def test_command_line_pieces_and_shipped_recipes(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert split_args(["r.yaml", "limit=5", str(b)], data_files=True) == ("r.yaml", ["limit=5"], [str(b)])
    assert parse_costs("right=2, wrong=-5") == {"right": 2.0, "wrong": -5.0}
    with pytest.raises(ValueError, match="expected right=…,wrong=…,escalate=…"):
        parse_costs("correct=1")
    with pytest.raises(ValueError, match="wrong must be a number"):
        parse_costs("wrong=lots")
    recipe = recipe_from_command_line(
        EvalRecipe, ["limit=5", str(b)], {"data": [str(a)], "coherence": 40}, data_files=True
    )
    assert recipe.data == [str(a), str(b)] and recipe.limit == 5 and recipe.coherence == 40
    for path, model in (
        (REPO / "recipes/eval/default.yaml", EvalRecipe),
        (REPO / "recipes/calibrate/default.yaml", CalibrateRecipe),
    ):
        text = path.read_text()
        assert text.startswith("#") and f"recipes/{path.parent.name}/default.yaml" in text
        assert load_recipe(path, model=model) == model()  # the shipped file spells out the defaults
