"""The span head (prompt.span.read: head): its layout, its reads, training it, saving, loading and merging it."""

from __future__ import annotations

import itertools
import json
import random
import shutil
from pathlib import Path

import pytest
from conftest import random_span_head, span_grid_by_hand
from helpers import SMOKE, TWO_CPU_PROCESSES, choice_row, crash_after, recipe_for, write_task

from mydecide.records import parse_question, parse_record

FIRST = ["Anna", "Omar", "Sara", "Nils"]
LAST = ["Berg", "Lind", "Holm", "Dahl"]
FILLER = ["the", "invoice", "was", "sent", "to", "support", "about", "an", "error", "on", "our", "page"]
PUNCTUATED = "Hi Anna Berg, call +33 83 79 52? or mail <bo@ek.se>. Thanks!!! ... see you"
"""A text whose words end in the punctuation a span trims (the head reads a word before it)."""
QUESTION = {
    "type": "span",
    "instructions": "Where is personal data?",
    "criteria": {"PERSON": "a person's name", "EMAIL": "an e-mail address"},
}


def span_row(i: int, rng: random.Random) -> dict:
    """A short text with maybe a name and maybe an e-mail address, and their character offsets."""
    words = [rng.choice(FILLER) for _ in range(rng.randint(4, 8))]
    pieces: list[tuple[str, str | None]] = [(w, None) for w in words]
    if rng.random() < 0.7:
        pieces.insert(rng.randint(0, len(pieces)), (f"{rng.choice(FIRST)} {rng.choice(LAST)}", "PERSON"))
    if rng.random() < 0.5:
        pieces.insert(rng.randint(0, len(pieces)), (f"{rng.choice(FIRST).lower()}@mail.se", "EMAIL"))
    text, answer = "", []
    for piece, label in pieces:
        start = len(text) + (1 if text else 0)
        text = f"{text} {piece}" if text else piece
        if label:
            answer.append({"label": label, "start": start, "end": start + len(piece)})
    return {"id": f"s{i}", "task": "pii", "state": text, "question": QUESTION, "answer": answer}


def write_data(out: Path, seed: int, n: int, n_train: int, every: int = 2) -> list[dict]:
    """``n`` rows, every ``every``-th a span row and the others choice rows: the first ``n_train`` in train.jsonl, the
    rest in dev.jsonl; returns the rows."""
    rng = random.Random(seed)
    rows = [(span_row if i % every == every - 1 else choice_row)(i, rng) for i in range(n)]
    out.mkdir()
    for name, part in (("train", rows[:n_train]), ("dev", rows[n_train:])):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return rows


def head_config(**span: object) -> object:
    from mydecide.prompt import RenderConfig

    return RenderConfig(span={"read": "head", "window_tokens": 16, "overlap_tokens": 4, **span})


def test_the_head_layout_is_one_sequence_per_window_reading_every_label_line(tiny_llama_dir: Path) -> None:
    from mydecide.modeling import load_model
    from mydecide.scoring.span_layout import span_layout

    model = load_model(str(tiny_llama_dir), render=head_config(), device="cpu")
    question = parse_question(QUESTION)
    text = " ".join(f"word{i}" for i in range(30))  # several windows of 16 tokens
    layout = span_layout(model.renderer, text, question)
    assert len(layout.sequences) > 1 and {s.label for s in layout.sequences} == {-1}
    decode = model.tokenizer.decode
    for seq in layout.sequences:
        assert len(seq.label_reads) == 2  # each label is read at its line's last token, in the order of their names
        lines = [decode(list(seq.ids[: r + 1])).rsplit("\n", 1)[1] for r in seq.label_reads]
        assert lines == ["EMAIL — an e-mail address", "PERSON — a person's name"]
        assert [decode([seq.ids[r + 1]])[0] for r in seq.label_reads] == ["\n", "\n"]
        assert seq.cells(2) == [w * 2 + j for w in seq.words for j in (1, 0)]
        assert seq.n_values == 2 * len(seq.reads)
    # every cell once: the letters layout reads the same words, one sequence per label
    owned = sorted(w for s in layout.sequences for w in s.words)
    assert owned == list(range(30))
    from mydecide.prompt import RenderConfig

    letters_config = RenderConfig(span={"read": "letters", "window_tokens": 16, "overlap_tokens": 4})
    letters = span_layout(load_model(str(tiny_llama_dir), render=letters_config, device="cpu").renderer, text, question)
    assert len(letters.sequences) == 2 * len(layout.sequences)


@pytest.mark.parametrize("punctuated", [False, True])
def test_a_label_is_read_at_its_lines_last_token_the_same_in_scoring_and_training(
    tiny_llama_dir: Path, punctuated: bool
) -> None:
    """The head reads each label at the last token of its line (the newline before it and the line encoded as one
    piece) and each word at the last token of what a span keeps of it. Training's module reads what scoring reads."""
    import numpy as np
    import torch

    from mydecide.modeling import load_model
    from mydecide.scoring.span_layout import head_prompt, label_order, span_head, span_layout
    from mydecide.scoring.span_reads import score_span_questions
    from mydecide.training.batches import epoch_units, make_batch
    from mydecide.training.model import build_module

    model = load_model(str(tiny_llama_dir), render=head_config(), device="cpu")
    head = random_span_head(model)
    row = span_row(3, random.Random(5))
    if punctuated:  # words that end in punctuation, so the reads are not at their last tokens
        email = PUNCTUATED.index("bo@ek.se")
        answer = [{"label": "PERSON", "start": 3, "end": 12}, {"label": "EMAIL", "start": email, "end": email + 8}]
        row = {**row, "state": PUNCTUATED, "answer": answer}
    record = parse_record(row)[0]
    layout = span_layout(model.renderer, record.state, record.question)
    assert any(seq.reads[-1] < len(seq.ids) - 1 for seq in layout.sequences) == punctuated
    intro, lines, outro = head_prompt(record.state, record.question, label_order(record.question))
    pieces = model.renderer.encode_pieces([intro, *("\n" + line for line in lines), outro])
    before = model.tokenizer(span_head(model.renderer), add_special_tokens=False)["input_ids"]
    before += [t for piece in pieces for t in piece]
    assert all(seq.ids[: len(before)] == tuple(before) for seq in layout.sequences)
    start = len(before) - sum(len(piece) for piece in pieces)  # the template's head
    ends = [start + end - 1 for end in itertools.accumulate(len(piece) for piece in pieces)][1:-1]  # the label lines'
    assert all(list(seq.label_reads) == ends for seq in layout.sequences)
    (grid,) = score_span_questions(model, [(record.state, record.question)])
    np.testing.assert_allclose(grid, span_grid_by_hand(model, head, layout), rtol=1e-5, atol=1e-5)
    (unit,) = epoch_units(model.renderer, [record], 0, 0, False)
    module = build_module(model.lm, model.renderer.label_ids).eval()
    with torch.no_grad():
        _, reads = module(None, make_batch([unit], model.tokenizer.pad_token_id, True).spans)
    cells = [c for seq in unit.sequences for c in seq.cells(2)]
    np.testing.assert_allclose(reads.double().numpy(), grid[cells], atol=1e-5)


@pytest.mark.parametrize("read", ["head", "letters"])
def test_permuting_a_span_questions_labels_moves_no_probability(
    tiny_llama_dir: Path, read: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Labels are shown and read in the order of their names: the order a client or a record lists them in changes
    no probability, in scoring and in the units training reads."""
    import numpy as np

    from mydecide.modeling import load_model
    from mydecide.scoring import span_layout
    from mydecide.scoring.span_reads import score_span_questions
    from mydecide.training.batches import span_unit

    criteria = {"PERSON": "a person's name", "EMAIL": "an e-mail address", "PHONE": "a phone number"}
    row = span_row(7, random.Random(3))
    text = row["state"]

    def question(names: tuple[str, ...]) -> dict:
        return {**QUESTION, "criteria": {name: criteria[name] for name in names}}

    def column_by_name() -> list[dict[str, np.ndarray]]:
        model = load_model(str(tiny_llama_dir), render=head_config(read=read), device="cpu")
        if read == "head":
            random_span_head(model)
        out = []
        for names in itertools.permutations(criteria):
            (grid,) = score_span_questions(model, [(text, parse_question(question(names)))])
            p = 1 / (1 + np.exp(-grid.reshape(-1, len(names))))
            out.append({name: p[:, j] for j, name in enumerate(names)})
        return out

    grids = column_by_name()
    worst = max(float(np.abs(g[n] - grids[0][n]).max()) for g in grids for n in criteria)
    assert worst <= 1e-6
    if read == "head":  # the test can fail: in the question's own order, a permutation does move probabilities
        with monkeypatch.context() as patched:
            patched.setattr(span_layout, "label_order", lambda question: list(range(question.k)))
            given = column_by_name()
        assert max(float(np.abs(g[n] - given[0][n]).max()) for g in given for n in criteria) > 1e-3

    model = load_model(str(tiny_llama_dir), render=head_config(read=read), device="cpu")
    units = []
    for names in itertools.permutations(criteria):
        record = parse_record({**row, "question": question(names)})[0]
        unit = span_unit(model.renderer, record, 0)
        units.append(unit)
        # each read's target is its own cell's: the sequences' cells in the record's label order
        cells = [c for seq in unit.sequences for c in seq.cells(3)]
        assert unit.target == tuple(record.target[c] for c in cells)
    assert all(u.sequences[0].ids == units[0].sequences[0].ids for u in units)
    assert all([s.ids for s in u.sequences] == [s.ids for s in units[0].sequences] for u in units)
    assert all(u.target == units[0].target for u in units)  # the same reads, the same targets, in the same order
    assert sum(units[0].target) > 0


def test_the_head_reads_a_word_at_the_end_of_what_a_span_keeps(tiny_llama_dir: Path) -> None:
    """The head's read encodes the punctuation a span trims from a word's end as its own piece and reads the word at
    the last token before it; the words still encode the whole text, and a word that is all punctuation is read at
    its last token. The letters read reads every word at its last token."""
    import numpy as np

    from mydecide.modeling import load_model
    from mydecide.prompt import RenderConfig
    from mydecide.scoring.span_layout import span_layout, word_tokens
    from mydecide.spans import trim_edges, words

    model = load_model(str(tiny_llama_dir), render=head_config(window_tokens=512), device="cpu")
    decode, offsets = model.tokenizer.decode, words(PUNCTUATED)
    tokens, tails = word_tokens(model.renderer, PUNCTUATED, offsets, core=True)
    assert decode([t for ids in tokens for t in ids]) == PUNCTUATED
    read_at = {}
    for i, ((a, b), ids, tail) in enumerate(zip(offsets, tokens, tails, strict=True)):
        kept = trim_edges(PUNCTUATED, a, b)[1]
        assert decode(ids[len(ids) - tail :]) == PUNCTUATED[kept:b] if tail else kept == b
        read_at[i] = decode(ids[: len(ids) - tail]).strip()
    assert [read_at[i] for i in range(4)] == ["Hi", "Anna", "Berg", "call"]  # `Berg,` without its comma
    assert {"52", "<bo@ek.se", "Thanks"} <= set(read_at.values())  # only the end is cut: `<` is before the read
    assert "..." in read_at.values()  # nothing would be left: the whole word, read at its last token
    assert sum(tail > 0 for tail in tails) == 4  # Berg, 52? <bo@ek.se>. Thanks!!!

    question = parse_question(QUESTION)
    (seq,) = span_layout(model.renderer, PUNCTUATED, question).sequences  # one window
    start = len(seq.ids) - sum(len(ids) for ids in tokens)
    ends = np.cumsum([len(ids) for ids in tokens]) + start - 1
    assert list(seq.reads) == [int(end) - tail for end, tail in zip(ends, tails, strict=True)]

    letters = RenderConfig(span={"read": "letters", "window_tokens": 512})
    renderer = load_model(str(tiny_llama_dir), render=letters, device="cpu").renderer
    for seq in span_layout(renderer, PUNCTUATED, question).sequences:  # one per label
        whole = word_tokens(renderer, PUNCTUATED, offsets)[0]
        start = len(seq.ids) - sum(len(ids) for ids in whole)
        assert list(seq.reads) == [int(end) for end in np.cumsum([len(ids) for ids in whole]) + start - 1]


def test_an_untrained_head_answers_its_bias_and_a_model_without_one_is_a_clear_error(tiny_llama_dir: Path) -> None:
    from mydecide.modeling import load_model
    from mydecide.scoring.span_head import attach_span_head
    from mydecide.scoring.span_reads import score_span_questions

    question = parse_question(QUESTION)
    text = "Call Anna Berg at anna@mail.se before Friday"
    model = load_model(str(tiny_llama_dir), render=head_config(), device="cpu")
    with pytest.raises(ValueError, match=r"has no span head.*prompt.span.read=letters"):
        score_span_questions(model, [(text, question)])
    head = attach_span_head(model.lm, bias=-1.5)
    assert float(head.label_bias.abs().max()) == 0.0 and head.label_bias.requires_grad  # u · k starts at zero
    (grid,) = score_span_questions(model, [(text, question)])
    assert grid.shape == (7 * 2,)
    assert grid == pytest.approx(-1.5)  # word weights start at zero: the bias everywhere


def test_the_loop_trains_a_span_head_that_saves_loads_and_merges(tiny_llama_dir: Path, tmp_path: Path) -> None:
    import numpy as np

    from mydecide.config import TrainRecipe
    from mydecide.merging import merge_adapter
    from mydecide.modeling import load_model
    from mydecide.recipe_loading import load_recipe
    from mydecide.scoring.span_layout import span_layout
    from mydecide.scoring.span_reads import score_span_questions
    from mydecide.training.loop import train

    data = tmp_path / "data"
    rows = write_data(data, 2, 96, 72)
    smoke = Path(__file__).resolve().parents[2] / "recipes" / "train" / "smoke.yaml"
    overrides = [
        f"model={tiny_llama_dir}",
        f"data={data}",
        f"out={tmp_path / 'run'}",
        "optim.max_steps=12",
        "eval_every=12",
        "prompt.span.window_tokens=16",
        "prompt.span.overlap_tokens=4",
    ]  # prompt.span.read: auto (the default) trains a head on data with span questions
    run = train(load_recipe(smoke, overrides, model=TrainRecipe))
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    dev = [r for r in metrics if r["kind"] == "dev"]
    # the head starts at the training split's share (the best constant), so a falling loss is learnt word by word
    assert dev[-1]["span_log_loss"] < dev[0]["span_log_loss"] - 0.05, dev
    saved = json.loads((run / "adapter" / "mydecide_render.json").read_text())
    assert saved["span"]["read"] == "head"
    assert "modules_to_save" in (run / "adapter" / "adapter_config.json").read_text()

    items = [(r["state"], parse_question(r["question"])) for r in rows[72:] if r["question"]["type"] == "span"][:6]
    adapter = load_model(str(tiny_llama_dir), run / "adapter", device="cpu")
    grids = score_span_questions(adapter, items)
    from mydecide.evaluation.run import run_evaluation
    from mydecide.record_files import load_records

    report = run_evaluation(adapter, load_records(data / "dev.jsonl"), permutations=1).report
    assert report["baselines"]["base_model"]["span_read"] == "letters"  # the base has no head: it reads the letters
    assert adapter.renderer.config.span.read == "head"  # and the model's own read is back after the comparison
    assert np.ptp(np.concatenate(grids)) > 0.1  # trained: the words no longer all read the bias
    out = tmp_path / "merged"
    report = merge_adapter(str(tiny_llama_dir), run / "adapter", out, items=[(s, q) for s, q in items[:2]])
    assert report.ok and (out / "span_head.safetensors").is_file()
    merged = load_model(str(out), device="cpu")
    for a, b in zip(grids, score_span_questions(merged, items), strict=True):
        assert b == pytest.approx(a, abs=1e-4)
    # the label-conditioned bias is trained, saved with the adapter and beside a merged model, and loaded back
    from safetensors.torch import load_file

    from mydecide.scoring.span_head import span_head_of

    weights = load_file(run / "adapter" / "adapter_model.safetensors")
    (u_key,) = [k for k in weights if k.endswith("span_head.label_bias")]
    u = weights[u_key]
    assert u.shape == (64,) and float(u.abs().max()) > 0  # trained from zero
    assert bool((span_head_of(adapter.lm).label_bias.detach() == u).all())
    assert bool((load_file(out / "span_head.safetensors")["label_bias"] == u).all())
    assert bool((span_head_of(merged.lm).label_bias.detach() == u).all())
    # a label never seen in training gets its own bias from its read: u · k + b0
    unseen = parse_question({**QUESTION, "criteria": {"PHONE": "a phone number", "PERSON": "a person's name"}})
    text = items[0][0]
    (grid,) = score_span_questions(adapter, [(text, unseen)])
    np.testing.assert_allclose(
        grid,
        span_grid_by_hand(adapter, span_head_of(adapter.lm), span_layout(adapter.renderer, text, unseen)),
        rtol=1e-5,
        atol=1e-5,
    )


def test_a_span_record_trains_its_grid_cell_by_cell_in_head_order(tiny_llama_dir: Path) -> None:
    from mydecide.modeling import load_model
    from mydecide.training.batches import span_unit

    model = load_model(str(tiny_llama_dir), render=head_config(), device="cpu")
    record = parse_record(span_row(1, random.Random(4)))[0]
    unit = span_unit(model.renderer, record, 0)
    cells = [c for s in unit.sequences for c in s.cells(2)]
    assert sorted(cells) == list(range(len(record.target)))
    assert unit.target == tuple(record.target[c] for c in cells)


def test_a_killed_head_run_resumes_to_the_same_head_and_adapter(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from safetensors.torch import load_file

    from mydecide.config import TrainRecipe
    from mydecide.recipe_loading import load_recipe
    from mydecide.training import loop

    data = tmp_path / "data"
    write_data(data, 6, 48, 40)
    smoke = Path(__file__).resolve().parents[2] / "recipes" / "train" / "smoke.yaml"

    def recipe(out: str) -> TrainRecipe:
        args = ["optim.max_steps=8", "save_every=4", "eval_every=100", "prompt.span.read=head"]
        paths = [f"model={tiny_llama_dir}", f"data={data}", f"out={tmp_path / out}"]
        return load_recipe(smoke, [*paths, *args], model=TrainRecipe)

    straight = loop.train(recipe("straight"))
    crash_after(monkeypatch, 6)
    with pytest.raises(KeyboardInterrupt):
        loop.train(recipe("killed"))
    monkeypatch.undo()
    resumed = loop.train(recipe("killed"), resume=True)
    a = load_file(straight / "last" / "adapter_model.safetensors")
    b = load_file(resumed / "last" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and any("span_head" in k for k in a)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)
    assert float(a[next(k for k in a if "span_head" in k and "word" in k)].abs().max()) > 0  # trained from zero


@pytest.mark.slow
def test_two_processes_train_a_head_through_batches_without_span_questions(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """DDP over gloo: a micro-batch with no span question leaves the head without a gradient in that process, which
    DDP accepts only with find_unused_parameters (the loop sets it for a head)."""
    import os
    import subprocess

    data = tmp_path / "data"
    write_data(data, 8, 40, 32, every=4)
    out = tmp_path / "run"
    cmd = [*TWO_CPU_PROCESSES, "-m", "mydecide.cli", "train", str(SMOKE), "--model", str(tiny_llama_dir)]
    cmd += ["--data", str(data), "--out", str(out), "optim.max_steps=4", "eval_every=100", "prompt.span.read=head"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 process(es)" in done.stderr
    from safetensors.torch import load_file

    weights = load_file(out / "last" / "adapter_model.safetensors")
    assert float(weights[next(k for k in weights if "span_head" in k and "word" in k)].abs().max()) > 0


def test_auto_reads_with_the_letters_where_there_is_no_head(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """Data without span questions trains no head; an adapter whose render config leaves read at auto reads with the
    letters."""
    from mydecide.modeling import load_model
    from mydecide.scoring.span_reads import score_span_questions
    from mydecide.training.loop import train

    run = train(recipe_for(tiny_llama_dir, write_task(tmp_path / "data", 16, 4), tmp_path / "run", "optim.max_steps=2"))
    saved = json.loads((run / "adapter" / "mydecide_render.json").read_text())
    assert saved["span"]["read"] == "letters"
    assert "span_head" not in (run / "adapter" / "adapter_config.json").read_text()
    bare = tmp_path / "bare"  # the adapter without its render config: the head read is asked for from outside
    shutil.copytree(run / "adapter", bare)
    (bare / "mydecide_render.json").unlink()
    items = [("Anna Berg wrote", parse_question(QUESTION))]
    with pytest.raises(ValueError, match="has no span head"):  # no untrained head that answers a constant
        score_span_questions(load_model(str(tiny_llama_dir), bare, render=head_config(), device="cpu"), items)
    del saved["span"]["read"]  # read: auto, the default
    (run / "adapter" / "mydecide_render.json").write_text(json.dumps(saved))
    model = load_model(str(tiny_llama_dir), run / "adapter", device="cpu")
    assert model.renderer.config.span.read == "letters"
    assert load_model(str(tiny_llama_dir), device="cpu").renderer.config.span.read == "letters"
