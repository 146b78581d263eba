"""The two ways to score a question's options: ``letters`` and the order-invariant ``per_option`` form.

Per-option: every option is its own yes / no continuation of a prefix holding the state and the question, and the
K yes − no logits go through one softmax. Permuting a question's options must permute its probabilities and change
nothing else, in every path that scores (training's forward pass, ``score_questions``, evaluate, predict, serve).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mydecide.prompt import RenderConfig
from mydecide.records import parse_question, parse_record
from mydecide.scoring.render import SHORT_YES_NO, Renderer

STATE = "ticket 7: the invoice was charged twice and the customer wants a refund"
CRITERIA = {
    "billing": "Charges, invoices and refunds",
    "engineering": "Bugs, errors and outages",
    "support": "How-to and account questions",
    "sales": "New customers and quotes",
}
PER_OPTION = RenderConfig(option_form="per_option", score_form="per_option")


def choice(criteria: dict[str, str]):
    return parse_question(
        {"type": "choice", "instructions": "Which team should handle this ticket?", "criteria": criteria}, "team"
    )


def permuted(criteria: dict[str, str], order: list[int]) -> dict[str, str]:
    keys = list(criteria)
    return {keys[i]: criteria[keys[i]] for i in order}


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


@pytest.fixture(scope="module")
def renderer(tiny_tokenizer_dir: Path) -> Renderer:
    from transformers import AutoTokenizer

    return Renderer(AutoTokenizer.from_pretrained(tiny_tokenizer_dir), PER_OPTION)


def per_option_model_dir(model_dir: Path, out: Path, **config: object) -> Path:
    """A copy of a tiny model directory that carries a per-option render config (as ``mydecide merge`` writes)."""
    from mydecide.modeling import save_render_config

    shutil.copytree(model_dir, out)
    save_render_config(out, PER_OPTION.model_copy(update=config))
    return out


# ------------------------------------------------------------------------------------------------- rendering


def test_per_option_prompts_share_one_prefix_and_name_one_option_each(renderer: Renderer) -> None:
    """The shared prefix ends the user's turn (the question and its one line of answer format, then the chat
    template's tail); each option's continuation is its text alone inside the answer turn, read at its line break."""
    tok = renderer.tokenizer
    q = choice(CRITERIA)
    prompts = renderer.render_per_option(STATE, q)
    assert len(prompts) == 4 and len({p.prefix for p in prompts}) == 1 and all(p.k == 2 for p in prompts)
    prefix = tok.decode(list(prompts[0].prefix))
    assert "Which team should handle this ticket?" in prefix and STATE in prefix
    assert prefix.endswith(tok.decode(renderer._encode(renderer.tail)))
    stem = tok.decode(list(prompts[0].prefix[len(prompts[0].root) :]))
    assert stem.startswith("\n\nQuestion: Which team should handle this ticket?\n")
    assert "Write an option, then A if it is right, B if not." in stem and "Exactly one" not in stem
    for prompt, (option, description) in zip(prompts, CRITERIA.items(), strict=True):
        assert tok.decode(list(prompt.suffix)) == f"{option} — {description}\n"
        assert prefix.count(option) == 0  # the options are not listed: no other option, no position


def test_score_levels_and_yes_no_questions_say_their_answer_format_in_one_line(renderer: Renderer) -> None:
    """A score question's per-option reads name each level's text alone; a plain yes / no question says
    :data:`SHORT_YES_NO` in place of lettered lines, and one whose options carry criteria keeps its lines."""
    tok = renderer.tokenizer
    level = parse_question(
        {"type": "score", "instructions": "How urgent is it?", "criteria": ["not urgent", "today", "now"]}, "u"
    )
    noul = parse_question({"type": "noul", "instructions": "Is it urgent?"}, "n")
    graded = parse_question(
        {"type": "noul", "instructions": "Is it urgent?", "criteria": {"true": "needs work today", "false": "later"}},
        "g",
    )
    urgency = renderer.render_per_option(STATE, level)
    assert "Write a level, then A" in tok.decode(list(urgency[0].prefix[len(urgency[0].root) :]))
    assert [tok.decode(list(p.suffix)) for p in urgency] == ["not urgent\n", "today\n", "now\n"]
    said = tok.decode(list(renderer.render(STATE, noul).suffix))
    assert said.startswith(f"\n\nQuestion: Is it urgent?\n{SHORT_YES_NO}") and "A. yes" not in said
    kept = tok.decode(list(renderer.render(STATE, graded).suffix))
    assert "A. yes — needs work today\nB. no — later\nAnswer with the letter only." in kept


def test_forms_follow_the_question_type(renderer: Renderer) -> None:
    noul = parse_question({"type": "noul", "instructions": "Is it urgent?"}, "n")
    score = parse_question({"type": "score", "instructions": "How urgent?", "criteria": ["low", "mid", "high"]}, "s")
    assert renderer.form(choice(CRITERIA)) == "per_option" and renderer.form(score) == "per_option"
    assert renderer.form(noul) == "letters"  # a yes / no question is one yes / no read in either form
    with pytest.raises(ValueError, match="no per-option form"):
        renderer.render_per_option(STATE, noul)
    assert Renderer(renderer.tokenizer).form(choice(CRITERIA)) == "per_option"  # the default for choice
    assert Renderer(renderer.tokenizer).form(score) == "per_option"  # score levels: one yes / no read per level


def test_an_unknown_form_is_an_error_naming_the_allowed_ones(tmp_path: Path) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="letters"):
        RenderConfig(option_form="per-option")  # type: ignore[arg-type]


# -------------------------------------------------------------------------------------- scoring (inference)


@pytest.mark.parametrize("k", [4, 40])
def test_permuting_options_permutes_probabilities_exactly(tiny_model_dir: Path, k: int) -> None:
    from mydecide.modeling import load_model
    from mydecide.scoring.engine import score_questions
    from mydecide.scoring.probabilities import to_probabilities

    model = load_model(str(tiny_model_dir), render=PER_OPTION, device="cpu")
    criteria = CRITERIA if k == 4 else {f"team_{i}": f"Team number {i}" for i in range(k)}
    rng = np.random.default_rng(k)
    orders = [list(range(k))[::-1], *(list(rng.permutation(k)) for _ in range(2))]
    items = [(STATE, choice(criteria))] + [(STATE, choice(permuted(criteria, o))) for o in orders]
    logits = score_questions(model, items, batch_size=64)
    p = to_probabilities("choice", logits[0])
    assert p.sum() == pytest.approx(1.0) and len(p) == k
    for order, z in zip(orders, logits[1:], strict=True):
        assert np.abs(to_probabilities("choice", z) - p[order]).max() <= 1e-5
    # and a shown order (evaluate's flip check) changes nothing at all
    shown = score_questions(model, items[:1], orders=[orders[0]])[0]
    assert np.abs(shown - logits[0]).max() <= 1e-5


def test_a_prefix_shared_batch_equals_each_option_scored_alone(tiny_model_dir: Path) -> None:
    from mydecide.modeling import load_model
    from mydecide.scoring.forward import score_prompts

    model = load_model(str(tiny_model_dir), render=PER_OPTION, device="cpu")
    prompts = model.renderer.render_per_option(STATE, choice(CRITERIA))
    prompts += model.renderer.render_per_option(
        "another, longer state: the checkout page returns HTTP 500 errors", choice(CRITERIA)
    )
    together = score_prompts(model, prompts, batch_size=len(prompts), shared_prefix=True)
    alone = [score_prompts(model, [p], batch_size=1, shared_prefix=False)[0] for p in prompts]
    assert np.abs(np.array(together) - np.array(alone)).max() <= 1e-4


def test_set_and_score_questions_work_in_the_per_option_form(tiny_llama_dir: Path) -> None:
    from mydecide.modeling import load_model
    from mydecide.scoring.engine import score_questions
    from mydecide.scoring.plan import ScoringPlan, prompt_count

    model = load_model(str(tiny_llama_dir), render=PER_OPTION, device="cpu")
    score = parse_question({"type": "score", "instructions": "How urgent?", "criteria": ["low", "mid", "high"]}, "s")
    tags = parse_question({"type": "set", "instructions": "Which apply?", "criteria": {"a": "x", "b": "y"}}, "t")
    plan = ScoringPlan(model.renderer, [(STATE, score), (STATE, tags)])
    assert len(plan.prompts) == 3 + 2 == prompt_count(score, "per_option") + prompt_count(tags)
    z_score, z_set = score_questions(model, [(STATE, score), (STATE, tags)])
    assert z_score.shape == (3,) and z_set.shape == (2,)


# --------------------------------------------------------------------------------------------------- training


def test_training_forward_is_order_invariant_and_matches_inference(tiny_model_dir: Path) -> None:
    import torch

    from mydecide.modeling import load_model
    from mydecide.scoring.engine import score_questions
    from mydecide.training.batches import epoch_units, make_batch
    from mydecide.training.model import build_module

    model = load_model(str(tiny_model_dir), render=PER_OPTION, device="cpu")
    order = [2, 0, 3, 1]
    records = [
        parse_record(
            {"id": "a", "task": "t", "state": STATE, "question": choice(CRITERIA).to_json(), "answer": "billing"}
        )[0],
        parse_record(
            {
                "id": "b",
                "task": "t",
                "state": STATE,
                "question": choice(permuted(CRITERIA, order)).to_json(),
                "answer": "billing",
            }
        )[0],
        parse_record(
            {
                "id": "c",
                "task": "t",
                "state": "a noul state",
                "question": {"type": "noul", "instructions": "Urgent?"},
                "answer": True,
            }
        )[0],
    ]
    units = epoch_units(model.renderer, records, seed=0, epoch=0, shuffle_options=True)
    assert [len(u.prompts) for u in units] == [4, 4, 1]  # one unit per record
    assert units[0].target == (1.0, 0.0, 0.0, 0.0) and units[1].target == (0.0, 1.0, 0.0, 0.0)
    module = build_module(model.lm, model.renderer.label_ids).eval()
    for shared in (True, False):
        tb = make_batch(units, model.tokenizer.pad_token_id, shared_prefix=shared)
        with torch.no_grad():
            logits = tb.logits(module(tb.batch)).double()
        assert logits.shape == (3, 4) and tb.mask.sum(1).tolist() == [4, 4, 2]
        assert torch.allclose(logits[1], logits[0][order], atol=1e-5)
        scored = score_questions(model, [(r.state, r.question) for r in records])
        for row, z in zip(logits, scored, strict=True):
            assert np.abs(row[: len(z)].numpy() - z).max() <= 1e-4


def test_training_in_the_per_option_form_learns_and_saves_the_form(tiny_llama_dir: Path, tmp_path: Path) -> None:
    import random

    from mydecide.config import TrainRecipe
    from mydecide.modeling import RENDER_CONFIG_FILE
    from mydecide.recipe_loading import load_recipe
    from mydecide.training.loop import train

    rng, words = random.Random(0), {"billing": "invoice", "engineering": "outage", "support": "password"}
    rows = []
    for i in range(120):
        team = "engineering" if rng.random() < 0.8 else rng.choice(["billing", "support"])
        rows.append(
            {
                "id": f"c{i}",
                "task": "route",
                "state": f"ticket {i}: {words[team]} {words[team]}",
                "question": {
                    "type": "choice",
                    "instructions": "Which team?",
                    "criteria": {"billing": "money", "engineering": "bugs", "support": "help"},
                },
                "answer": team,
            }
        )
    data = tmp_path / "data"
    data.mkdir()
    for name, part in (("train", rows[:96]), ("dev", rows[96:])):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    recipe = load_recipe(
        Path(__file__).resolve().parents[2] / "recipes" / "train" / "smoke.yaml",
        [
            f"model={tiny_llama_dir}",
            f"data={data}",
            f"out={tmp_path / 'run'}",
            "prompt.option_form=per_option",
            "optim.max_steps=32",  # the short wording's reads took a random 2-layer model longer than 16 to start
            "optim.lr=2e-2",
            "eval_every=16",
        ],
        model=TrainRecipe,
    )
    run = train(recipe)
    rows = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "dev"]
    assert rows[-1]["log_loss"] < rows[0]["log_loss"] - 0.2, rows
    assert rows[-1]["flip_rate"] == 0.0  # the dev check's reordered pass gives the same answers
    saved = json.loads((run / "adapter" / RENDER_CONFIG_FILE).read_text())
    assert saved["option_form"] == "per_option"


# ------------------------------------------------------------------------------- evaluate, predict and serve


def test_predict_and_evaluate_score_as_the_saved_form_says(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from mydecide.cli import app

    model_dir = per_option_model_dir(tiny_llama_dir, tmp_path / "model")
    order = [3, 0, 2, 1]
    answers = []
    for name, criteria in (("given", CRITERIA), ("reordered", permuted(CRITERIA, order))):
        request = tmp_path / f"{name}.json"
        request.write_text(
            json.dumps(
                {
                    "state": STATE,
                    "questions": {
                        "team": {
                            "type": "choice",
                            "instructions": "Which team should handle this ticket?",
                            "criteria": criteria,
                        }
                    },
                }
            )
        )
        result = CliRunner().invoke(app, ["predict", "--model", str(model_dir), str(request)])
        assert result.exit_code == 0, result.output
        answers.append(json.loads(result.stdout[result.stdout.index("{") :])["answers"]["team"])
    given, reordered = (a["probabilities"] for a in answers)
    assert given.keys() == reordered.keys() and answers[0]["choice"] == answers[1]["choice"]
    assert max(abs(given[o] - reordered[o]) for o in given) <= 1e-5

    rows = [
        {
            "id": f"r{i}",
            "task": "route",
            "state": f"ticket {i}: invoice",
            "question": {"type": "choice", "instructions": "Which team?", "criteria": CRITERIA},
            "answer": "billing",
        }
        for i in range(6)
    ]
    data = tmp_path / "dev.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "eval"
    result = CliRunner().invoke(
        app,
        ["evaluate", "--model", str(model_dir), "--data", str(data), "--out", str(out), "--permutations", "3", "-q"],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["all"]["flip_rate"] == 0.0


def test_serve_answers_permuted_options_with_permuted_probabilities(tiny_qwen_dir: Path) -> None:
    from fastapi.testclient import TestClient

    from mydecide.modeling import load_model
    from mydecide.serving.app import create_app

    model = load_model(str(tiny_qwen_dir), render=PER_OPTION, device="cpu")
    order = [1, 3, 2, 0]
    with TestClient(create_app(model, model_name="tiny")) as client:
        got = []
        for criteria in (CRITERIA, permuted(CRITERIA, order)):
            response = client.post(
                "/v1/systemone",
                json={
                    "state": STATE,
                    "questions": {
                        "team": {"type": "choice", "instructions": "Which team?", "criteria": criteria},
                        "urgent": {"type": "noul", "instructions": "Is it urgent?"},
                    },
                },
            )
            assert response.status_code == 200, response.text
            got.append(response.json())
    a, b = (g["answers"]["team"]["probabilities"] for g in got)
    assert list(b) == [list(CRITERIA)[i] for i in order]  # keyed in the request's order
    assert max(abs(a[o] - b[o]) for o in a) <= 1e-5
    assert got[0]["answers"]["urgent"]["noul"] == pytest.approx(got[1]["answers"]["urgent"]["noul"], abs=1e-6)


def test_a_form_the_model_was_not_trained_with_and_an_unknown_form_are_one_line_errors(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from mydecide.cli import app

    model_dir = per_option_model_dir(tiny_llama_dir, tmp_path / "model")
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"state": STATE, "questions": {"team": choice(CRITERIA).to_json()}}))
    for form, message in (
        ("letters", "trained to score choice options with option_form=per_option"),
        ("per-option", "option_form: Input should be 'letters' or 'per_option'"),  # refused by the recipe's type
    ):
        result = CliRunner().invoke(app, ["predict", "--model", str(model_dir), "--option-form", form, str(request)])
        assert result.exit_code != 0 and message in result.output, result.output
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
    data = tmp_path / "dev.jsonl"
    data.write_text(
        json.dumps(
            {"id": "r", "task": "t", "state": STATE, "question": choice(CRITERIA).to_json(), "answer": "billing"}
        )
        + "\n"
    )
    result = CliRunner().invoke(
        app,
        [
            "evaluate",
            "--model",
            str(model_dir),
            "--data",
            str(data),
            "--out",
            str(tmp_path / "eval"),
            "option_form=letters",
            "-q",
        ],
    )
    assert result.exit_code != 0 and "option_form=per_option" in result.output, result.output


@pytest.mark.parametrize(("saved", "found"), [({}, "no format stamp"), ({"format": 0}, "format 0")])
def test_a_render_config_of_another_format_is_refused_in_one_line(
    tiny_llama_dir: Path, tmp_path: Path, saved: dict, found: str
) -> None:
    """A render config without this version's stamp (hand-written, or saved before the stamp) is refused, never read
    through a guess of what its missing keys meant."""
    from mydecide.errors import UserError
    from mydecide.modeling import RENDER_CONFIG_FILE, load_model

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, model_dir)
    (model_dir / RENDER_CONFIG_FILE).write_text(json.dumps({**saved, **PER_OPTION.model_dump()}))
    with pytest.raises(UserError) as err:
        load_model(str(model_dir), device="cpu")
    assert str(err.value) == (
        f"{model_dir / RENDER_CONFIG_FILE}: saved by another version of mydecide ({found}; this version reads "
        "format 1); retrain the adapter with this version"
    )


def test_serve_counts_per_option_prompts_and_answers_a_255_option_choice(tiny_llama_dir: Path) -> None:
    from fastapi.testclient import TestClient

    from mydecide.config import Limits
    from mydecide.modeling import load_model
    from mydecide.serving.app import create_app

    model = load_model(str(tiny_llama_dir), render=PER_OPTION, device="cpu")
    many = {"type": "choice", "instructions": "Which intent?", "criteria": {f"intent_{i}": "" for i in range(255)}}
    with TestClient(create_app(model, model_name="tiny", limits=Limits(max_prompts=300))) as client:
        response = client.post("/v1/systemone", json={"state": STATE, "questions": {"intent": many}})
        assert response.status_code == 200, response.text
        p = response.json()["answers"]["intent"]["probabilities"]
        assert len(p) == 255 and abs(sum(p.values()) - 1) < 1e-6
        # two such questions are 510 prompts in this form (22 with letters): over the limit, said before scoring
        response = client.post("/v1/systemone", json={"state": STATE, "questions": {"a": many, "b": many}})
        assert response.status_code == 422 and "more than 300 scored prompts" in response.text
