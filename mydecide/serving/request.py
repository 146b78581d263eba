"""Jev ``/v1/systemone`` requests (docs/wire.md): a body decoded and validated, shared by ``predict`` and ``serve``.

``decode_body`` reads a body as strict JSON (UTF-8 only, no repeated key, no NaN or Infinity, bounded numbers and
nesting) and ``parse_request`` checks it against the wire format and the limits that need no tokenizer (names,
state, questions, options, prompt count and characters); both raise :class:`RequestError`, which names the question
and the rule and is cut to :data:`MAX_ERROR_CHARS`. :func:`check_span_floor` refuses span questions that cannot fit
before anything is tokenised, and :func:`check_span_limits` counts their tokenised sequences; the prompts' token
limits are checked where they are tokenised (``serving.response.render_request``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mydecide.config import Limits
from mydecide.errors import UserError
from mydecide.jsonl import DuplicateKeyError, unique_keys
from mydecide.records import Question, RecordError, parse_question
from mydecide.scoring.plan import prompt_count
from mydecide.spans import state_part, words

if TYPE_CHECKING:
    from mydecide.prompt import SpanWindows

MAX_ERROR_CHARS = 300
"""The longest error message a client gets: a message quoting a 100 kB key or value is cut (:func:`shorten`)."""


def shorten(message: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``message`` cut in the middle to at most ``limit`` characters.

    A message names what is wrong at its start (the question, the field) and the rule at its end, with the client's
    own text quoted in between; cutting the middle keeps both ends, and the marker says how much was left out.
    """
    if len(message) <= limit:
        return message
    marker_chars = len(" …[ characters cut]… ") + len(str(len(message)))
    tail = limit // 4
    head = limit - tail - marker_chars
    return f"{message[:head]} …[{len(message) - head - tail} characters cut]… {message[-tail:]}"


class RequestError(UserError):
    """A malformed request; the message names the question (when there is one) and the rule, cut to
    :data:`MAX_ERROR_CHARS` (``predict`` prints it and ``serve`` answers it: neither echoes a 100 kB key)."""

    def __init__(self, message: str):
        super().__init__(shorten(message))


@dataclass(frozen=True)
class Request:
    model: str
    state: Any
    questions: dict[str, Question]


def state_size(state: Any, stop: int | None = None) -> int:
    """About how many characters the model reads for ``state`` (``prompting.render_state``: a string as it is, a
    list of strings one per line, a JSON object as indented JSON), counted without building the text, where deep
    nesting costs two spaces per level on every line; counting stops once past ``stop``."""
    if isinstance(state, str):
        return len(state)
    total = 0
    stack: list[tuple[Any, int]] = [(state, 0)]
    while stack and (stop is None or total <= stop):
        node, depth = stack.pop()
        if isinstance(node, dict):
            total += 2 * depth + 3  # the braces, the closing line's indent and a newline
            for key, value in node.items():
                total += 2 * depth + len(key) + 7  # indent, the quoted key, ": " and ",\n"
                stack.append((value, depth + 1))
        elif isinstance(node, list):
            total += 2 * depth + 3
            for value in node:
                total += 2 * depth + 4
                stack.append((value, depth + 1))
        elif isinstance(node, str):
            total += len(node) + 2
        else:
            total += len(repr(node))
    return total


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


MAX_NUMBER_DIGITS = 100


def _finite_float(text: str) -> float:
    value = float(text)
    if len(text) > MAX_NUMBER_DIGITS or value in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text[:30]}{'…' if len(text) > 30 else ''} is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text) > MAX_NUMBER_DIGITS:
        raise ValueError(f"a number has {len(text)} digits, more than {MAX_NUMBER_DIGITS}")
    return int(text)


def utf8_text(raw: bytes) -> str:
    """A body's bytes as text: UTF-8 and nothing else, without a byte order mark.

    ``json.loads`` of bytes would guess: it reads UTF-16 and UTF-32 (with or without a byte order mark), skips a
    UTF-8 one and lets encoded lone surrogates through. The wire format is plain UTF-8, so each of those is refused
    here with what was sent, before any JSON is parsed.
    """
    if raw.startswith(b"\xef\xbb\xbf"):
        raise RequestError("invalid JSON: the body starts with a UTF-8 byte order mark; send UTF-8 without one")
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise RequestError("invalid JSON: the body starts with a UTF-16 or UTF-32 byte order mark; send UTF-8")
    if b"\x00" in raw:  # a JSON text never holds a NUL byte, UTF-16 and UTF-32 ones hold many
        raise RequestError("invalid JSON: the body holds NUL bytes (UTF-16 or UTF-32 text?); send UTF-8")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RequestError(f"invalid JSON: the body is not UTF-8 text (byte {err.start})") from None


def decode_body(raw: bytes | str) -> Any:
    """Decode a request body as strict JSON (UTF-8, no duplicate keys, no NaN/Infinity, bounded nesting)."""
    import json

    text = utf8_text(raw) if isinstance(raw, bytes) else raw
    try:
        return json.loads(
            text,
            object_pairs_hook=unique_keys,
            parse_constant=_no_constant,
            parse_float=_finite_float,
            parse_int=_bounded_int,
        )
    except json.JSONDecodeError as err:
        raise RequestError(f"invalid JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    except DuplicateKeyError as err:
        raise RequestError(f"invalid JSON: duplicate key {err.key!r}") from None
    except RecursionError:
        raise RequestError("invalid JSON: nested too deeply") from None
    except ValueError as err:
        raise RequestError(f"invalid JSON: {err}") from None


def _check_unicode(body: dict[str, Any]) -> None:
    """Refuse lone surrogates (``"\\ud800"``): valid JSON escapes, but text no tokenizer can encode."""
    import json

    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError("the request contains an invalid unicode escape (a lone surrogate)") from None
    except (RecursionError, ValueError):
        raise RequestError("the request is nested too deeply") from None


def _noul_without_criteria(obj: Any) -> Any:
    """Read ``"criteria": {}`` on a noul as absent (some Jev clients send it)."""
    if isinstance(obj, dict) and obj.get("type") == "noul" and obj.get("criteria") == {}:
        return {k: v for k, v in obj.items() if k != "criteria"}
    return obj


VLLM_REFUSED = {
    "instructions": "it would change every prompt; put the context in the state",
    "decision_template": "prompts are rendered as the adapter was trained (its render config), not from a template",
}
"""vLLM's request keys that would change an answer here: refused, with what to do instead (docs/wire.md)."""


def _vllm_keys(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without vLLM's request keys that change no answer here (``seed``: there is no label draw to seed;
    ``priority``, ``request_id``; ``chat_template_kwargs`` when it asks for what every prompt is rendered with);
    the keys that would change one are refused, naming what to do instead."""
    for key, why in VLLM_REFUSED.items():
        if key in body:
            raise RequestError(f"{key} (a vLLM request key) is not accepted: {why} (docs/wire.md, vLLM keys)")
    for key, kind in (("seed", int), ("priority", int), ("request_id", str)):
        value = body.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise RequestError(f"{key} must be {'an integer' if kind is int else 'a string'} or null")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and (not isinstance(kwargs, dict) or any(kwargs.get(k) is not False for k in kwargs)):
        raise RequestError(
            'chat_template_kwargs may only be {} or {"enable_thinking": false}: every prompt is rendered with '
            "thinking off and the template the adapter was trained with (docs/wire.md, vLLM keys)"
        )
    if kwargs and set(kwargs) != {"enable_thinking"}:
        raise RequestError(f"chat_template_kwargs: unknown key(s) {sorted(kwargs)[:5]}; only enable_thinking: false")
    return {k: v for k, v in body.items() if k not in ("seed", "priority", "request_id", "chat_template_kwargs")}


def parse_request(body: Any, limits: Limits = Limits(), form: Callable[[Question], str] | None = None) -> Request:
    """Validate a decoded request body against the wire format and ``limits``; raise :class:`RequestError`.

    ``form`` (the model's ``Renderer.form``) says how each question will be scored, so that prompts are counted as
    they will be: one per option in the per-option form, letters otherwise.
    """
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    body = _vllm_keys(body)
    unknown = set(body) - {"model", "state", "questions"}
    if unknown:
        shown = ", ".join(repr(k[:40]) + ("…" if len(k) > 40 else "") for k in sorted(unknown)[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise RequestError(f"unknown top-level key(s) [{shown}]{more}; the keys are model, state and questions")
    _check_unicode(body)
    model = body.get("model", "")
    if not isinstance(model, str):
        raise RequestError("model must be a string")
    if len(model) > limits.max_name_chars:
        raise RequestError(f"model is longer than the limit of {limits.max_name_chars} characters")
    state = body.get("state")
    if state is None:
        raise RequestError("state is required")
    if isinstance(state, str):
        if not state.strip():
            raise RequestError("state must not be empty")
    elif isinstance(state, list):
        if not state or not all(isinstance(s, str) for s in state):
            raise RequestError("state given as a list must be a non-empty list of strings")
    elif not isinstance(state, dict) or not state:
        raise RequestError("state must be a non-empty string, JSON object or list of strings")
    if state_size(state, stop=limits.max_state_chars) > limits.max_state_chars:
        raise RequestError(
            f"state is longer than the limit of {limits.max_state_chars} characters"
            + (
                ""
                if isinstance(state, str)
                else " (as the model reads it: a JSON object as indented JSON, a list one string per line)"
            )
        )
    questions = body.get("questions")
    if not isinstance(questions, dict) or not questions:
        raise RequestError("questions must be a non-empty object mapping a name to a question")
    if len(questions) > limits.max_questions:
        raise RequestError(f"{len(questions)} questions exceed the limit of {limits.max_questions} per request")
    parsed: dict[str, Question] = {}
    n_prompts = 0
    prompt_chars = 0
    for name, obj in questions.items():
        if not name.strip():
            raise RequestError("question names must be non-empty")
        if len(name) > limits.max_name_chars:
            raise RequestError(
                f"question {name[:40]!r}…: its name is longer than the limit of {limits.max_name_chars} characters"
            )
        try:
            question = parse_question(_noul_without_criteria(obj), name)
            if question.type == "span":
                state_part(state, question.over)  # the part must exist and be text
        except RecordError as err:
            raise RequestError(str(err)) from None
        except UserError as err:  # the span question's part (state_part); a bug's ValueError stays a 500
            raise RequestError(f"question {name!r}: {err}") from None
        prompt_chars += _check_text_limits(name, question, limits)
        if prompt_chars > limits.max_prompt_chars:
            raise RequestError(
                f"question {name!r}: the request's prompts hold more than {limits.max_prompt_chars} "
                "characters of question text, the limit per request (instructions count once per "
                "prompt: per label of a set, per group of 26 options)"
            )
        k = question.k
        if question.type == "choice" and not limits.min_choice_options <= k <= limits.max_choice_options:
            raise RequestError(
                f"question {name!r}: choice needs {limits.min_choice_options} to "
                f"{limits.max_choice_options} options on this server, got {question.k}"
            )
        if question.type == "score" and not limits.min_score_levels <= question.k <= limits.max_score_levels:
            raise RequestError(
                f"question {name!r}: score needs {limits.min_score_levels} to "
                f"{limits.max_score_levels} levels on this server, got {question.k}"
            )
        n_prompts += prompt_count(question, form(question) if form is not None else "letters")
        if n_prompts > limits.max_prompts:
            raise RequestError(
                f"question {name!r}: the request needs more than {limits.max_prompts} scored "
                "prompts (one per question, one per label of a set question, one per option of a "
                "question scored per option, one per group of 26 options + 1 for a larger choice "
                "scored with letters), the limit per request"
            )
        parsed[name] = question
    return Request(model, state, parsed)


PROMPT_OVERHEAD_CHARS = 100  # a prompt's own text around the question: the kind of answer, "Answer with …", the tail
OPTION_OVERHEAD_CHARS = 60  # an option's label and layout, or in the per-option form its own yes / no continuation


def _check_text_limits(name: str, question: Question, limits: Limits) -> int:
    """Refuse an oversized part of one question; return about how many characters its prompts hold besides the
    state (generously: enough to refuse before tokenising what would be far over ``max_input_tokens``)."""
    if len(question.instructions) > limits.max_instructions_chars:
        raise RequestError(
            f"question {name!r}: instructions are longer than the limit of {limits.max_instructions_chars} characters"
        )
    for option, description in zip(question.options, question.descriptions, strict=True):
        if len(option) > limits.max_option_chars or len(description) > limits.max_option_chars:
            raise RequestError(
                f"question {name!r}: option {option[:40]!r} is longer than the limit of "
                f"{limits.max_option_chars} characters"
            )
    options = sum(
        len(o) + len(d) + OPTION_OVERHEAD_CHARS for o, d in zip(question.options, question.descriptions, strict=True)
    )
    return prompt_count(question) * (len(question.instructions) + PROMPT_OVERHEAD_CHARS) + options


def check_span_floor(request: Request, span: SpanWindows, limits: Limits) -> None:
    """Refuse span questions whose text alone cannot fit in ``max_input_tokens``, without tokenising anything.

    The span layout tokenises a span question's text word by word, each word on its own, and puts every word in at
    least one sequence per label (``read: letters``; one sequence holds every label with ``read: head``).
    Span reading relies on each word being at least one token there (its read is at one of its tokens),
    so words × sequences is the fewest tokens :func:`check_span_limits` can count, whatever the tokenizer and however
    many characters a token holds; windows, overlaps, the question and the labels only add to it. A request over the
    limit on that count would be refused by the exact check anyway, after tokenising the whole text (a second or more
    of the scorer's time for 100,000 characters); one under it is left to the exact check.
    """
    counts = {
        name: (len(words(state_part(request.state, q.over))), 1 if span.read == "head" else q.k)
        for name, q in request.questions.items()
        if q.type == "span"
    }
    floor = sum(n_words * sequences for n_words, sequences in counts.values())
    if floor > limits.max_input_tokens:
        name = max(counts, key=lambda n: counts[n][0] * counts[n][1])
        n_words, sequences = counts[name]
        raise RequestError(
            f"the request's span questions hold at least {floor} tokens, over the limit of {limits.max_input_tokens} "
            f"input tokens (every word of a span question's text is at least one token in each sequence that reads "
            f"it: question {name!r} has {n_words} words, read in {sequences} sequence(s) each)"
        )


def check_span_limits(sequences: dict[str, list[int]], limits: Limits) -> None:
    """A span question's sequences (name → each sequence's length in tokens, over every window) count against the
    same token limits as prompts, each a whole prompt."""
    total = 0
    for name, lengths in sequences.items():
        for length in lengths:
            if length > limits.max_prompt_tokens:
                raise RequestError(
                    f"question {name!r}: a span window of {length} tokens is over the limit of "
                    f"{limits.max_prompt_tokens} tokens in one prompt"
                )
            total += length
    if total > limits.max_input_tokens:
        raise RequestError(
            f"the request's span questions hold {total} tokens (their sequences over every window), over the "
            f"limit of {limits.max_input_tokens} input tokens"
        )
