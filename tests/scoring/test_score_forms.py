"""Score questions in the threshold form (issue 31): the levels listed lowest first, then K − 1 yes / no reads
"is the right level this one or a higher one?", whose log-odds d_k sum into the level logits z_j = d_1 + … + d_j.

Every scoring path (``score_questions``, the training forward pass with and without packing, evaluate, predict,
serve) reads the same K − 1 prompts and applies the same sums, so a trained adapter answers alike everywhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mydecide.prompt import RenderConfig
from mydecide.records import parse_question, parse_record
from mydecide.scoring.plan import threshold_logits

THRESHOLDS = RenderConfig(score_form="thresholds")
LEVELS = ["not urgent", "this week", "today", "within the hour", "blocking everyone"]
STATE = "ticket 7: checkout returns HTTP 500 for every customer since 09:10"


def score_question(levels: list[str] = LEVELS):
    return parse_question({"type": "score", "instructions": "How urgent is it?", "criteria": levels}, "urgency")


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def test_threshold_reads_share_a_prefix_that_lists_every_level_and_name_levels_one_and_up(
    tiny_tokenizer_dir: Path,
) -> None:
    from transformers import AutoTokenizer

    from mydecide.scoring.plan import ScoringPlan, prompt_count
    from mydecide.scoring.render import Renderer

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    renderer = Renderer(tokenizer, THRESHOLDS)
    question = score_question()
    prompts = renderer.render_thresholds(STATE, question)
    assert len(prompts) == len(LEVELS) - 1 == prompt_count(question, "thresholds")
    assert len({p.prefix for p in prompts}) == 1
    prefix = tokenizer.decode(list(prompts[0].prefix))
    assert all(level in prefix for level in LEVELS)
    assert [prefix.index(level) for level in LEVELS] == sorted(prefix.index(level) for level in LEVELS)
    suffixes = [tokenizer.decode(list(p.suffix)) for p in prompts]
    for level, text in zip(LEVELS[1:], suffixes, strict=True):  # read k asks about level k, k = 1 … K − 1
        assert f"Level: {level}" in text
    assert all(f"Level: {LEVELS[0]}" not in text for text in suffixes)
    assert renderer.form(question) == "thresholds" and len(ScoringPlan(renderer, [(STATE, question)]).prompts) == 4
    with pytest.raises(ValueError, match="no threshold form"):
        renderer.render_thresholds(STATE, parse_question({"type": "noul", "instructions": "Urgent?"}, "q"))


def test_threshold_decoding_is_a_distribution_with_monotone_cumulatives_and_temperature_scales_every_read() -> None:
    rng = np.random.default_rng(0)
    for k in (2, 3, 5, 11):
        reads = rng.normal(0, 3, size=k - 1)
        z = threshold_logits(reads)
        assert z.shape == (k,) and z[0] == 0.0
        p = softmax(z)
        assert p.sum() == pytest.approx(1.0) and (p > 0).all()
        at_least = np.cumsum(p[::-1])[::-1]  # P(Y ≥ j), j = 0 … K − 1
        assert at_least[0] == pytest.approx(1.0) and (np.diff(at_least) <= 1e-12).all()
        for t in (0.5, 2.0):
            assert softmax(z / t) == pytest.approx(softmax(threshold_logits(reads / t)))
    d = 1.3  # K = 2: one read, and P(level 1) is its sigmoid, as a yes / no question's
    assert softmax(threshold_logits(np.array([d])))[1] == pytest.approx(1 / (1 + np.exp(-d)))


def test_the_gradient_of_each_read_is_its_cumulative_error() -> None:
    """∂(−log p_y)/∂d_k = P(Y ≥ k) − 1[y ≥ k]: every example trains every read."""
    import torch

    from mydecide.training.batches import question_logits

    k, gold = 5, 2
    reads = torch.tensor([0.4, -1.0, 2.0, 0.3], dtype=torch.float64, requires_grad=True)
    prompt_logits = torch.stack([reads, torch.zeros_like(reads)], dim=1)  # (K − 1, 2): yes − no = the read
    rows, width = prompt_logits.shape
    index = torch.tensor([[rows * width + rows, *(rows * width + torch.arange(rows)).tolist()]])
    z = question_logits(prompt_logits, index, torch.ones(1, k, dtype=torch.bool), torch.tensor([True]))
    loss = -torch.log_softmax(z, dim=1)[0, gold]
    loss.backward()
    p = torch.softmax(z.detach(), dim=1)[0]
    expected = [float(p[j:].sum()) - float(j <= gold) for j in range(1, k)]
    assert reads.grad is not None and reads.grad.tolist() == pytest.approx(expected)


def test_scored_together_equals_each_read_scored_alone(tiny_model_dir: Path) -> None:
    from mydecide.modeling import load_model
    from mydecide.scoring.engine import score_questions
    from mydecide.scoring.forward import score_prompts

    model = load_model(str(tiny_model_dir), render=THRESHOLDS, device="cpu")
    items = [(STATE, score_question()), ("a shorter state", score_question(LEVELS[:2]))]
    together = score_questions(model, items, batch_size=16)
    for (state, question), z in zip(items, together, strict=True):
        alone = [
            score_prompts(model, [p], batch_size=1, shared_prefix=False)[0]
            for p in model.renderer.render_thresholds(state, question)
        ]
        assert np.abs(z - threshold_logits(np.array([row[0] - row[1] for row in alone]))).max() <= 1e-5


def test_training_forward_matches_inference_packed_cached_and_plain(tiny_model_dir: Path) -> None:
    import torch

    from mydecide.modeling import load_model
    from mydecide.scoring.engine import score_questions
    from mydecide.scoring.packed import packing_mode
    from mydecide.training.batches import epoch_units, make_batch
    from mydecide.training.model import build_module

    model = load_model(str(tiny_model_dir), render=THRESHOLDS, device="cpu")
    rows = [
        {"id": "a", "task": "t", "state": STATE, "question": score_question().to_json(), "answer": 3},
        {"id": "b", "task": "t", "state": "short", "question": score_question(LEVELS[:3]).to_json(), "answer": 0},
        {"id": "c", "task": "t", "state": "x", "question": {"type": "noul", "instructions": "Urgent?"}, "answer": True},
    ]
    records = [parse_record(r)[0] for r in rows]
    units = epoch_units(model.renderer, records, seed=0, epoch=0, shuffle_options=True)
    assert [len(u.prompts) for u in units] == [4, 2, 1] and [u.cumulative for u in units] == [True, True, False]
    module = build_module(model.lm, model.renderer.label_ids).eval()
    scored = score_questions(model, [(r.state, r.question) for r in records])
    for shared, packing in ((False, None), (True, None), (True, packing_mode(model.lm))):
        tb = make_batch(units, model.tokenizer.pad_token_id, shared_prefix=shared, packing=packing)
        with torch.no_grad():
            logits = tb.logits(module(tb.batch)).double()
        assert tb.mask.sum(1).tolist() == [5, 3, 2]
        for row, z in zip(logits, scored, strict=True):
            assert np.abs(row[: len(z)].numpy() - z).max() <= 1e-4, (shared, packing)


@pytest.mark.parametrize("objective", ["proper", "rlcd"])
def test_training_in_the_threshold_form_learns_saves_the_form_and_every_command_scores_with_it(
    objective: str, tiny_llama_dir: Path, tmp_path: Path, train_score_form: Any
) -> None:
    from typer.testing import CliRunner

    from mydecide.cli import app
    from mydecide.modeling import RENDER_CONFIG_FILE, load_model
    from mydecide.scoring.engine import score_questions

    data, run = train_score_form("thresholds", objective, seed=0)
    dev = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "dev"]
    assert dev[-1]["log_loss"] < dev[0]["log_loss"] - 0.05, dev
    adapter = run / "adapter"
    assert json.loads((adapter / RENDER_CONFIG_FILE).read_text())["score_form"] == "thresholds"

    model = load_model(str(tiny_llama_dir), str(adapter), device="cpu")
    records = [parse_record(json.loads(line))[0] for line in (data / "dev.jsonl").read_text().splitlines()]
    expected = [softmax(z) for z in score_questions(model, [(r.state, r.question) for r in records])]
    assert len(model.renderer.render_thresholds(records[0].state, records[0].question)) == 3
    out = tmp_path / "eval"
    args = ["evaluate", "--model", str(tiny_llama_dir), "--adapter", str(adapter), "--data", str(data / "dev.jsonl")]
    result = CliRunner().invoke(app, [*args, "--out", str(out), "--no-base", "--permutations", "0", "-q"])
    assert result.exit_code == 0, result.output
    predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    for p, q in zip(predictions, expected, strict=True):
        assert np.abs(np.array(list(p["probabilities"].values())) - q).max() <= 1e-5
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"state": records[0].state, "questions": {"u": records[0].question.to_json()}}))
    result = CliRunner().invoke(
        app, ["predict", str(request), "--model", str(tiny_llama_dir), "--adapter", str(adapter)]
    )
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout[result.stdout.index("{") :])
    assert np.abs(np.array(list(answer["answers"]["u"]["probabilities"].values())) - expected[0]).max() <= 1e-5

    for command, out_arg in (("evaluate", tmp_path / "e2"), ("calibrate", tmp_path / "t.json")):
        asked = [command, *args[1:], "--out", str(out_arg), "--score-form", "letters"]
        result = CliRunner().invoke(app, asked)
        assert result.exit_code == 2, result.output
        errors = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "score levels with score_form=thresholds" in errors[0], result.output


def test_serve_answers_a_score_question_with_its_threshold_reads(tiny_qwen_dir: Path) -> None:
    from fastapi.testclient import TestClient

    from mydecide.modeling import load_model
    from mydecide.scoring.engine import score_questions
    from mydecide.serving.app import create_app

    model = load_model(str(tiny_qwen_dir), render=THRESHOLDS, device="cpu")
    expected = softmax(score_questions(model, [(STATE, score_question())])[0])
    body = {"state": STATE, "questions": {"urgency": score_question().to_json()}}
    with TestClient(create_app(model, model_name="tiny")) as client:
        response = client.post("/v1/systemone", json=body)
    assert response.status_code == 200, response.text
    got = response.json()["answers"]["urgency"]["probabilities"]
    assert list(got) == ["0", "1", "2", "3", "4"]  # score levels are keyed by index
    assert np.abs(np.array(list(got.values())) - expected).max() <= 1e-5
