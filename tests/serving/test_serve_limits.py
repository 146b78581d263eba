"""Request limits on every part of a request, checked before anything is tokenised, and hostile but well-formed
requests: each gets a 4xx naming the limit (or field) and the question, and never a 5xx.

"Quickly" is asserted as counted work, not wall-clock time: a refused request tokenises nothing (or, for the token
limits, only the prompt it refuses) and runs no forward pass (``work``)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mydecide.config import Limits
from mydecide.prompt import SpanWindows
from mydecide.serving.request import RequestError, parse_request

fastapi_testclient = pytest.importorskip("fastapi.testclient")
TestClient = fastapi_testclient.TestClient

URL = "/v1/systemone"
NOUL = {"type": "noul", "instructions": "Is a production system down?"}


@pytest.fixture(scope="module")
def model(tiny_llama_dir: Path):
    from mydecide.modeling import load_model

    return load_model(str(tiny_llama_dir), device="cpu")


@pytest.fixture(scope="module")
def client(model):
    from mydecide.serving.app import create_app

    with TestClient(create_app(model, model_name="tiny"), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def work(model, monkeypatch) -> Iterator[Counter]:
    """Counts what the server does for a request: "encode" calls of the renderer (every tokenisation of prompt text
    goes through ``Renderer._encode`` or ``encode_pieces``), "tokenizer" calls (whoever makes them) and "forward"
    passes of the model (calls of its input embedding)."""
    from mydecide.scoring.render import Renderer

    counts: Counter = Counter()

    def counted(name: str, method: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return method(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(Renderer, "_encode", counted("encode", Renderer._encode))
    monkeypatch.setattr(Renderer, "encode_pieces", counted("encode", Renderer.encode_pieces))
    tokenizer = type(model.tokenizer)
    monkeypatch.setattr(tokenizer, "__call__", counted("tokenizer", tokenizer.__call__))
    # every forward pass of the model, however the scorer calls it, runs the input embedding
    hook = model.lm.get_input_embeddings().register_forward_pre_hook(lambda *_: counts.update(["forward"]))
    yield counts
    hook.remove()


def post(client, body: Any) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(URL, content=raw, headers={"content-type": "application/json"})


def request(question: dict[str, Any], name: str = "q", state: Any = "The checkout fails.") -> dict[str, Any]:
    return {"state": state, "questions": {name: question}}


LIMIT_CASES: list[tuple[str, dict[str, Any], str]] = [
    (
        "instructions",
        request({"type": "noul", "instructions": "x" * 4001}),
        "question 'q': instructions are longer than the limit of 4000 characters",
    ),
    (
        "option description",
        request({"type": "choice", "instructions": "Which?", "criteria": {"a": "y" * 1001, "b": ""}}),
        "question 'q': option 'a' is longer than the limit of 1000 characters",
    ),
    (
        "option id",
        request({"type": "choice", "instructions": "Which?", "criteria": ["z" * 1001, "b"]}),
        "is longer than the limit of 1000 characters",
    ),
    (
        "score level",
        request({"type": "score", "instructions": "How?", "criteria": ["low", "h" * 1001]}),
        "question 'q': option '1' is longer than the limit of 1000 characters",
    ),
    (
        "noul text",
        request({"type": "noul", "instructions": "Up?", "criteria": {"true": "t" * 1001, "false": ""}}),
        "question 'q': option 'yes' is longer than the limit of 1000 characters",
    ),
    (
        "set label",
        request({"type": "set", "instructions": "Which?", "criteria": {"bug": "d" * 1001}}),
        "question 'q': option 'bug' is longer than the limit of 1000 characters",
    ),
    ("question name", request(NOUL, name="n" * 201), "name is longer than the limit of 200 characters"),
    ("model name", {"model": "m" * 201, **request(NOUL)}, "model is longer than the limit of 200 characters"),
    (
        "prompt text",
        {
            "state": "s",
            "questions": {
                f"q{i}": {"type": "set", "instructions": "i" * 4000, "criteria": {f"l{j}": "" for j in range(4)}}
                for i in range(9)
            },
        },
        "question 'q7': the request's prompts hold more than 128000 characters of question text",
    ),
    (
        "deep state",
        request(NOUL, state={"a": json.loads("[" * 400 + "]" * 400)}),
        "state is longer than the limit of 100000 characters",
    ),
]


@pytest.mark.parametrize(("case", "body", "message"), LIMIT_CASES, ids=[c[0] for c in LIMIT_CASES])
def test_every_part_of_a_request_has_a_limit_that_names_it(
    client, case: str, body: dict[str, Any], message: str
) -> None:
    with pytest.raises(RequestError, match="limit"):
        parse_request(body)
    r = post(client, body)
    assert r.status_code == 422, (case, r.text)
    assert message in r.json()["error"], (case, r.json())


def test_the_limits_are_the_serve_defaults_and_can_be_changed(client) -> None:
    body = request({"type": "noul", "instructions": "x" * 5000})
    parse_request(body, Limits(max_instructions_chars=5000))
    with pytest.raises(RequestError, match="limit of 4999 characters"):
        parse_request(body, Limits(max_instructions_chars=4999))


def test_a_300_kB_instruction_is_refused_before_anything_is_tokenised(client, work) -> None:
    body = json.dumps(request({"type": "noul", "instructions": "x" * 300_000})).encode()
    r = post(client, body)
    assert r.status_code == 422 and "limit of 4000 characters" in r.json()["error"]
    assert work["encode"] == 0 and work["forward"] == 0, work
    assert post(client, request(NOUL)).status_code == 200
    assert work["encode"] > 0 and work["forward"] > 0, work  # the counters do see a request that is scored


def test_the_token_limit_is_checked_on_the_rendered_prompts(model) -> None:
    from mydecide.serving.app import create_app

    long_state = "The checkout page returns an error for every customer since this morning. " * 40
    with TestClient(create_app(model, limits=Limits(max_input_tokens=300))) as c:
        r = post(c, request(NOUL, state=long_state))
        assert r.status_code == 422, r.text
        message = r.json()["error"]
        assert "over the limit of 300 input tokens" in message and "question 'q'" in message
        assert post(c, request(NOUL)).status_code == 200  # a small one still passes


def test_one_prompt_is_bounded_in_tokens(model, work) -> None:
    """One prompt is scored in one go (it cannot be sliced), so its length bounds how long it holds others back."""
    from mydecide.serving.app import create_app

    emoji = request({"type": "noul", "instructions": "😀" * 3000})  # 3,000 characters, four byte tokens each
    with TestClient(create_app(model)) as c:
        before = Counter(work)
        r = post(c, emoji)
    assert r.status_code == 422, r.text
    assert "over the limit of 8000 tokens in one prompt" in r.json()["error"] and "question 'q'" in r.json()["error"]
    assert work["forward"] == before["forward"], work  # refused after tokenising, before any forward pass


SPAN_TEXT = "The checkout page returns an error for every customer since this morning. "  # 12 words


def span_request(text: str, labels: int, state: Any = None) -> dict[str, Any]:
    question = {"type": "span", "instructions": "Which?", "criteria": {f"L{i}": "" for i in range(labels)}}
    if state is not None:
        question["over"] = "answer"
    return request(question, name="pii", state=text if state is None else {**state, "answer": text})


def test_span_questions_that_cannot_fit_are_refused_before_anything_is_tokenised(client, work) -> None:
    """79,950 characters, 12,792 words, read once per label: 3 labels need at least 38,376 tokens, over the 32,000
    input tokens, which is known without tokenising the text (a second or more of the scorer's time)."""
    r = post(client, span_request(SPAN_TEXT * 1066, labels=3))
    assert r.status_code == 422, r.text
    assert r.json()["error"].startswith(
        "the request's span questions hold at least 38376 tokens, over the limit of 32000 input tokens"
    ), r.json()
    assert "question 'pii' has 12792 words, read in 3 sequence(s) each" in r.json()["error"], r.json()
    assert work["tokenizer"] == work["encode"] == work["forward"] == 0, work
    assert post(client, span_request(SPAN_TEXT, labels=3)).status_code == 200
    assert work["tokenizer"] > 0 and work["forward"] > 0, work  # the counters do see a span request that is scored


SPAN_READS = [
    SpanWindows(window_tokens=16, overlap_tokens=4, read="letters"),
    SpanWindows(window_tokens=16, overlap_tokens=4, read="head"),
    SpanWindows(window_tokens=16, overlap_tokens=8, read="letters"),
    SpanWindows(read="head"),
    SpanWindows(window_tokens=16, overlap_tokens=4, read="head", layout="shared"),
]
SPAN_TEXTS = [
    SPAN_TEXT * 5,
    "a b c d e f g h i j k l m n o p",
    "😀 😀😀 李小龙 anna.berg@example.se\n\tdone. , ; !",
    "x" * 300 + " short " + "y" * 40,  # a word longer than a window keeps its last window's worth of tokens
]


@pytest.mark.parametrize("span", SPAN_READS, ids=lambda s: f"{s.read}-{s.layout}-{s.window_tokens}")
@pytest.mark.parametrize("text", SPAN_TEXTS, ids=range(len(SPAN_TEXTS)))
def test_the_span_floor_never_refuses_what_the_token_count_accepts(model, span: SpanWindows, text: str) -> None:
    """The floor is at most the exact count (the tokens of every sequence): with the limit at the exact count it
    passes, so it only ever refuses a request the exact check refuses too."""
    from mydecide.prompt import RenderConfig
    from mydecide.scoring.render import Renderer
    from mydecide.scoring.span_layout import span_layout
    from mydecide.serving.request import check_span_floor

    renderer = Renderer(model.tokenizer, RenderConfig(span=span))
    for body in (span_request(text, labels=3), span_request(text, labels=2, state={"request": "Mail Anna"})):
        parsed = parse_request(body)
        layout = span_layout(renderer, parsed.state, parsed.questions["pii"])
        exact = sum(len(s.ids) for s in layout.sequences)
        check_span_floor(parsed, span, Limits(max_input_tokens=exact))
        with pytest.raises(RequestError, match="at least"):  # and it is a floor: a limit under it refuses
            check_span_floor(parsed, span, Limits(max_input_tokens=len(text.split()) - 1))


def test_many_options_count_their_prompt_text_before_tokenising(client, work) -> None:
    """Each option costs its own line or, in the per-option form, its own continuation: 11 choices of 255 short
    options are refused on characters, in milliseconds, not after tokenising 100k tokens."""
    body = {
        "state": "s",
        "questions": {
            f"q{i}": {"type": "choice", "instructions": "x", "criteria": [f"o{j}" for j in range(255)]}
            for i in range(11)
        },
    }
    r = post(client, body)
    assert r.status_code == 422, r.text
    # refused on characters (letters form) or on the prompt count (per-option form): before tokenising, either way
    assert "characters of question text" in r.json()["error"] or "scored prompts" in r.json()["error"], r.text
    assert work["encode"] == 0 and work["forward"] == 0, work


HOSTILE: list[tuple[str, bytes, int, str]] = [
    (
        "number out of range",
        b'{"state": {"a": 1e999}, "questions": {"q": {"type": "noul", "instructions": "x"}}}',
        400,
        "out of range",
    ),
    (
        "integer of 5000 digits",
        b'{"state": {"a": ' + b"9" * 5000 + b'}, "questions": {"q": {"type": "noul", "instructions": "x"}}}',
        400,
        "digits",
    ),
    (
        "deep state",
        json.dumps(request(NOUL, state=[json.loads("[" * 900 + "]" * 900)] * 50)).encode(),
        422,
        "state given as a list must be a non-empty list of strings",
    ),
    (
        "many deep objects",
        json.dumps(request(NOUL, state={f"k{i}": json.loads("[" * 900 + "]" * 900) for i in range(50)})).encode(),
        422,
        "limit",
    ),
    ("question name a control char", json.dumps(request(NOUL, name="\x00")).encode(), 200, ""),
    (
        "criteria null",
        json.dumps(request({"type": "choice", "instructions": "x", "criteria": None})).encode(),
        422,
        "question 'q': choice criteria must be",
    ),
    (
        "instructions a list",
        json.dumps(request({"type": "noul", "instructions": ["x"]})).encode(),
        422,
        "question 'q': instructions",
    ),
    ("type a number", json.dumps(request({"type": 1, "instructions": "x"})).encode(), 422, "question 'q': type 1"),
    (
        "state a huge float",
        b'{"state": 1e308, "questions": {"q": {"type": "noul", "instructions": "x"}}}',
        422,
        "state must be",
    ),
    (
        "empty option id",
        json.dumps(request({"type": "choice", "instructions": "x", "criteria": {"": "a", "b": ""}})).encode(),
        422,
        "option ids must be non-empty",
    ),
    (  # the rule prepare applies to records (records.parse_question, shared): one level shown twice
        "score levels repeated",
        json.dumps(request({"type": "score", "instructions": "x", "criteria": ["bad", "Bad ", "good"]})).encode(),
        422,
        "question 'q': score levels 0 and 1 are the same text ('bad', 'Bad '); each level must read differently",
    ),
    (
        "255 options of 1000 characters",
        json.dumps(
            request({"type": "choice", "instructions": "x", "criteria": {f"o{i}": "d" * 990 for i in range(255)}})
        ).encode(),
        422,
        "characters of question text",
    ),
]


@pytest.mark.parametrize(("case", "raw", "status", "message"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_requests_get_a_4xx_naming_the_field_before_any_scoring(
    client, work, case: str, raw: bytes, status: int, message: str
) -> None:
    r = post(client, raw)
    assert r.status_code == status, (case, r.text[:300])
    if message:
        assert message in r.json()["error"], (case, r.json())
        assert "sys.set_int_max_str_digits" not in r.json()["error"]
    assert (work["forward"] == 0) == (status >= 400), (case, work)  # a refused one is refused before scoring


def test_serve_takes_any_limit_as_name_value(tiny_llama_dir: Path) -> None:
    from typer.testing import CliRunner

    from mydecide.cli import app
    from mydecide.commands.serve import limit_values

    assert limit_values([]) == {}
    given = limit_values(["max_input_tokens=500", "max-option-chars=20"])
    assert Limits(**given, max_questions=3) == Limits(max_input_tokens=500, max_option_chars=20, max_questions=3)
    for bad, message in [
        ("max_instruction_chars=9", "NAME one of max_questions"),
        ("max_questions=0", "≥ 1"),
        ("max_questions", "NAME=VALUE"),
    ]:
        with pytest.raises(ValueError, match=message):
            limit_values([bad])
    result = CliRunner().invoke(app, ["serve", "--model", str(tiny_llama_dir), "--limit", "max_tokens=9"])
    assert result.exit_code == 2 and "--limit 'max_tokens=9'" in result.output


def test_docs_list_every_limit_with_its_default() -> None:
    table = (Path(__file__).parents[2] / "docs" / "wire.md").read_text()
    limits = Limits()
    for name in Limits.model_fields:
        if name.endswith(("_choice_options", "_score_levels")):
            continue
        assert f"| `{name}` | {getattr(limits, name):,} |" in table, name
    assert f"| choice options | {limits.min_choice_options} to {limits.max_choice_options} |" in table
    assert f"| score levels | {limits.min_score_levels} to {limits.max_score_levels} |" in table


# ------------------------------------------------------------------------------------ what an error echoes back

BIG = "o" * 100_000
LONG_ECHOES: list[tuple[str, bytes, int, str]] = [
    ("top-level key", json.dumps({BIG: 1, **request(NOUL)}).encode(), 422, "unknown top-level key(s)"),
    ("question key", json.dumps(request({**NOUL, BIG: 1})).encode(), 422, "question 'q' has unknown key(s)"),
    ("type value", json.dumps(request({**NOUL, "type": BIG})).encode(), 422, "question 'q': type"),
    (
        "over value",
        json.dumps(request({"type": "span", "instructions": "Which?", "criteria": ["A"], "over": BIG})).encode(),
        422,
        "but the state is plain text (it has no named parts)",
    ),
    (
        "over value naming a missing part",
        json.dumps(
            request({"type": "span", "instructions": "Which?", "criteria": ["A"], "over": BIG}, state={"a": "x"})
        ).encode(),
        422,
        "is not in the state; its text parts are ['a']",
    ),
    ("duplicate key", b'{"' + BIG.encode() + b'": 1, "' + BIG.encode() + b'": 2}', 400, "duplicate key"),
]


@pytest.mark.parametrize(("case", "raw", "status", "message"), LONG_ECHOES, ids=[c[0] for c in LONG_ECHOES])
def test_an_error_quoting_a_100_kB_key_or_value_stays_short_and_names_the_problem(
    client, case: str, raw: bytes, status: int, message: str
) -> None:
    r = post(client, raw)
    assert r.status_code == status, (case, r.text[:300])
    assert len(r.content) < 2_000, (case, len(r.content))
    error = r.json()["error"]
    assert message in error, (case, error)


def test_a_validation_error_of_the_framework_is_short_too(model) -> None:
    """No route of the app declares a parameter FastAPI validates, but one that did would not echo its input."""
    from fastapi import Body

    from mydecide.serving.app import create_app

    app = create_app(model, warm_up=False)

    @app.post("/probe")
    async def probe(n: int = Body(embed=True)) -> dict[str, int]:
        return {"n": n}

    with TestClient(app) as c:
        r = c.post("/probe", json={"n": BIG})
    assert r.status_code == 422 and len(r.content) < 2_000, r.text[:300]
    assert r.json()["error"].startswith("invalid request: body.n: "), r.json()
