"""The scoring-engine seam (serving/engines.py) on the tiny models: the torch engine is the old forward path bit for
bit, on the rendered prompts as they are, and a fake engine that reads the same token ids by another route answers
every question type but spans as the default server does, through the HTTP app; span questions are refused by name,
and /health says what serves what. The vLLM engine (serving/vllm_engine.py) runs here against a stand-in ``vllm``
module: what it sends, what it reads back, and the answers that come out (real vLLM is not in the suite;
docs/serving.md)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mydecide.config import BatchOptions, Limits
from mydecide.errors import UserError
from mydecide.prompt import RenderConfig
from mydecide.scoring.forward import score_packed, score_prompts
from mydecide.scoring.plan import score_plans
from mydecide.scoring.render import Prompt
from mydecide.serving import engines
from mydecide.serving.batching import Scorer
from mydecide.serving.engines import TorchEngine, prompt_scorer
from mydecide.serving.request import RequestError, parse_request
from mydecide.serving.response import build_response, render_request
from mydecide.serving.vllm_engine import vllm_factory

fastapi_testclient = pytest.importorskip("fastapi.testclient")
TestClient = fastapi_testclient.TestClient

URL = "/v1/systemone"
STATE = "Checkout returns HTTP 500 for every customer since 09:10; the invoice was charged twice."
MANY = [f"option {i}" for i in range(40)]
QUESTIONS: dict[str, Any] = {
    "team": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "engineering", "support"]},
    "many": {"type": "choice", "instructions": "Which option fits?", "criteria": MANY},
    "outage": {"type": "noul", "instructions": "Is a production system down?"},
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["not urgent", "soon", "today", "now"]},
    "labels": {
        "type": "set",
        "instructions": "Which labels apply?",
        "criteria": {"bug": "A defect", "billing": "Money", "outage": "Down", "refund": "Money back", "ux": "Design"},
    },
}
LETTERS_QUESTIONS = {**QUESTIONS, "many": {**QUESTIONS["many"], "criteria": MANY[:30]}}  # K = 30: a second round
SPAN = {"type": "span", "instructions": "Which pieces of text are amounts?", "criteria": {"AMOUNT": "an amount"}}
LIMITS = Limits(max_prompts=512)


def temperature(kind: str, k: int) -> float:
    """T ≠ 1 per type, and per bucket for choice."""
    return {"choice": 2.0 if k <= 4 else 0.5, "noul": 1.7, "score": 0.6, "set": 1.3}.get(kind, 1.0)


class AloneEngine:
    """A stand-in for an engine that reads token ids: every prompt run alone as one whole sequence (no prefix
    shared, no padding, no packing), the full vocabulary's logits formed at the last position and its K shown label
    ids (the renderer's first K) read from them, put back in canonical order. Records every call's prompts."""

    name = "fake"
    spans = False

    def __init__(self, model: Any):
        self.model = model
        self.calls: list[list[Prompt]] = []

    def start(self) -> None:
        pass

    def label_logits(self, prompts: Sequence[Prompt]) -> list[np.ndarray]:
        import torch

        self.calls.append(list(prompts))
        labels = list(self.model.renderer.label_ids)
        out = []
        with torch.inference_mode():
            for p in prompts:
                ids = torch.tensor([list(p.prefix + p.suffix)], device=self.model.device)
                logits = self.model.lm(input_ids=ids).logits[0, -1]  # (V,)
                row = np.empty(p.k)
                row[list(p.order)] = logits[labels[: p.k]].double().cpu().numpy()
                out.append(row)
        return out


def load(path: Path, **render: Any) -> Any:
    from mydecide.modeling import load_model

    return load_model(str(path), render=RenderConfig(**render), device="cpu")


@pytest.fixture(scope="module")
def per_option(tiny_llama_dir: Path) -> Any:
    return load(tiny_llama_dir, option_form="per_option", score_form="per_option")


@pytest.fixture(scope="module")
def letters(tiny_llama_dir: Path) -> Any:
    return load(tiny_llama_dir, option_form="letters", score_form="letters")


@pytest.fixture(scope="module")
def thresholds(tiny_llama_dir: Path) -> Any:
    return load(tiny_llama_dir, option_form="per_option", score_form="thresholds")


@pytest.fixture(scope="module")
def binomial(tiny_llama_dir: Path) -> Any:
    return load(tiny_llama_dir, option_form="per_option", score_form="binomial")


@contextmanager
def serve(model: Any, fake: bool, temps: Any = None) -> Iterator[Any]:
    from mydecide.serving.app import create_app

    app = create_app(model, model_name="tiny", limits=LIMITS, temperature=temps, engine=AloneEngine if fake else None)
    with TestClient(app) as client:
        yield client


def post(client: Any, questions: dict[str, Any], state: Any = STATE) -> Any:
    body = {"state": state, "questions": questions}
    return client.post(URL, content=json.dumps(body), headers={"content-type": "application/json"})


def answers(client: Any, questions: dict[str, Any], state: Any = STATE) -> dict[str, Any]:
    r = post(client, questions, state)
    assert r.status_code == 200, r.text
    return dict(r.json()["answers"])


def probabilities(answer: dict[str, Any]) -> np.ndarray:
    if answer["type"] == "noul":
        return np.array([answer["noul"]])
    return np.array(list(answer["probabilities"].values()))


def assert_same(a: dict[str, Any], b: dict[str, Any], tol: float = 1e-5) -> None:
    assert list(a) == list(b)
    for name in a:
        x, y = a[name], b[name]
        assert set(x) == set(y) and x["type"] == y["type"], name
        assert probabilities(x) == pytest.approx(probabilities(y), abs=tol), name
        for key in ("choice", "selected"):
            assert x.get(key) == y.get(key), (name, key)
        for key in ("confidence", "score"):
            if key in x:
                assert x[key] == pytest.approx(y[key], abs=10 * tol), (name, key)


# ------------------------------------------------------------------------------- the torch engine: no change at all


@pytest.mark.parametrize("options", [BatchOptions(), BatchOptions(packing=False), BatchOptions.baseline()])
def test_the_torch_engine_gives_the_old_paths_numbers_bit_for_bit(letters: Any, options: BatchOptions) -> None:
    parsed = parse_request({"state": STATE, "questions": LETTERS_QUESTIONS}, LIMITS)
    scorer = Scorer(letters, options, temperature).start()
    try:
        served = scorer.answer(parsed, timeout=120)
    finally:
        scorer.stop()
    assert scorer.packed == (options.packing and options.shared_prefix)  # the tiny Llama packs

    # what Scorer._score_now called before the seam existed
    rendered = render_request(letters, parsed, shared_prefix=options.shared_prefix)
    if scorer.packed:
        score_plans([rendered.plan], lambda p: score_packed(letters, p, max_batch_tokens=options.max_batch_tokens))
    else:
        score_plans(
            [rendered.plan],
            lambda p: score_prompts(letters, p, batch_size=options.forward_batch, shared_prefix=options.shared_prefix),
        )
    assert served == build_response(rendered, temperature, scorer.model_name)  # exact floats


def model_inputs(model: Any, score: Any) -> tuple[list[list[Any]], Any]:
    """Every tensor the decoder was called with while ``score()`` ran (in call order), and what it returned."""
    import torch

    from mydecide.scoring.forward import decoder_of

    seen: list[list[Any]] = []

    def hook(_: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        given = [*args, *(kwargs[k] for k in sorted(kwargs))]
        seen.append([x.detach().clone() for x in given if isinstance(x, torch.Tensor)])

    handle = decoder_of(model.lm).register_forward_pre_hook(hook, with_kwargs=True)
    try:
        return seen, score()
    finally:
        handle.remove()


@pytest.mark.parametrize("options", [BatchOptions(), BatchOptions(packing=False), BatchOptions.baseline()])
def test_a_torch_engine_request_reaches_the_model_with_the_tokens_of_before(
    letters: Any, options: BatchOptions
) -> None:
    """The torch engine reads the rendered prompts as they are. Before, each went through the seam as token ids and
    came back as a prompt rebuilt in shown order, whose rows were then put in canonical order: the decoder gets the
    same tensors, and the rows are the same floats."""
    import torch

    from mydecide.scoring.forward import canonical_rows

    questions = {"team": QUESTIONS["team"], "labels": QUESTIONS["labels"], "many": LETTERS_QUESTIONS["many"]}
    prompts = render_request(letters, parse_request({"state": STATE, "questions": questions}, LIMITS)).prompts
    assert sorted({p.k for p in prompts}) == [2, 3, 15]  # yes/no reads, K = 3, a group of K = 30
    engine = TorchEngine(letters, options)
    engine.start()
    engine.label_logits(prompts)  # the prompt head's cache is filled on the first packed call
    now, rows = model_inputs(letters, lambda: engine.label_logits(prompts))

    def before() -> list[np.ndarray]:
        shown = [Prompt(p.prefix, p.suffix, tuple(range(p.k)), stem=p.stem) for p in prompts]
        if engine.packed:
            read = score_packed(letters, shown, max_batch_tokens=options.max_batch_tokens)
        else:
            read = score_prompts(letters, shown, batch_size=options.forward_batch, shared_prefix=options.shared_prefix)
        return canonical_rows(prompts, read)  # type: ignore[arg-type]  # a list of (K,) rows

    then, old_rows = model_inputs(letters, before)
    assert engine.packed == (options.packing and options.shared_prefix)
    assert now and len(now) == len(then)
    for a, b in zip(now, then, strict=True):
        assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert [len(row) for row in rows] == [p.k for p in prompts]
    assert all(row.dtype == np.float64 and np.array_equal(row, old) for row, old in zip(rows, old_rows, strict=True))


def test_prompt_scorer_refuses_an_engine_that_returns_the_wrong_rows(letters: Any) -> None:
    class Short(AloneEngine):
        def label_logits(self, prompts: Sequence[Prompt]) -> list[np.ndarray]:
            return [np.zeros(1) for _ in prompts]

    class Fewer(AloneEngine):
        def label_logits(self, prompts: Sequence[Prompt]) -> list[np.ndarray]:
            return []

    prompts = render_request(letters, parse_request({"state": STATE, "questions": {"q": QUESTIONS["team"]}})).prompts
    with pytest.raises(ValueError, match="returned 1 logits for 3 labels"):
        prompt_scorer(Short(letters))(prompts)
    with pytest.raises(ValueError, match="the fake engine returned 0 rows for 1 prompts"):
        prompt_scorer(Fewer(letters))(prompts)


# ------------------------------------------------------------------------------ a fake engine through the seam


def test_the_engine_gets_mydecides_prompts_round_by_round(letters: Any, per_option: Any) -> None:
    for model, name, rounds in ((letters, "many", [[15, 15], [2]]), (per_option, "team", [[2, 2, 2]])):
        questions = {name: (LETTERS_QUESTIONS if model is letters else QUESTIONS)[name]}
        parsed = parse_request({"state": STATE, "questions": questions}, LIMITS)
        engine = AloneEngine(model)
        scorer = Scorer(model, BatchOptions(), engine=engine).start()
        try:
            scorer.answer(parsed, timeout=120)
        finally:
            scorer.stop()
        assert [[p.k for p in call] for call in engine.calls] == rounds  # K = 30: groups, then leaders
        first = render_request(model, parsed).prompts  # the exact ids mydecide rendered, the state as their prefix
        assert [(p.prefix, p.suffix) for p in engine.calls[0]] == [(p.prefix, p.suffix) for p in first]
        assert scorer.stats.prompts == sum(len(r) for r in rounds)


@pytest.mark.parametrize("form", ["per_option", "letters", "thresholds", "binomial"])
def test_the_engine_answers_every_type_as_the_torch_server_does(form: str, request: pytest.FixtureRequest) -> None:
    model = request.getfixturevalue(form)  # thresholds: score questions as K − 1 yes/no reads; binomial: as one
    questions = LETTERS_QUESTIONS if form == "letters" else QUESTIONS  # K = 3 and 40 / 30, noul, score, 5 labels
    for temps in (None, temperature):
        with serve(model, fake=False, temps=temps) as torch_client, serve(model, fake=True, temps=temps) as fake:
            assert_same(answers(fake, questions), answers(torch_client, questions))


def test_temperatures_per_type_and_bucket_apply_to_the_engines_rows(per_option: Any) -> None:
    with serve(per_option, fake=True) as plain, serve(per_option, fake=True, temps=temperature) as tempered:
        cold, warm = answers(plain, QUESTIONS), answers(tempered, QUESTIONS)
    for name, question in QUESTIONS.items():
        t = temperature(question["type"], len(question.get("criteria") or [0, 0]))
        p, q = probabilities(cold[name]), probabilities(warm[name])
        if question["type"] in ("noul", "set"):  # sigmoid(z / T) of z = logit(p)
            want = 1 / (1 + np.exp(-np.log(p / (1 - p)) / t))
        else:  # softmax(log p / T)
            z = np.log(p) / t
            want = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        assert q == pytest.approx(want, abs=1e-9), name
        assert np.abs(q - p).max() > 1e-6, name  # T ≠ 1 changed something
    assert warm["team"]["confidence"] == pytest.approx((3 * probabilities(warm["team"]).max() - 1) / 2, abs=1e-12)


def test_permuting_options_permutes_the_engines_probabilities(per_option: Any) -> None:
    rng = np.random.default_rng(0)
    questions = {
        "team": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "eng", "support", "sales"]},
        "labels": QUESTIONS["labels"],
    }
    with serve(per_option, fake=True) as fake:
        base = answers(fake, questions)
        for _ in range(2):
            shuffled = {}
            for name, q in questions.items():
                criteria = q["criteria"]
                keys = [list(criteria)[i] for i in rng.permutation(len(criteria))]
                shuffled[name] = {
                    **q,
                    "criteria": {k: criteria[k] for k in keys} if isinstance(criteria, dict) else keys,
                }
            got = answers(fake, shuffled)
            for name in questions:
                for option, p in got[name]["probabilities"].items():
                    assert p == pytest.approx(base[name]["probabilities"][option], abs=1e-6), (name, option)


def test_span_questions_are_refused_by_name_and_health_says_what_serves_each_type(per_option: Any) -> None:
    questions = {"amounts": SPAN, "outage": QUESTIONS["outage"]}
    with serve(per_option, fake=True) as fake, serve(per_option, fake=False) as torch_client:
        refused = post(fake, questions)
        assert refused.status_code == 422
        error = refused.json()["error"]
        assert "question 'amounts'" in error and "span questions are not served by the fake engine" in error
        assert post(torch_client, questions).status_code == 200  # the torch path reads spans
        assert answers(fake, {"outage": QUESTIONS["outage"]})  # the rest of the server is untouched
        health = fake.get("/health").json()
        assert health["engine"] == "fake"
        assert {t: v["path"] for t, v in health["question_types"].items()} == {
            "choice": "engine",
            "noul": "engine",
            "score": "engine",
            "set": "engine",
            "span": "refused",
        }
        assert health["question_types"]["choice"]["form"] == "per_option"
        torch_health = torch_client.get("/health").json()
        assert torch_health["engine"] == "torch"
        assert {v["path"] for v in torch_health["question_types"].values()} == {"torch"}

    scorer = Scorer(per_option, engine=AloneEngine(per_option)).start()  # a caller past the app is refused too
    try:
        with pytest.raises(RequestError, match="question 'amounts': span questions"):
            scorer.answer(parse_request({"state": STATE, "questions": questions}), timeout=60)
    finally:
        scorer.stop()


# ----------------------------------------------------------------------------------------------- mydecide serve


def test_serve_engine_vllm_fails_at_startup_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from mydecide.cli import app

    find_spec = importlib.util.find_spec

    def fake_find_spec(name: str, *args: Any) -> Any:
        return None if name == "vllm" else find_spec(name, *args)

    monkeypatch.setattr(engines.importlib.util, "find_spec", fake_find_spec)
    missing = CliRunner().invoke(app, ["serve", "--engine", "vllm"])
    assert missing.exit_code == 2
    assert missing.output.strip() == "error: --engine vllm needs vLLM, which is not installed: pip install -e .[vllm]"
    also = CliRunner().invoke(app, ["serve", "engine=vllm"])  # the recipe key, the same line
    assert also.exit_code == 2 and also.output.strip() == missing.output.strip()
    bad = CliRunner().invoke(app, ["serve", "--engine", "tpu"])
    assert bad.exit_code == 2 and "engine" in bad.output and "'torch' or 'vllm'" in bad.output


# --------------------------------------------------------------------- the vLLM engine, against a stand-in vllm module


class FakeVllm:
    """A stand-in for the ``vllm`` module: ``LLM`` answers ``generate`` from the tiny model's full-vocabulary logits at
    the last position (raw logits, as ``logprobs_mode="raw_logits"`` gives) and records what it was asked."""

    def __init__(self) -> None:
        self.init: dict[str, Any] = {}
        self.params: list[Any] = []
        self.prompts: list[Any] = []
        self.loras: list[Any] = []  # each generate call's lora_request
        fake = self

        class SamplingParams:
            def __init__(self, **kwargs: Any) -> None:
                self.__dict__.update(kwargs)

        class TokensPrompt(dict):  # vllm.inputs.TokensPrompt is a TypedDict
            pass

        class LLM:
            def __init__(self, **kwargs: Any) -> None:
                from transformers import AutoModelForCausalLM

                fake.init = kwargs
                self.dtype = getattr(torch, kwargs["dtype"])
                self.lm = AutoModelForCausalLM.from_pretrained(kwargs["model"], dtype=self.dtype)
                self.loras: dict[str, Any] = {}

            def with_lora(self, request: Any) -> Any:
                """The base with the request's LoRA, loaded as vLLM would: a plain LoRA only, else refused."""
                if request is None:
                    return self.lm
                assert fake.init.get("enable_lora") and fake.init["max_lora_rank"] in (1, 8, 16, 32, 64)
                if request.lora_path not in self.loras:
                    from peft import PeftModel
                    from transformers import AutoModelForCausalLM

                    config = json.loads((Path(request.lora_path) / "adapter_config.json").read_text())
                    if config.get("modules_to_save"):  # vLLM's peft_helper refuses them
                        raise ValueError("vLLM only supports modules_to_save being None")
                    base = AutoModelForCausalLM.from_pretrained(fake.init["model"], dtype=self.dtype)
                    self.loras[request.lora_path] = PeftModel.from_pretrained(base, request.lora_path)
                return self.loras[request.lora_path]

            def generate(
                self, prompts: list[Any], params: list[Any], use_tqdm: bool = True, lora_request: Any = None
            ) -> list[Any]:
                from types import SimpleNamespace as NS

                fake.prompts += prompts
                fake.params += params
                fake.loras.append(lora_request)
                lm = self.with_lora(lora_request)
                out = []
                with torch.inference_mode():
                    for prompt, p in zip(prompts, params, strict=True):
                        z = lm(input_ids=torch.tensor([prompt["prompt_token_ids"]])).logits[0, -1]
                        first = {t: NS(logprob=float(z[t])) for t in p.logprob_token_ids}
                        out.append(NS(outputs=[NS(logprobs=[first])]))
                return out

        class LoRARequest:
            def __init__(self, lora_name: str, lora_int_id: int, lora_path: str) -> None:
                self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path

        import torch

        self.module = type(sys)("vllm")
        self.module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)  # find_spec reads it
        self.module.LLM, self.module.SamplingParams = LLM, SamplingParams  # type: ignore[attr-defined]
        self.inputs = type(sys)("vllm.inputs")
        self.inputs.TokensPrompt = TokensPrompt  # type: ignore[attr-defined]
        self.lora = type(sys)("vllm.lora")
        self.lora_request = type(sys)("vllm.lora.request")
        self.lora_request.LoRARequest = LoRARequest  # type: ignore[attr-defined]


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> FakeVllm:
    fake = FakeVllm()
    monkeypatch.setitem(sys.modules, "vllm", fake.module)
    monkeypatch.setitem(sys.modules, "vllm.inputs", fake.inputs)
    monkeypatch.setitem(sys.modules, "vllm.lora", fake.lora)
    monkeypatch.setitem(sys.modules, "vllm.lora.request", fake.lora_request)
    return fake


def test_the_vllm_engine_sends_mydecides_reads_and_answers_as_torch(
    letters: Any, tiny_llama_dir: Path, fake_vllm: FakeVllm
) -> None:
    from mydecide.serving.app import create_app

    build = vllm_factory(str(tiny_llama_dir), None, max_model_len=4096)
    assert build is not None
    with TestClient(create_app(letters, model_name="tiny", limits=LIMITS, engine=build)) as client:
        got = answers(client, LETTERS_QUESTIONS)
        assert client.get("/health").json()["question_types"]["span"]["path"] == "refused"
        assert post(client, {"amounts": SPAN}).status_code == 422
    with serve(letters, fake=False) as torch_client:
        assert_same(got, answers(torch_client, LETTERS_QUESTIONS))
    assert fake_vllm.init == {
        "model": str(tiny_llama_dir),
        "dtype": "float32",
        "max_model_len": 4096,
        "skip_tokenizer_init": True,
        "logprobs_mode": "raw_logits",
        "enable_prefix_caching": True,
        "seed": 0,
    }
    labels = list(letters.renderer.label_ids)
    assert all(p.max_tokens == 1 and p.temperature == 0.0 for p in fake_vllm.params)
    assert all(p.logprob_token_ids == labels[: len(p.logprob_token_ids)] for p in fake_vllm.params)
    assert {len(p.logprob_token_ids) for p in fake_vllm.params} >= {2, 3, 15}  # yes/no, K = 3, a group of K = 30
    rendered = render_request(letters, parse_request({"state": STATE, "questions": LETTERS_QUESTIONS}, LIMITS))
    sent = {tuple(p["prompt_token_ids"]) for p in fake_vllm.prompts}
    assert {p.prefix + p.suffix for p in rendered.prompts} <= sent  # mydecide's ids, as they are


@pytest.fixture(scope="module")
def lora_adapter(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter as training saves one: B ≠ 0 (it changes the answers), a span head in ``modules_to_save``,
    the render config beside it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from mydecide.adapters import weights_fingerprint
    from mydecide.modeling import save_render_config
    from mydecide.scoring.span_head import HEAD_NAME, attach_span_head
    from mydecide.training.model_card import record_base_model

    out = tmp_path_factory.mktemp("lora")
    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    fingerprint = weights_fingerprint(base)
    attach_span_head(base)
    config = LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        target_modules=r".*\.(q_proj|v_proj|down_proj)$",
        modules_to_save=[HEAD_NAME],
    )
    peft_model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():  # A and B from their own generator: the same adapter whatever ran before
        for name, param in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    peft_model.save_pretrained(out)
    save_render_config(out, RenderConfig(option_form="per_option", score_form="per_option"))
    record_base_model(out, str(tiny_llama_dir), fingerprint)
    return out


def test_an_adapter_is_served_as_a_per_request_lora_with_the_torch_servers_answers(
    tiny_llama_dir: Path, lora_adapter: Path, per_option: Any, fake_vllm: FakeVllm
) -> None:
    from mydecide.modeling import load_model
    from mydecide.serving.app import create_app

    tuned = load_model(str(tiny_llama_dir), lora_adapter, device="cpu")
    build = vllm_factory(str(tiny_llama_dir), lora_adapter, max_model_len=4096)
    assert build is not None
    temps = temperature
    with TestClient(create_app(tuned, model_name="tiny", limits=LIMITS, temperature=temps, engine=build)) as client:
        got = answers(client, QUESTIONS)
        health = client.get("/health").json()
        span = post(client, {"amounts": SPAN})
        named = client.post(URL, json={"model": "tiny", "state": STATE, "questions": {"o": QUESTIONS["outage"]}})
        unknown = client.post(URL, json={"model": "other-adapter", "state": STATE, "questions": QUESTIONS})
    with serve(tuned, fake=False, temps=temps) as torch_client:
        assert_same(got, answers(torch_client, QUESTIONS))
    with serve(per_option, fake=False, temps=temps) as base_client:  # the LoRA changes the answers
        base = answers(base_client, QUESTIONS)
    effect = max(np.abs(probabilities(got[n]) - probabilities(base[n])).max() for n in QUESTIONS)
    assert effect > 1e-3, effect  # a hundred times the tolerance above: the LoRA is applied
    assert fake_vllm.init["enable_lora"] and fake_vllm.init["max_lora_rank"] == 8 and fake_vllm.init["max_loras"] == 1
    assert fake_vllm.loras and all(r is not None and r.lora_int_id == 1 for r in fake_vllm.loras)  # every read
    copy = Path(fake_vllm.loras[0].lora_path)
    assert json.loads((copy / "adapter_config.json").read_text())["modules_to_save"] is None
    assert (copy / "span_head.safetensors").is_file()
    assert health["question_types"]["span"]["path"] == "refused" and span.status_code == 422
    assert named.status_code == 200 and named.json()["model"] == "tiny"
    assert unknown.status_code == 404
    assert unknown.json()["error"] == (
        "model 'other-adapter' is not served here; this server serves 'tiny' (serve --name sets it)"
    )


def test_the_vllm_engine_refuses_what_it_cannot_serve_at_startup(
    tmp_path: Path, tiny_llama_dir: Path, tiny_qwen_dir: Path, lora_adapter: Path, fake_vllm: FakeVllm
) -> None:
    import shutil

    with pytest.raises(UserError, match="needs a local model directory"):
        vllm_factory("some/hub-name", None)
    with pytest.raises(UserError, match=r"linear-attention \(Gated DeltaNet\) layers.*`mydecide merge`"):
        vllm_factory(str(tiny_qwen_dir), lora_adapter)
    dora = tmp_path / "dora"
    shutil.copytree(lora_adapter, dora)
    config = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(UserError, match=r"adapter_config.json: vLLM's LoRA cannot apply DoRA; serve a merged model"):
        vllm_factory(str(tiny_llama_dir), dora)
    with pytest.raises(FileNotFoundError, match="not a LoRA adapter directory"):
        vllm_factory(str(tiny_llama_dir), tmp_path / "missing")
    assert fake_vllm.init == {}  # no engine was started


def test_export_vllm_writes_a_plain_lora_and_replaces_only_its_own_export(tmp_path: Path, lora_adapter: Path) -> None:
    from safetensors import safe_open
    from typer.testing import CliRunner

    from mydecide.cli import app

    temps = tmp_path / "t.json"
    temps.write_text(json.dumps({"types": {"choice": {"temperature": 1.5}}}))
    out = tmp_path / "export"
    command = ["export-vllm", "--adapter", str(lora_adapter), "--out", str(out), "-t", str(temps)]
    run = CliRunner().invoke(app, command)
    assert run.exit_code == 0, run.output
    assert "LoRA tensors of rank 4, the span head" in run.output and "--max-lora-rank 8" in run.output
    assert (out / "temperatures.json").read_text() == temps.read_text()
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["modules_to_save"] is None and config["r"] == 4
    with (
        safe_open(str(out / "adapter_model.safetensors"), "pt") as w,
        safe_open(str(lora_adapter / "adapter_model.safetensors"), "pt") as original,
    ):
        assert set(w.keys()) == {k for k in original.keys() if ".lora_" in k}  # noqa: SIM118
        head = {k.split(".span_head.")[1] for k in original.keys() if ".span_head." in k}  # noqa: SIM118
    with safe_open(str(out / "span_head.safetensors"), "pt") as h:
        assert set(h.keys()) == head
    assert (out / "mydecide_render.json").read_text() == (lora_adapter / "mydecide_render.json").read_text()

    again = CliRunner().invoke(app, ["export-vllm", "-a", str(lora_adapter), "-o", str(out)])
    assert again.exit_code == 2 and "holds an earlier export; pass --overwrite" in again.output
    replaced = CliRunner().invoke(app, ["export-vllm", "-a", str(lora_adapter), "-o", str(out), "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    foreign = CliRunner().invoke(app, ["export-vllm", "-a", str(lora_adapter), "-o", str(mine)])
    assert foreign.exit_code == 2 and "notes.txt" in foreign.output and (mine / "notes.txt").read_text() == "keep"
    other = tmp_path / "other_adapter"  # another adapter, not an export: refused even with --overwrite (issue 64)
    shutil.copytree(lora_adapter, other)
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    taken = CliRunner().invoke(app, ["export-vllm", "-a", str(lora_adapter), "-o", str(other), "--overwrite"])
    assert taken.exit_code == 2 and "but no mydecide_export.json of an earlier export" in taken.output
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before
    inside = CliRunner().invoke(app, ["export-vllm", "-a", str(lora_adapter), "-o", str(lora_adapter / "v")])
    assert inside.exit_code == 2 and "must not change" in inside.output
    assert not (lora_adapter / "v").exists()


def test_a_full_disk_during_export_vllm_is_one_line_and_leaves_nothing(
    tmp_path: Path, lora_adapter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors import SafetensorError
    from typer.testing import CliRunner

    import mydecide.serving.vllm_engine as vllm_engine
    from mydecide.cli import app

    def full(adapter: Path, stage: Path) -> dict:
        (stage / "adapter_model.safetensors").write_bytes(b"half")
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No" })')

    monkeypatch.setattr(vllm_engine, "write_vllm_lora", full)
    out = tmp_path / "export"
    result = CliRunner().invoke(app, ["export-vllm", "-a", str(lora_adapter), "-o", str(out)])
    assert result.exit_code == 2 and result.output.strip() == f"error: {out}: No space left on device"
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no staging directory, no lock file
