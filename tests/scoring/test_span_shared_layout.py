"""prompt.span.layout: shared: a span question read in one block after the prefix its state's other questions share
(template head + state), scored in the state's packed row, equal to the same block read alone as one sequence."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import random_span_head, span_grid_by_hand

from mydecide.errors import UserError
from mydecide.prompt import RenderConfig
from mydecide.records import parse_question, parse_record

TEXT = "Call Anna Berg at anna.berg@mail.se or 555 0142 before Friday, says Omar Lind from support."
OBJECT = {"request": "Mail Anna about the refund.", "answer": TEXT}
CRITERIA = {"PERSON": "a person's name", "EMAIL": "an e-mail address", "PHONE": "a phone number"}
SPAN = {"type": "span", "instructions": "Which pieces of text are personal data?", "criteria": CRITERIA}
NOUL = {"type": "noul", "instructions": "Is it about a refund?"}
CHOICE = {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "engineering", "support"]}


def shared_config(max_state_tokens: int = 3000, **span: object) -> RenderConfig:
    return RenderConfig(
        max_state_tokens=max_state_tokens,
        span={"read": "head", "layout": "shared", **span},
    )


def with_head(model: Any, seed: int = 0) -> Any:
    """``model`` with a random span head (a trained one's word projection is not zero either)."""
    random_span_head(model, seed, scale=0.3)
    return model


def loaded(model_dir: Path, render: RenderConfig) -> Any:
    from mydecide.modeling import load_model

    return with_head(load_model(str(model_dir), render=render, device="cpu"))


def alone(model: Any, layout: Any) -> np.ndarray:
    """The grid with every sequence of ``layout`` (state prefix + block) run alone through the decoder, each word and
    each label line read by hand: q·k/√d + u·k + b0."""
    from mydecide.scoring.span_head import span_head_of

    grid = span_grid_by_hand(model, span_head_of(model.lm), layout)
    assert not np.isnan(grid).any()
    return grid


CASES = {  # (state, span question, max_state_tokens, window_tokens): what the prefix holds of the text
    "short text, one block": (TEXT, SPAN, 3000, 512),
    "windows inside the prefix": (OBJECT, {**SPAN, "over": "answer"}, 3000, 16),
    "a state cut by max_state_tokens": (TEXT, SPAN, 24, 16),
}


@pytest.mark.parametrize("case", CASES)
def test_reads_on_the_shared_prefix_equal_the_block_read_alone(
    tiny_llama_dir: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mydecide.scoring import span_reads
    from mydecide.scoring.engine import score_questions
    from mydecide.scoring.plan import ScoringPlan
    from mydecide.scoring.span_layout import WINDOW_TEXT, span_layout

    state, span, max_state, window = CASES[case]
    model = loaded(tiny_llama_dir, shared_config(max_state, window_tokens=window, overlap_tokens=4))
    question = parse_question(span)
    layout = span_layout(model.renderer, state, question)
    root, truncated = model.renderer.encode_state(state)
    assert truncated == (max_state < 3000)
    # every sequence is the state's prefix, exactly the root the other questions of the state share, then its block
    others = ScoringPlan(model.renderer, [(state, parse_question(NOUL)), (state, parse_question(CHOICE))]).prompts
    assert {p.root for p in others} == {root}
    assert (len(layout.sequences) == 1) == (window == 512)  # one block, or one per window
    decode = model.tokenizer.decode
    for seq in layout.sequences:
        assert seq.root == len(root) and seq.ids[: seq.root] == root
        block = decode(list(seq.ids[seq.root :]))
        assert block.startswith(WINDOW_TEXT if truncated else "\n\nQuestion: Which pieces of text are personal data?")
        lines = [decode(list(seq.ids[: r + 1])).rsplit("\n", 1)[1] for r in seq.label_reads]
        assert lines == [  # each label read at its line's last token, in the order of names
            "EMAIL — an e-mail address",
            "PERSON — a person's name",
            "PHONE — a phone number",
        ]
        assert min(seq.reads) > max(seq.label_reads)  # every word is read after all labels
    assert sorted(w for s in layout.sequences for w in s.words) == list(range(layout.n_words))

    rows = []  # the packed rows of each forward pass: the span blocks ride in their state's row
    pack = span_reads.pack

    def counting(prompts: Any, pad_id: int, **kwargs: Any) -> Any:
        batch = pack(prompts, pad_id, **kwargs)
        rows.append((len(prompts), batch.input_ids.shape[0]))
        return batch

    monkeypatch.setattr(span_reads, "pack", counting)
    items = [(state, parse_question(NOUL)), (state, question), (state, parse_question(CHOICE))]
    items.append(("Another state about an invoice.", parse_question(NOUL)))
    scored = score_questions(model, items)
    assert rows == [(len(others) + 1 + len(layout.sequences), 2)]  # two states, two rows: one with every block
    expected = alone(model, layout)
    np.testing.assert_allclose(scored[1], expected, rtol=0, atol=1e-5)
    assert np.ptp(expected) > 0.05  # the heads' reads differ from word to word: the comparison can fail
    # the other questions answer as they do without the span question beside them
    monkeypatch.undo()
    without = score_questions(model, [items[0], items[2], items[3]])
    for got, want in zip([scored[0], scored[2], scored[3]], without, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    # and without packing (score_span_questions: each block's sequence alone) the grid is the same
    (own,) = score_questions(model, [(state, question)], shared_prefix=False)
    np.testing.assert_allclose(own, expected, rtol=0, atol=1e-5)


def test_a_hybrid_model_reads_the_shared_layout_too(tiny_qwen_dir: Path) -> None:
    """Qwen3.5 (Gated DeltaNet layers) is not packed when scored: its blocks are read as whole sequences, state
    prefix and block, the same tokens as the packed rows of a model that packs."""
    from mydecide.scoring.engine import score_questions
    from mydecide.scoring.packed import packing_mode
    from mydecide.scoring.span_layout import span_layout

    model = loaded(tiny_qwen_dir, shared_config(24, window_tokens=16, overlap_tokens=4))
    assert packing_mode(model.lm) == "hybrid"
    question = parse_question(SPAN)
    scored = score_questions(model, [(TEXT, parse_question(NOUL)), (TEXT, question)])
    np.testing.assert_allclose(scored[1], alone(model, span_layout(model.renderer, TEXT, question)), atol=1e-5)


def test_permuting_a_span_questions_labels_moves_no_probability_in_the_shared_layout(tiny_llama_dir: Path) -> None:
    from mydecide.scoring.engine import score_questions

    model = loaded(tiny_llama_dir, shared_config(window_tokens=16, overlap_tokens=4))
    columns = []
    for names in itertools.permutations(CRITERIA):
        question = parse_question({**SPAN, "criteria": {name: CRITERIA[name] for name in names}})
        _, grid = score_questions(model, [(TEXT, parse_question(NOUL)), (TEXT, question)])
        p = 1 / (1 + np.exp(-grid.reshape(-1, len(names))))
        columns.append({name: p[:, j] for j, name in enumerate(names)})
    worst = max(float(np.abs(c[name] - columns[0][name]).max()) for c in columns for name in CRITERIA)
    assert worst <= 1e-6
    assert max(float(np.ptp(c)) for c in columns[0].values()) > 0.01  # probabilities that could have moved


def test_training_reads_the_shared_layout_as_scoring_does(tiny_llama_dir: Path) -> None:
    """A span record trains on the same tokens it is scored on: each window's state prefix and block, read as one
    sequence in the training module (docs/spans.md#the-shared-layout)."""
    import torch

    from mydecide.scoring.engine import score_questions
    from mydecide.scoring.span_layout import span_layout
    from mydecide.training.batches import epoch_units, make_batch
    from mydecide.training.model import build_module

    model = loaded(tiny_llama_dir, shared_config(24, window_tokens=16, overlap_tokens=4))
    answer = [{"label": "PERSON", "start": 5, "end": 14}, {"label": "EMAIL", "start": 18, "end": 35}]
    record = parse_record({"id": "r", "task": "pii", "state": TEXT, "question": SPAN, "answer": answer})[0]
    (unit,) = epoch_units(model.renderer, [record], 0, 0, False)
    layout = span_layout(model.renderer, TEXT, record.question)
    assert [s.ids for s in unit.sequences] == [s.ids for s in layout.sequences]
    assert unit.state_ids == model.renderer.encode_state(TEXT)[0]  # batched next to the state's other questions
    module = build_module(model.lm, model.renderer.label_ids).eval()
    with torch.no_grad():
        _, reads = module(None, make_batch([unit], model.tokenizer.pad_token_id, True).spans)
    (grid,) = score_questions(model, [(TEXT, record.question)])
    cells = [c for seq in unit.sequences for c in seq.cells(3)]
    np.testing.assert_allclose(reads.double().numpy(), grid[cells], atol=1e-5)
    assert unit.target == tuple(record.target[c] for c in cells) and sum(unit.target) > 0


@pytest.mark.parametrize("kind", ["llama", "qwen3_5"])
def test_training_packs_span_blocks_with_their_states_other_questions(
    tiny_llama_dir: Path, tiny_qwen_dir: Path, kind: str
) -> None:
    """In a packed training batch a span block is one more question of its state (Qwen3.5: through the Gated
    DeltaNet segments): its reads equal the block read alone, the other questions' logits are unchanged, and the
    loss's gradient reaches the span head and the LoRA-free model alike through one forward call."""
    import torch

    from mydecide.config import ProperObjective
    from mydecide.scoring.packed import PackedBatch, packing_mode
    from mydecide.scoring.span_head import span_head_of
    from mydecide.scoring.span_layout import span_layout
    from mydecide.training.batches import epoch_units, make_batch
    from mydecide.training.model import build_module
    from mydecide.training.objectives import batch_loss, loss_for

    model = loaded(
        tiny_llama_dir if kind == "llama" else tiny_qwen_dir, shared_config(24, window_tokens=16, overlap_tokens=4)
    )
    packing = packing_mode(model.lm)
    assert packing == ("attention" if kind == "llama" else "hybrid")
    answer = [{"label": "PERSON", "start": 5, "end": 14}]
    rows = [
        {"id": "s", "task": "pii", "state": TEXT, "question": SPAN, "answer": answer},
        {"id": "n", "task": "refund", "state": TEXT, "question": NOUL, "answer": False},
        {"id": "c", "task": "team", "state": TEXT, "question": CHOICE, "answer": "support"},
        {"id": "o", "task": "refund", "state": "Another state.", "question": NOUL, "answer": True},
    ]
    records = [parse_record(r)[0] for r in rows]
    units = epoch_units(model.renderer, records, 0, 0, False)
    pad = model.tokenizer.pad_token_id
    tb = make_batch(units, pad, True, packing)
    assert isinstance(tb.batch, PackedBatch) and tb.spans is not None and tb.spans.packed_from is not None
    assert tb.batch.input_ids.shape[0] == 2  # two states, two rows: the span blocks in their state's row
    module = build_module(model.lm, model.renderer.label_ids).eval()
    with torch.no_grad():
        logits, reads = module(tb.batch, tb.spans)
        without = make_batch([u for u in units if u.record_index != 0], pad, True, packing)
        expected_logits = without.logits(module(without.batch))
    layout = span_layout(model.renderer, TEXT, records[0].question)
    grid = alone(model, layout)
    cells = [c for seq in layout.sequences for c in seq.cells(3)]
    np.testing.assert_allclose(reads.double().numpy(), grid[cells], atol=1e-5)
    got = tb.logits(logits)
    assert got.shape == expected_logits.shape
    torch.testing.assert_close(got, expected_logits, atol=1e-5, rtol=0)
    loss = batch_loss(module.train(), tb, loss_for(ProperObjective()), progress=0.0)
    loss.backward()
    assert float(span_head_of(model.lm).word.weight.grad.abs().max()) > 0


def saved_model_dir(model_dir: Path, out: Path, layout: str) -> Path:
    """A copy of a tiny model directory with a random span head and a render config, as ``mydecide merge`` writes
    them (span_head.safetensors, mydecide_render.json)."""
    from safetensors.torch import save_file

    from mydecide.modeling import load_model, save_render_config
    from mydecide.scoring.span_head import MERGED_FILE, span_head_of

    shutil.copytree(model_dir, out)
    head = span_head_of(with_head(load_model(str(model_dir), render=RenderConfig(), device="cpu")).lm)
    save_file({k: v.detach().contiguous() for k, v in head.state_dict().items()}, str(out / MERGED_FILE))
    render = RenderConfig(span={"read": "head", "layout": layout, "window_tokens": 16, "overlap_tokens": 4})
    save_render_config(out, render)
    return out


def test_a_model_saved_with_the_shared_layout_scores_with_it_in_evaluate_predict_and_serve(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from mydecide.cli import app
    from mydecide.modeling import load_model
    from mydecide.scoring.engine import score_questions
    from mydecide.scoring.span_layout import span_layout
    from mydecide.serving.app import create_app

    shared = saved_model_dir(tiny_llama_dir, tmp_path / "shared", "shared")
    model = load_model(str(shared), device="cpu")
    assert model.renderer.config.span.layout == "shared" and model.renderer.config.span.read == "head"
    question = parse_question(SPAN)
    expected = 1 / (1 + np.exp(-alone(model, span_layout(model.renderer, TEXT, question))))
    own = load_model(str(saved_model_dir(tiny_llama_dir, tmp_path / "own", "own")), device="cpu")
    (own_grid,) = score_questions(own, [(TEXT, question)])
    assert float(np.abs(1 / (1 + np.exp(-own_grid)) - expected).max()) > 1e-3  # the layouts read differently

    answer = [{"label": "PERSON", "start": 5, "end": 14}]
    rows = [{"id": "s", "task": "pii", "state": TEXT, "question": SPAN, "answer": answer}]
    rows.append({"id": "n", "task": "refund", "state": TEXT, "question": NOUL, "answer": False})
    data = tmp_path / "dev.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "eval"
    result = CliRunner().invoke(app, ["evaluate", "--model", str(shared), "--data", str(data), "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    (span_row,) = [p for p in predictions if "grid" in p]
    np.testing.assert_allclose(span_row["grid"], expected, atol=1e-5)

    request = {"state": TEXT, "questions": {"pii": SPAN, "refund": NOUL}}
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request))
    result = CliRunner().invoke(app, ["predict", "--model", str(shared), str(path)])
    assert result.exit_code == 0, result.output
    predicted = json.loads(result.stdout[result.stdout.index("{") :])["answers"]["pii"]
    assert predicted["noul"] == pytest.approx(float(expected.max()), abs=1e-5)
    with TestClient(create_app(model, model_name="tiny")) as client:
        response = client.post("/v1/systemone", json=request)
    assert response.status_code == 200, response.text
    assert response.json()["answers"]["pii"] == predicted


@pytest.mark.parametrize(
    ("span", "message"),
    [
        ({"layout": "shared", "read": "letters"}, "layout: shared is a layout of the span head's read"),
        ({"layout": "together"}, "prompt.span.layout: Input should be 'own' or 'shared'"),
    ],
)
def test_a_bad_layout_is_a_one_line_recipe_error(span: dict, message: str) -> None:
    from mydecide.config import TrainRecipe
    from mydecide.recipe_loading import load_recipe

    smoke = Path(__file__).resolve().parents[2] / "recipes" / "train" / "smoke.yaml"
    overrides = [
        f"prompt.span.{key}={json.dumps(value) if not isinstance(value, str) else value}" for key, value in span.items()
    ]
    with pytest.raises(UserError) as err:
        load_recipe(smoke, overrides, model=TrainRecipe)
    assert message in str(err.value) and "\n" not in str(err.value).strip(), str(err.value)
