"""`mydecide export-gguf` on a tiny Llama GGUF base with a letters-form LoRA adapter whose B matrices are non-zero.

The exported file is read back with gguf-py (the decision keys, the template, the copied tokenizer) and loaded
back with transformers' GGUF reader, which undoes llama.cpp's Q/K row layout: its weights must be the merged weights
(F32 exactly, F16 to its rounding). The ``systemone`` template is rendered with Python's Jinja (llama.cpp runs its own
engine, checked by bench/gguf_parity.py against a real llama-server) and must give the Renderer's text, and that
text tokenised whole must give the Renderer's segment-by-segment token ids, on 300 varied requests.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from mydecide.cli import app
from mydecide.errors import UserError
from mydecide.gguf_export import (
    EXPORT_KEY,
    check_whole_text_tokens,
    decision_temperatures,
    render_systemone,
    renderer_text,
    systemone_question,
    systemone_template,
)
from mydecide.prompt import RenderConfig
from tests.test_merging import save_random_adapter
from tests.test_modeling import write_tiny_gguf

LETTERS = RenderConfig(system_prompt="You route support tickets.", max_state_tokens=3000, option_form="letters")
LETTERS = LETTERS.model_copy(update={"score_form": "letters"})
TEMPERATURES = {
    "format": "mydecide.temperatures/1",
    "types": {"choice": 1.4, "noul": 0.8, "score": 1.25},
    "buckets": {"choice": {"2": 1.6}},
}


@pytest.fixture(scope="module")
def tiny_gguf(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tiny_llama_dir, tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf")


def make_adapter(base: Path, out: Path, render: RenderConfig) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(base.parent, gguf_file=base.name, dtype=torch.float32)
    return save_random_adapter(lm, out, str(base), render, ["q_proj", "k_proj", "v_proj", "down_proj"], seed=5)


@pytest.fixture(scope="module")
def adapter(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_adapter(tiny_gguf, tmp_path_factory.mktemp("adapter"), LETTERS)


@pytest.fixture(scope="module")
def temperatures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("calibrate") / "temperatures.json"
    path.write_text(json.dumps(TEMPERATURES))
    return path


@pytest.fixture(scope="module")
def loaded(tiny_gguf: Path, adapter: Path) -> Any:
    import torch

    from mydecide.modeling import load_model

    return load_model(str(tiny_gguf), adapter, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def merged(tiny_gguf: Path, adapter: Path) -> dict[str, np.ndarray]:
    import torch

    from mydecide.modeling import load_model

    lm = load_model(str(tiny_gguf), adapter, device="cpu", dtype=torch.float32).lm.merge_and_unload()
    return {name: t.detach().numpy().copy() for name, t in lm.state_dict().items()}


def export(adapter: Path, out: Path, *extra: str, temperatures: Path | None = None) -> Any:
    args = ["export-gguf", "--adapter", str(adapter), "--out", str(out), *extra]
    return CliRunner().invoke(app, args + (["-t", str(temperatures)] if temperatures else []))


def fields(path: Path) -> dict[str, Any]:
    import gguf

    return {name: field.contents() for name, field in gguf.GGUFReader(path).fields.items()}


def reloaded(path: Path) -> dict[str, np.ndarray]:
    import torch
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return {name: t.detach().numpy() for name, t in lm.state_dict().items()}


# ------------------------------------------------------------------------------------------------ the file


@pytest.fixture(scope="module")
def f32_file(adapter: Path, temperatures: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "model.f32.gguf"
    result = export(adapter, out, "--type", "f32", temperatures=temperatures)
    assert result.exit_code == 0, result.output
    assert "the systemone template renders mydecide's prompt and its tokens on 5 sample questions" in result.output
    return out


def test_the_metadata_carries_the_decision_type_template_temperatures_and_the_base_tokenizer(
    f32_file: Path, tiny_gguf: Path, loaded: Any, adapter: Path
) -> None:
    got, source = fields(f32_file), fields(tiny_gguf)
    assert got["llama.decision.type"] == "openjev"
    assert got["tokenizer.chat_template.systemone"] == systemone_template(loaded.renderer)
    temperatures = {k.removeprefix("llama.decision.temperature."): v for k, v in got.items() if ".temperature." in k}
    assert temperatures == pytest.approx({"choice": 1.4, "noul": 0.8, "score": 1.25, "choice.2": 1.6}, rel=1e-7)
    assert got["general.file_type"] == 0  # all F32
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template", "llama.block_count"):
        assert got[key] == source[key]
    record = json.loads(got[EXPORT_KEY])
    assert (record["format"], record["type"], record["adapter"]) == (1, "f32", str(adapter))
    assert record["decision_temperatures"] == {"choice": 1.4, "noul": 0.8, "score": 1.25, "choice.2": 1.6}


def test_f32_tensors_are_the_merged_weights_exactly(f32_file: Path, merged: dict[str, np.ndarray]) -> None:
    back = reloaded(f32_file)
    assert set(back) == set(merged)
    for name, weight in merged.items():
        np.testing.assert_array_equal(back[name], weight, err_msg=name)


def test_f16_tensors_are_the_merged_weights_rounded_to_f16_norms_stay_f32(
    adapter: Path, merged: dict[str, np.ndarray], tmp_path: Path
) -> None:
    import gguf

    out = tmp_path / "model.gguf"
    assert export(adapter, out).exit_code == 0  # f16 is the default type
    kinds = {t.name: t.tensor_type for t in gguf.GGUFReader(out).tensors}
    assert kinds["blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32
    assert kinds["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.F16
    back = reloaded(out)
    for name, weight in merged.items():
        want = weight if weight.ndim == 1 else weight.astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(back[name], want, err_msg=name)
    assert fields(out)["general.file_type"] == 1


def test_q8_0_quantizes_the_matrices_within_a_step_of_their_scale(
    adapter: Path, merged: dict[str, np.ndarray], tmp_path: Path
) -> None:
    import gguf

    out = tmp_path / "model.q8.gguf"
    assert export(adapter, out, "--type", "q8_0").exit_code == 0
    tensors = {t.name: t for t in gguf.GGUFReader(out).tensors}
    q = tensors["blk.1.ffn_down.weight"]
    assert q.tensor_type == gguf.GGMLQuantizationType.Q8_0
    values = gguf.quants.dequantize(q.data, q.tensor_type).reshape(merged["model.layers.1.mlp.down_proj.weight"].shape)
    weight = merged["model.layers.1.mlp.down_proj.weight"]
    step = np.abs(weight.reshape(-1, 32)).max(axis=1, keepdims=True) / 127  # one Q8_0 step per block of 32
    # half a step, and the step's own F16 rounding (2^-11 relative) times up to 127 steps
    assert np.all(np.abs(values.reshape(-1, 32) - weight.reshape(-1, 32)) <= step * (0.5 + 127 * 2**-11))
    assert np.abs(values - weight).max() > 0
    assert fields(out)["general.file_type"] == 7 and fields(out)["general.quantization_version"] == 2


def test_an_earlier_export_is_replaced_and_no_temporary_file_is_left(adapter: Path, tmp_path: Path) -> None:
    out = tmp_path / "model.gguf"
    assert export(adapter, out, "--type", "f32").exit_code == 0
    result = export(adapter, out)
    assert result.exit_code == 0, result.output
    assert json.loads(fields(out)[EXPORT_KEY])["type"] == "f16"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]


# ------------------------------------------------------------------------------------------------ the template

WORDS = ["billing", "engineering", "support", "refunds", "outage", "login", "naïve café", 'say "hi"', "a\\b", "x"]


def random_request(rng: random.Random) -> tuple[Any, dict[str, Any]]:
    kind = rng.choice(["text", "text", "object", "lines"])
    if kind == "text":
        state: Any = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) + rng.choice([".", "?", "!"])
    elif kind == "object":
        state = {
            "ticket": rng.choice(WORDS),
            "priority": rng.randint(-3, 3000),
            "vip": rng.choice([True, False, None]),
            "tags": rng.sample(WORDS, 3),
            "customer": {"name": "Zoë — 東京", "notes": "line one\nline\ttwo"},
            "empty": {},
        }
    else:
        state = [f"Agent: {rng.choice(WORDS)}" for _ in range(rng.randint(1, 4))]
    qtype = rng.choice(["choice", "noul", "score"])
    if qtype == "choice":
        k = rng.choice([2, 3, 5, 9, 26])
        ids = [f"{rng.choice(WORDS)} {i}" for i in range(k)]
        criteria: Any = ids if rng.random() < 0.4 else {i: rng.choice(["", rng.choice(WORDS)]) for i in ids}
    elif qtype == "noul":
        criteria = rng.choice([None, {"true": "It happened", "false": "It did not"}, {"true": "", "false": ""}])
    else:
        criteria = [f"level {rng.choice(WORDS)} {i}" for i in range(rng.randint(2, 10))]
    question = {"type": qtype, "instructions": f"Which {rng.choice(WORDS)} applies?", "criteria": criteria}
    return state, {k: v for k, v in question.items() if v is not None}


def test_the_template_renders_the_renderers_text_and_tokens_on_300_requests(loaded: Any) -> None:
    rng = random.Random(0)
    requests = [random_request(rng) for _ in range(300)]
    template = systemone_template(loaded.renderer)
    for state, question in requests[:50]:  # the text itself, byte for byte
        text = render_systemone(template, state, "q", systemone_question(question))
        assert text.encode() == renderer_text(loaded.renderer, state, question).encode()
    assert check_whole_text_tokens(loaded.renderer, template, requests) == 300


def test_the_rendered_prompt_reads_as_mydecide_shows_it(loaded: Any) -> None:
    template = systemone_template(loaded.renderer)
    question = {"type": "noul", "instructions": "Is it down?", "criteria": {"true": "Down", "false": ""}}
    text = render_systemone(template, {"a": [1, "é"]}, "q", question)
    assert text == (
        "<|im_start|>system\nYou route support tickets.<|im_end|>\n<|im_start|>user\nState:\n"
        '{\n  "a": [\n    1,\n    "é"\n  ]\n}\n\nQuestion: Is it down?\nAnswer yes or no.\nA. yes — Down\nB. no\n'
        "Answer with the letter only.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_more_than_26_options_are_refused_by_the_template(loaded: Any) -> None:
    from jinja2 import TemplateError

    question = {"type": "choice", "instructions": "Which?", "criteria": {f"o{i}": None for i in range(27)}}
    with pytest.raises(TemplateError, match=r"^this decision model reads at most 26 options \(A-Z\)$"):
        render_systemone(systemone_template(loaded.renderer), "s", "q", question)


def test_a_state_that_tokenises_otherwise_whole_is_refused(loaded: Any) -> None:
    """A control token's text in a state: mydecide encodes its characters, a whole-text tokenizer (llama.cpp's,
    which parses special tokens in the rendered prompt) the token itself."""
    template = systemone_template(loaded.renderer)
    question = {"type": "noul", "instructions": "Is it down?"}
    with pytest.raises(UserError, match=r"^question 'Is it down\?': this tokenizer splits the whole prompt into"):
        check_whole_text_tokens(loaded.renderer, template, [("closed <|im_end|> now", question)])


# ------------------------------------------------------------------------------------------------ refusals


def test_a_per_option_adapter_is_refused_with_what_to_do(tiny_gguf: Path, tmp_path: Path) -> None:
    per_option = make_adapter(tiny_gguf, tmp_path / "adapter", RenderConfig())
    result = export(per_option, tmp_path / "model.gguf")
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: {per_option}: trained with prompt.option_form=per_option prompt.score_form=per_option; llama.cpp's "
        "/v1/systemone reads one letter per option at the last token, the letters form only: train with "
        "prompt.option_form=letters prompt.score_form=letters"
    )
    assert not (tmp_path / "model.gguf").exists()


def test_a_span_head_adapter_is_refused(adapter: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(adapter, tmp_path / "span"))
    config = json.loads((copy / "adapter_config.json").read_text())
    (copy / "adapter_config.json").write_text(json.dumps({**config, "modules_to_save": ["span_head"]}))
    result = export(copy, tmp_path / "model.gguf")
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: {copy}: carries a span head (trained on span questions), which llama.cpp cannot read; train "
        "without span data (tasks=[...]) to export it"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            {"types": {"choice": 1.2, "set": 1.1}},
            "has a set temperature: llama.cpp's /v1/systemone has no set questions; calibrate on choice, noul and "
            "score questions only (the recipe's data)",
        ),
        (
            {"types": {"span": 1.1}},
            "has a span temperature: llama.cpp's /v1/systemone has no span questions; calibrate on choice, noul and "
            "score questions only (the recipe's data)",
        ),
        (
            {"types": {"choice": 1.4}, "buckets": {"choice": {"3-4": 1.2}}},
            "choice temperatures differ within llama.cpp's option-count bucket 3_5 (K = 3–5: 1.2, 1.4); llama.cpp "
            "has one per bucket 2, 3_5, 6_10, 11: calibrate without by_bucket=true",
        ),
    ],
)
def test_temperatures_llama_cpp_cannot_apply_are_refused(
    adapter: Path, tmp_path: Path, content: dict, message: str
) -> None:
    path = tmp_path / "temperatures.json"
    path.write_text(json.dumps(content))
    result = export(adapter, tmp_path / "model.gguf", temperatures=path)
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {path}: {message}"


def test_level_maps_are_refused_and_mappable_buckets_are_kept() -> None:
    from mydecide.calibration.temperatures import TemperatureTable

    with pytest.raises(UserError) as caught:
        decision_temperatures(TemperatureTable({"score": 1.2}, level_maps={5: object()}), Path("t.json"))  # type: ignore[dict-item]
    assert str(caught.value) == (
        "t.json: has score level maps (K = 5), which llama.cpp cannot apply (it divides by one temperature); "
        "calibrate with level_maps=false"
    )
    table = TemperatureTable({"choice": 1.5}, {"choice": {"2": 1.1, "9-16": 0.9, "17-26": 0.9}, "noul": {"2": 0.7}})
    with pytest.raises(UserError, match=r"bucket 6_10 \(K = 6–10: 0\.9, 1\.5\)"):
        decision_temperatures(table, Path("t.json"))
    table = TemperatureTable({"choice": 1.5}, {"choice": {"2": 1.1}, "noul": {"2": 0.7}})
    assert decision_temperatures(table, Path("t.json")) == {
        "choice": 1.5,
        "choice.2": 1.1,
        "noul": 1.0,
        "noul.2": 0.7,
        "score": 1.0,
    }


def test_outputs_export_gguf_did_not_write_are_refused(adapter: Path, tmp_path: Path) -> None:
    foreign = tmp_path / "notes.gguf"
    foreign.write_text("mine")
    link = tmp_path / "link.gguf"
    link.symlink_to(tmp_path / "elsewhere.gguf")
    cases = {
        foreign: f"{foreign}: exists and is not a GGUF written by export-gguf; choose another --out",
        link: f"{link}: is a symbolic link; an output is written as a plain file: remove it or choose another",
        tmp_path: f"{tmp_path}: is a directory; give the .gguf file to write (e.g. {tmp_path}/model.gguf)",
        adapter / "model.gguf": f"--out {adapter}/model.gguf: lies inside --adapter {adapter}, which export-gguf "
        "must not change",
    }
    for out, message in cases.items():
        result = export(adapter, out)
        assert result.exit_code == 2, out
        assert result.output.strip() == f"error: {message}"
    assert foreign.read_text() == "mine" and not (tmp_path / "elsewhere.gguf").exists()


def test_a_base_that_is_not_a_gguf_file_is_refused(adapter: Path, tiny_llama_dir: Path, tmp_path: Path) -> None:
    result = export(adapter, tmp_path / "model.gguf", "--model", str(tiny_llama_dir))
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: --model {tiny_llama_dir}: export-gguf exports from a base given as a GGUF file (smollm2-135m or a "
        ".gguf path), whose tokenizer and settings it copies; convert this base with llama.cpp's "
        "convert_hf_to_gguf.py and pass that file as --model"
    )
