"""Score questions in the binomial form: the levels listed lowest first, then one yes / no read "is the right level
closer to the top level than to the bottom one?", whose log-odds s give the level logits z_k = log C(K − 1, k) + k·s
(softmax(z) is Binomial(K − 1, sigmoid(s))).

Every scoring path (``score_questions``, the training forward pass with and without packing, evaluate, calibrate,
predict, serve, merge) reads the same one prompt and applies the same spread, so a trained adapter answers alike
everywhere."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mydecide.prompt import RenderConfig
from mydecide.records import RecordError, parse_question, parse_record
from mydecide.scoring.plan import binomial_logits, threshold_logits

BINOMIAL = RenderConfig(score_form="binomial")
LEVELS = ["not urgent", "this week", "today", "within the hour", "blocking everyone"]
STATE = "ticket 7: checkout returns HTTP 500 for every customer since 09:10"


def score_question(levels: list[str] = LEVELS):
    return parse_question({"type": "score", "instructions": "How urgent is it?", "criteria": levels}, "urgency")


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def binomial_pmf(s: float, k: int, t: float = 1.0) -> np.ndarray:
    """The closed form, written apart from the code under test: P(j) ∝ (C(K − 1, j) · e^{j·s})^(1 / T)."""
    w = np.array([(math.comb(k - 1, j) * math.exp(j * s)) ** (1 / t) for j in range(k)])
    return w / w.sum()


# ---------------------------------------------------------------------------------------------------- rendering


def test_the_one_read_lists_every_level_lowest_first_and_asks_about_the_top_against_the_bottom(
    tiny_tokenizer_dir: Path,
) -> None:
    from transformers import AutoTokenizer

    from mydecide.scoring.plan import ScoringPlan, prompt_count
    from mydecide.scoring.render import Renderer

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    renderer = Renderer(tokenizer, BINOMIAL)
    question = score_question()
    prompt = renderer.render_binomial(STATE, question)
    assert prompt_count(question, "binomial") == 1 and renderer.form(question) == "binomial"
    plan = ScoringPlan(renderer, [(STATE, question)])
    assert [(p.prefix, p.suffix) for p in plan.prompts] == [(prompt.prefix, prompt.suffix)]
    assert prompt.order == (0, 1) and prompt.prefix == renderer.encode_state(STATE)[0]
    text = tokenizer.decode(list(prompt.suffix))
    assert [text.index(f"- {level}") for level in LEVELS] == sorted(text.index(f"- {level}") for level in LEVELS)
    assert f"closer to '{LEVELS[-1]}' than to '{LEVELS[0]}'" in text
    assert text.index("A. yes") < text.index("B. no")
    noul = parse_question({"type": "noul", "instructions": "Urgent?"}, "q")
    assert renderer.form(noul) == "letters"  # a yes / no question is one read in every score form
    with pytest.raises(ValueError, match="no binomial form"):
        renderer.render_binomial(STATE, noul)


def test_a_score_question_with_one_level_is_refused_before_any_form_reads_it() -> None:
    with pytest.raises(RecordError, match="score needs 2 to 10 levels, got 1"):
        score_question(["only"])
    with pytest.raises(ValueError, match="at least 2 levels, got 1"):
        binomial_logits(0.3, 1)


# ----------------------------------------------------------------------------------------------------- decoding


def test_binomial_decoding_is_a_unimodal_distribution_equal_to_the_closed_form() -> None:
    rng = np.random.default_rng(0)
    for k in (2, 3, 5, 10):
        for s in (*rng.normal(0, 3, size=4), -8.0, 0.0, 8.0):
            z = binomial_logits(s, k)
            assert z.shape == (k,) and z[0] == 0.0
            p = softmax(z)
            assert p.sum() == pytest.approx(1.0) and (p > 0).all()
            assert p == pytest.approx(binomial_pmf(s, k), rel=1e-9, abs=1e-15)
            at_least = np.cumsum(p[::-1])[::-1]  # P(Y ≥ j), j = 0 … K − 1
            assert at_least[0] == pytest.approx(1.0) and (np.diff(at_least) <= 1e-12).all()
            steps = np.sign(np.diff(p)[np.abs(np.diff(p)) > 1e-12])  # unimodal: rises, then falls, never again
            assert not any(a < 0 < b for a, b in itertools.pairwise(steps)), (k, s, p)
            expected_level = (k - 1) / (1 + math.exp(-s))  # the mean of Binomial(K − 1, sigmoid(s))
            assert float(np.arange(k) @ p) == pytest.approx(expected_level)
            # the threshold form with tied reads: d_j = s + log((K − j) / j)
            tied = np.array([s + math.log((k - j) / j) for j in range(1, k)])
            assert z == pytest.approx(threshold_logits(tied))
    s = 1.3  # K = 2: one read, and P(level 1) is its sigmoid, as a yes / no question's
    assert binomial_logits(s, 2) == pytest.approx([0.0, s])
    assert softmax(binomial_logits(s, 2))[1] == pytest.approx(1 / (1 + math.exp(-s)))


def test_a_temperature_divides_the_level_logits_log_choose_term_included() -> None:
    from mydecide.calibration.temperatures import apply_temperature
    from mydecide.scoring.probabilities import to_probabilities

    for k, s in ((3, 0.7), (5, -1.2), (10, 2.5)):
        z = binomial_logits(s, k)
        for t in (0.5, 1.0, 2.0):
            p = to_probabilities("score", z, t)
            assert p == pytest.approx(binomial_pmf(s, k, t), rel=1e-9)
            assert apply_temperature([z], t)[0] == pytest.approx(p)
        assert np.abs(to_probabilities("score", z, 2.0) - to_probabilities("score", z, 1.0)).max() > 1e-3


def test_the_gradient_of_the_read_is_the_expected_level_minus_the_gold_one() -> None:
    """∂(−log p_y)/∂s = E[Y] − y, through training's gather, in a batch with a threshold unit of another K."""
    import torch

    from mydecide.training.batches import question_logits

    s = torch.tensor([0.4, -1.1], dtype=torch.float64, requires_grad=True)
    reads = torch.tensor([0.2, -0.5], dtype=torch.float64)  # a K = 3 threshold unit's two reads
    yes = torch.cat([s, reads])
    prompt_logits = torch.stack([yes, torch.zeros_like(yes)], dim=1)  # (4, 2): yes − no = the read
    rows, width = prompt_logits.shape
    base, zero = rows * width, rows * width + rows
    index = torch.tensor([[base] * 5, [base + 1] * 4 + [0], [zero, base + 2, base + 3, 0, 0]])
    mask = torch.tensor([[True] * 5, [True] * 4 + [False], [True] * 3 + [False] * 2])
    z = question_logits(
        prompt_logits, index, mask, torch.tensor([False, False, True]), torch.tensor([True, True, False])
    )
    assert z[0].tolist() == pytest.approx(binomial_logits(0.4, 5).tolist())
    assert z[1, :4].tolist() == pytest.approx(binomial_logits(-1.1, 4).tolist()) and z[1, 4] == float("-inf")
    assert z[2, :3].tolist() == pytest.approx(threshold_logits(reads.numpy()).tolist())
    gold = (3, 0)
    loss = -sum(torch.log_softmax(z[i], dim=0)[y] for i, y in enumerate(gold))
    loss.backward()
    assert s.grad is not None
    for i, y in enumerate(gold):
        p = torch.softmax(z[i].detach(), dim=0)
        expected = float((torch.arange(len(p), dtype=torch.float64) * p).sum()) - y
        assert float(s.grad[i]) == pytest.approx(expected)


def test_a_half_precision_read_spreads_in_float32() -> None:
    import torch

    from mydecide.training.batches import binomial_levels

    reads = torch.full((1, 10), 0.3, dtype=torch.bfloat16)
    levels = binomial_levels(reads, torch.ones(1, 10, dtype=torch.bool))
    assert levels.dtype == torch.float32
    assert levels[0].tolist() == pytest.approx(binomial_logits(float(reads[0, 0]), 10).tolist(), abs=1e-5)


# ---------------------------------------------------------------------------------------------------- the model


def test_scored_together_equals_the_read_scored_alone(tiny_model_dir: Path) -> None:
    from mydecide.modeling import load_model
    from mydecide.scoring.engine import score_questions
    from mydecide.scoring.forward import packs, score_packed, score_prompts

    model = load_model(str(tiny_model_dir), render=BINOMIAL, device="cpu")
    items = [
        (STATE, score_question()),
        (STATE, score_question(LEVELS[:3])),  # two questions on one state: one packed row
        ("a shorter state", score_question(LEVELS[:2])),
        ("a shorter state", parse_question({"type": "noul", "instructions": "Urgent?"}, "n")),
    ]
    together = score_questions(model, items, batch_size=16)
    prompts = [model.renderer.render_binomial(state, q) for state, q in items[:3]]
    packed = score_packed(model, prompts) if packs(model) else None  # a Qwen3.5 hybrid keeps score_prompts
    for n, ((_, question), z) in enumerate(zip(items[:3], together[:3], strict=True)):
        row = score_prompts(model, [prompts[n]], batch_size=1, shared_prefix=False)[0]
        assert np.abs(z - binomial_logits(row[0] - row[1], question.k)).max() <= 1e-5
        if packed is not None:
            assert np.abs(packed[n] - row).max() <= 1e-5


def test_training_forward_matches_inference_packed_cached_and_plain(tiny_model_dir: Path) -> None:
    import torch

    from mydecide.modeling import load_model
    from mydecide.scoring.engine import score_questions
    from mydecide.scoring.packed import packing_mode
    from mydecide.training.batches import epoch_units, make_batch
    from mydecide.training.model import build_module

    model = load_model(str(tiny_model_dir), render=BINOMIAL, device="cpu")
    rows = [
        {"id": "a", "task": "t", "state": STATE, "question": score_question().to_json(), "answer": 3},
        {"id": "b", "task": "t", "state": STATE, "question": score_question(LEVELS[:3]).to_json(), "answer": 0},
        {"id": "c", "task": "t", "state": "x", "question": {"type": "noul", "instructions": "Urgent?"}, "answer": True},
        {
            "id": "d",
            "task": "t",
            "state": "x",
            "question": {"type": "choice", "instructions": "Team?", "criteria": ["billing", "eng", "sales"]},
            "answer": "eng",
        },
    ]
    records = [parse_record(r)[0] for r in rows]
    units = epoch_units(model.renderer, records, seed=0, epoch=0, shuffle_options=False)
    assert [len(u.prompts) for u in units] == [1, 1, 1, 3]
    assert [u.binomial for u in units] == [True, True, False, False] and not any(u.cumulative for u in units)
    module = build_module(model.lm, model.renderer.label_ids).eval()
    scored = score_questions(model, [(r.state, r.question) for r in records])
    for shared, packing in ((False, None), (True, None), (True, packing_mode(model.lm))):
        tb = make_batch(units, model.tokenizer.pad_token_id, shared_prefix=shared, packing=packing)
        with torch.no_grad():
            logits = tb.logits(module(tb.batch)).double()
        assert tb.mask.sum(1).tolist() == [5, 3, 2, 3]
        for row, z in zip(logits, scored, strict=True):
            assert np.abs(row[: len(z)].numpy() - z).max() <= 1e-4, (shared, packing)


# --------------------------------------------------------------------------------------- training and commands


def _one_error_line(result) -> str:
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    return errors[0]


@pytest.mark.parametrize("objective", ["proper", "rlcd"])
def test_training_in_the_binomial_form_learns_saves_the_form_and_every_command_scores_with_it(
    objective: str, tiny_llama_dir: Path, tmp_path: Path, train_score_form: Any
) -> None:
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from mydecide.calibration.temperatures import load_temperatures
    from mydecide.cli import app
    from mydecide.modeling import RENDER_CONFIG_FILE, load_model
    from mydecide.scoring.engine import score_questions
    from mydecide.serving.app import create_app

    data, run = train_score_form("binomial", objective, seed=1)
    dev = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "dev"]
    assert dev[-1]["log_loss"] < dev[0]["log_loss"] - 0.05, dev
    adapter = run / "adapter"
    assert json.loads((adapter / RENDER_CONFIG_FILE).read_text())["score_form"] == "binomial"

    model = load_model(str(tiny_llama_dir), str(adapter), device="cpu")  # no form asked: the saved one
    assert model.renderer.form(score_question(LEVELS[:4])) == "binomial"
    records = [parse_record(json.loads(line))[0] for line in (data / "dev.jsonl").read_text().splitlines()]
    logits = score_questions(model, [(r.state, r.question) for r in records])
    expected = [softmax(z) for z in logits]
    for z in logits:  # every question's levels spread from its one read
        assert z == pytest.approx(binomial_logits(z[1] - math.log(3), 4))
    out = tmp_path / "eval"
    args = ["evaluate", "--model", str(tiny_llama_dir), "--adapter", str(adapter), "--data", str(data / "dev.jsonl")]
    result = CliRunner().invoke(app, [*args, "--out", str(out), "--no-base", "--permutations", "0", "-q"])
    assert result.exit_code == 0, result.output
    predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    for p, q in zip(predictions, expected, strict=True):
        assert np.abs(np.array(list(p["probabilities"].values())) - q).max() <= 1e-5
    request = tmp_path / "request.json"
    body = {"state": records[0].state, "questions": {"u": records[0].question.to_json()}}
    request.write_text(json.dumps(body))
    predict = ["predict", str(request), "--model", str(tiny_llama_dir), "--adapter", str(adapter)]
    result = CliRunner().invoke(app, predict)
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout[result.stdout.index("{") :])
    assert np.abs(np.array(list(answer["answers"]["u"]["probabilities"].values())) - expected[0]).max() <= 1e-5
    with TestClient(create_app(model, model_name="tiny")) as client:
        health = client.get("/health").json()
        served = client.post("/v1/systemone", json=body)
    assert health["question_types"]["score"]["form"] == "binomial"
    assert served.status_code == 200, served.text
    got = served.json()["answers"]["u"]["probabilities"]
    assert np.abs(np.array(list(got.values())) - expected[0]).max() <= 1e-5

    for command, out_arg in (("evaluate", tmp_path / "e2"), ("calibrate", tmp_path / "t.json")):
        result = CliRunner().invoke(app, [command, *args[1:], "--out", str(out_arg), "--score-form", "thresholds"])
        assert result.exit_code == 2, result.output
        assert "score levels with score_form=binomial" in _one_error_line(result)
    result = CliRunner().invoke(app, [*predict, "--score-form", "thresholds"])
    assert result.exit_code != 0 and "it cannot score with score_form=thresholds" in result.output, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
    if objective == "rlcd":
        return
    temps = tmp_path / "temperatures.json"  # calibrate fits a temperature on the binomial logits; predict divides them
    result = CliRunner().invoke(app, ["calibrate", *args[1:], "--out", str(temps), "--min-rows", "10", "--keep-fit"])
    assert result.exit_code == 0, result.output
    t = load_temperatures(temps)("score", 4)
    assert t != 1.0
    result = CliRunner().invoke(app, [*predict, "--temperatures", str(temps)])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout[result.stdout.index("{") :])
    tempered = np.array(list(answer["answers"]["u"]["probabilities"].values()))
    assert np.abs(tempered - binomial_pmf(logits[0][1] - math.log(3), 4, t)).max() <= 1e-5
    merged = tmp_path / "merged"  # merge keeps the form with the merged weights
    result = CliRunner().invoke(
        app,
        ["merge", "--model", str(tiny_llama_dir), "--adapter", str(adapter), "--out", str(merged), "--device", "cpu"],
    )
    assert result.exit_code == 0, result.output
    assert json.loads((merged / RENDER_CONFIG_FILE).read_text())["score_form"] == "binomial"
    again = score_questions(load_model(str(merged), device="cpu"), [(records[0].state, records[0].question)])[0]
    assert np.abs(softmax(again) - expected[0]).max() <= 1e-3


def test_serve_answers_a_score_question_with_its_binomial_read_and_refuses_one_level(tiny_qwen_dir: Path) -> None:
    from fastapi.testclient import TestClient

    from mydecide.modeling import load_model
    from mydecide.scoring.engine import score_questions
    from mydecide.serving.app import create_app

    model = load_model(str(tiny_qwen_dir), render=BINOMIAL, device="cpu")
    expected = softmax(score_questions(model, [(STATE, score_question())])[0])
    body = {"state": STATE, "questions": {"urgency": score_question().to_json()}}
    one_level = {"type": "score", "instructions": "How urgent?", "criteria": ["only"]}
    with TestClient(create_app(model, model_name="tiny")) as client:
        response = client.post("/v1/systemone", json=body)
        refused = client.post("/v1/systemone", json={"state": STATE, "questions": {"u": one_level}})
    assert response.status_code == 200, response.text
    got = response.json()["answers"]["urgency"]["probabilities"]
    assert list(got) == ["0", "1", "2", "3", "4"]  # score levels are keyed by index
    assert np.abs(np.array(list(got.values())) - expected).max() <= 1e-5
    assert refused.status_code == 422 and "score needs 2 to 10 levels, got 1" in refused.text, refused.text
