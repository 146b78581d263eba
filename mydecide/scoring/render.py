"""Rendering, the scoring layer's first step: a question as a chat prompt whose next token is the answer.

Training, evaluation and serving all go through this module, so a question is always tokenised the same way.

A prompt is two token segments:

* ``prefix``: the chat template's head, then the state (cut to ``max_state_tokens`` and marked when too long).
  Every question about one state has the same prefix, so it can be computed once and reused.
* ``suffix``: the question, its options labelled ``A.``, ``B.``, … and the chat template's tail, ending exactly at the
  answer slot. The answer is read from the logits of the label tokens at the last position only.

Segments are tokenised separately and concatenated, in every code path, so "scored alone" and "scored after a shared
prefix" see identical token ids.
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mydecide.errors import UserError
from mydecide.prompt import RenderConfig
from mydecide.records import Question

LETTERS = string.ascii_uppercase
MAX_LETTER_OPTIONS = len(LETTERS)
TRUNCATION_MARK = "\n[… state truncated]"
_STATE_SLOT = "\x00STATE\x00"
_QUESTION_SLOT = "\x00QUESTION\x00"
LABEL_FORMS = ("", " ")  # the answer labels "A" and " A": the first whose tokens continue the prompt as single tokens


class LabelError(UserError):
    """The tokenizer cannot show the answer labels as single tokens."""


def render_state(state: Any) -> str:
    """A state is a string, a JSON object (indented JSON) or a list of strings (one per line)."""
    if isinstance(state, str):
        return state
    if isinstance(state, dict):
        return json.dumps(state, indent=2, ensure_ascii=False)
    return "\n".join(state)


def question_units(question: Question) -> list[Question]:
    """The single-answer questions a question is scored as: itself, or one yes/no question per label of a set."""
    if question.type != "set":
        return [question]
    units = []
    for label, description in zip(question.options, question.descriptions, strict=True):
        shown = f"{label} ({description})" if description else label
        units.append(
            Question("noul", f"{question.instructions}\nDoes this label apply: {shown}?", ("yes", "no"), ("", ""))
        )
    return units


def option_text(question: Question, index: int) -> str:
    """How one option reads: a level's text, or an option's id and its description (where it has one)."""
    option, description = question.options[index], question.descriptions[index]
    if question.type == "score":
        return description or option
    return f"{option} — {description}" if description else option


def option_lines(question: Question, order: Sequence[int]) -> list[str]:
    """The lettered option lines of a letters read, in ``order`` (a score level shows its text alone)."""
    lines = []
    for position, index in enumerate(order):
        text = question.descriptions[index] if question.type == "score" else option_text(question, index)
        lines.append(f"{LETTERS[position]}. {text}")
    return lines


ANSWER_TURN_FORMAT = "Answer with the {name} on its own line, then A if {test} or B if not."
"""A threshold read's answer format: a continuation is the level's line in the answer turn."""
PER_OPTION_FORMAT = "Write {name}, then A if it is right, B if not."
"""A per-option question's one line of answer format: a continuation is the option's text in the answer turn."""
SHORT_YES_NO = "Answer A for yes or B for no."
"""A plain yes / no question's answer format, in place of its option lines."""


def per_option_question_text(question: Question) -> str:
    """The shared part of a per-option prompt: the question and the answer format of an answer turn that names the
    option (each option's continuation, :meth:`Renderer.render_per_option`)."""
    name = "a level" if question.type == "score" else "an option"
    return "\n".join(["", "", f"Question: {question.instructions}", PER_OPTION_FORMAT.format(name=name)])


def threshold_question_text(question: Question) -> str:
    """The shared part of every threshold read of a score question: the question, its levels lowest first, and the
    answer format of an answer turn that names the level."""
    lines = ["", "", f"Question: {question.instructions}", "Levels, lowest first:"]
    lines += [f"- {option_text(question, i)}" for i in range(question.k)]
    lines.append(ANSWER_TURN_FORMAT.format(name="level", test="the right level is that level or a higher one"))
    return "\n".join(lines)


def binomial_question_text(question: Question) -> str:
    """The one read of a score question in the binomial form: the question, its levels lowest first, and whether the
    right level is closer to the top level than to the bottom one, answered A (yes) or B (no)."""
    top, bottom = option_text(question, question.k - 1), option_text(question, 0)
    lines = ["", "", f"Question: {question.instructions}", "Levels, lowest first:"]
    lines += [f"- {option_text(question, i)}" for i in range(question.k)]
    lines += [f"Is the right level closer to '{top}' than to '{bottom}'?", "A. yes", "B. no"]
    lines.append("Answer with the letter only.")
    return "\n".join(lines)


def question_text(question: Question, order: Sequence[int]) -> str:
    """A question read by letters: the question, what kind of answer it takes, its lettered options and the answer
    format; a yes / no question whose options carry no description says :data:`SHORT_YES_NO` in their place."""
    if question.type == "noul" and not any(question.descriptions):
        return "\n".join(["", "", f"Question: {question.instructions}", SHORT_YES_NO])
    kind = {
        "choice": "Choose one option.",
        "noul": "Answer yes or no.",
        "score": "Choose one level (levels are listed lowest first).",
        "set": "",
    }[question.type]
    lines = ["", "", f"Question: {question.instructions}", kind, *option_lines(question, order)]
    lines.append("Answer with the letter only.")
    return "\n".join(lines)


@dataclass(frozen=True)
class Prompt:
    """A tokenised question: ``prefix + suffix`` ends at the answer slot. ``order[j]`` is the option shown at j.

    ``stem``: how many of the prefix's last tokens are its question's shared text (a per-option or threshold read,
    whose prefix is the state and then the question); 0 where the prefix is the state alone. Every question on one
    state shares the prefix's ``root`` (head + state); the reads of one question share the whole prefix.
    """

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    order: tuple[int, ...]
    truncated: bool = False
    stem: int = 0

    @property
    def k(self) -> int:
        return len(self.order)

    @property
    def root(self) -> tuple[int, ...]:
        """The prefix without its question's stem: the template head and the state."""
        return self.prefix[: len(self.prefix) - self.stem]

    def __len__(self) -> int:
        return len(self.prefix) + len(self.suffix)


class Renderer:
    """Turns (state, question, option order) into :class:`Prompt` token ids for one tokenizer.

    Checks at construction that every answer label is a single token in the form the chat template makes natural.
    """

    def __init__(self, tokenizer: Any, config: RenderConfig | None = None):
        self.tokenizer = tokenizer
        self.config = config or RenderConfig()
        self.template_head, self.head, self.tail = self._template_parts()
        self._head_ids = tuple(self._encode(self.head))
        self.label_form, self.label_ids = self._label_tokens()
        self._state_cache: dict[str, tuple[tuple[int, ...], bool]] = {}

    # -- template ------------------------------------------------------------------------------------------------
    def _template_parts(self) -> tuple[str, str, str]:
        """The chat template's text before the user's message (with the configured system prompt alone: what a
        span question's prompt starts with), the text before the state (that and "State:") and the text after the
        question (which ends at the answer slot)."""
        tok = self.tokenizer
        if not getattr(tok, "chat_template", None):
            return "", "", "\nAnswer:"
        system = self.config.system_prompt
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": f"{_STATE_SLOT}{_QUESTION_SLOT}"})
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
        head, rest = text.split(_STATE_SLOT)
        return head, head + "State:\n", rest.split(_QUESTION_SLOT)[1]

    def _encode(self, text: str) -> list[int]:
        """Token ids of the template's own text (head, tail, labels): its special tokens are real."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _encode_user(self, text: str, tail: str = "") -> list[int]:
        """Token ids of user text (a state, a question and its options), then the template's ``tail``.

        A control token typed by a user (``<|im_end|>`` in a state, any added token of the tokenizer) is encoded as
        the characters it is, never as the token, so user text cannot close its turn or open the assistant's; only
        ``tail`` keeps its special tokens. Text holding no control token's string is encoded exactly as
        ``_encode(text + tail)``, so ordinary prompts tokenise as they always did.
        """
        whole = text + tail
        controls = [t.content for t in getattr(self.tokenizer, "added_tokens_decoder", {}).values() if t.content]
        if all((at := whole.find(c)) == -1 or at >= len(text) for c in controls):
            return self._encode(whole)
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:  # a slow tokenizer: at least its special tokens are split into plain text
            plain = self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
            return list(plain) + self._encode(tail)
        # the fast tokenizer's pipeline without its added-token step (which would match "<think>" even with
        # split_special_tokens=True, since Qwen's <think> is an added token but not a special one)
        normalized = backend.normalizer.normalize_str(text) if backend.normalizer is not None else text
        pieces = (
            [p for p, _ in backend.pre_tokenizer.pre_tokenize_str(normalized)]
            if backend.pre_tokenizer is not None
            else [normalized]
        )
        return [t.id for piece in pieces for t in backend.model.tokenize(piece)] + self._encode(tail)

    def _label_tokens(self) -> tuple[str, tuple[int, ...]]:
        """Pick the label form ("A" or " A", in that order) whose tokens continue the prompt as single tokens."""
        name = getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__
        probe = self._encode(self.tail)
        for space in LABEL_FORMS:
            ids = []
            for letter in LETTERS:
                label = self._encode(space + letter)
                # the label must be one token, and appending it must not change how the prompt tokenises
                if len(label) != 1 or self._encode(self.tail + space + letter) != probe + label:
                    break
                ids.append(label[0])
            if len(ids) == len(LETTERS) and len(set(ids)) == len(ids):
                return space + "A", tuple(ids)
        raise LabelError(
            f"tokenizer {name!r}: the answer labels A–Z are not single tokens after the chat prompt "
            f"(tried the forms {[f + 'A' for f in LABEL_FORMS]}); this model cannot be used as a decision model"
        )

    def encode_pieces(self, pieces: Sequence[str]) -> list[list[int]]:
        """Token ids of consecutive pieces of user text, each encoded on its own (a span question's words, each
        with the whitespace before it), so every piece's tokens are known exactly."""
        controls = [t.content for t in getattr(self.tokenizer, "added_tokens_decoder", {}).values() if t.content]
        if pieces and not any(c in piece for piece in pieces for c in controls):
            return [list(ids) for ids in self.tokenizer(list(pieces), add_special_tokens=False)["input_ids"]]
        return [self._encode_user(piece) for piece in pieces]

    # -- rendering -----------------------------------------------------------------------------------------------
    def head_ids(self) -> list[int]:
        """Token ids of the head every state's prefix starts with (``encode_state``)."""
        return list(self._head_ids)

    def encode_state(self, state: Any) -> tuple[tuple[int, ...], bool]:
        """Token ids of head + state (cut to ``max_state_tokens``), and whether the state was cut. Cached."""
        text = render_state(state)
        cached = self._state_cache.get(text)
        if cached is not None:
            return cached
        state_ids = self._encode_user(text)
        truncated = len(state_ids) > self.config.max_state_tokens
        if truncated:
            mark = self._encode(TRUNCATION_MARK)
            state_ids = state_ids[: max(0, self.config.max_state_tokens - len(mark))] + mark
        result = (self._head_ids + tuple(state_ids), truncated)
        if len(self._state_cache) > 4096:
            self._state_cache.clear()
        self._state_cache[text] = result
        return result

    def form(self, question: Question) -> str:
        """How this renderer scores the options of ``question``: ``letters``, ``per_option`` or (score questions)
        ``thresholds`` or ``binomial``.

        Choice and score questions follow the config; yes / no questions (and each label of a set) are one
        yes / no read either way.
        """
        if question.type == "choice":
            return self.config.option_form
        if question.type == "score":
            return self.config.score_form
        return "letters"

    def render_per_option(self, state: Any, question: Question, indices: Sequence[int] | None = None) -> list[Prompt]:
        """One yes / no prompt per option (``indices``: canonical indices, default all), read as A = yes, B = no.

        Every prompt has the same prefix (head, state, question), so the state and question are computed once; the
        suffix names one option. No prompt depends on where its option stood in the request: permuting the options
        permutes the prompts.
        """
        if question.type not in ("choice", "score"):
            raise ValueError(f"a {question.type} question has no per-option form")
        indices = range(question.k) if indices is None else indices
        lines = [option_text(question, i) for i in indices]
        return self._continuations(state, per_option_question_text(question), lines)

    def _continuations(self, state: Any, shared: str, lines: Sequence[str]) -> list[Prompt]:
        """One yes / no prompt per line after one prefix: the state, then ``shared`` (the stem) and the template's
        tail; each continuation is its line in the answer turn and a line break, where A (yes) or B (no) is read."""
        state_ids, truncated = self.encode_state(state)
        stem = tuple(self._encode_user(shared, self.tail))
        suffixes = [self._encode_user(f"{line}\n") for line in lines]
        return [Prompt(state_ids + stem, tuple(suffix), (0, 1), truncated, len(stem)) for suffix in suffixes]

    def render_thresholds(self, state: Any, question: Question) -> list[Prompt]:
        """The K − 1 threshold reads of a score question, for levels 1 … K − 1 ("is the right level this one or
        higher?", A = yes, B = no), all continuing one prefix that holds the state, the question and every level."""
        if question.type != "score":
            raise ValueError(f"a {question.type} question has no threshold form")
        lines = [f"Level: {option_text(question, i)}" for i in range(1, question.k)]
        return self._continuations(state, threshold_question_text(question), lines)

    def render_binomial(self, state: Any, question: Question) -> Prompt:
        """The one read of a score question in the binomial form (A = yes, B = no: closer to the top level than to
        the bottom one?), continuing the state: its yes − no log-odds s give every level's logit
        (``scoring.plan.binomial_logits``)."""
        if question.type != "score":
            raise ValueError(f"a {question.type} question has no binomial form")
        state_ids, truncated = self.encode_state(state)
        return Prompt(
            state_ids, tuple(self._encode_user(binomial_question_text(question), self.tail)), (0, 1), truncated
        )

    def render(self, state: Any, question: Question, order: Sequence[int] | None = None) -> Prompt:
        """Render one single-answer question (use :func:`question_units` first for ``set``)."""
        if question.type == "set":
            raise ValueError("render set questions through question_units(): one yes/no question per label")
        order = tuple(range(question.k)) if order is None else tuple(order)
        if sorted(order) != list(range(question.k)):
            raise ValueError(f"order {order} is not a permutation of the {question.k} options")
        if question.k > MAX_LETTER_OPTIONS:
            raise ValueError(f"question shows {question.k} options; at most {MAX_LETTER_OPTIONS} (A–Z) per prompt")
        prefix, truncated = self.encode_state(state)
        suffix = self._encode_user(question_text(question, order), self.tail)
        return Prompt(prefix, tuple(suffix), order, truncated)
