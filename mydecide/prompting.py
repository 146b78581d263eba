"""Render a question as a chat prompt whose next token is the answer, and read option logits.

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
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from mydecide.records import Question

if TYPE_CHECKING:
    import torch

LETTERS = string.ascii_uppercase
MAX_LETTER_OPTIONS = len(LETTERS)
TRUNCATION_MARK = "\n[… state truncated]"
_STATE_SLOT = "\x00STATE\x00"
_QUESTION_SLOT = "\x00QUESTION\x00"


OptionForm = Literal["letters", "per_option"]
OPTION_FORMS: tuple[str, ...] = ("letters", "per_option")


class RenderConfig(BaseModel):
    """How questions are shown to the model. Saved next to every adapter so serving renders as training did."""

    model_config = ConfigDict(extra="forbid")

    system_prompt: str | None = (
        "You are a decision model. Read the state, then answer the question with the letter of one option."
    )
    show_option_ids: bool = True
    max_state_tokens: int = 3000
    label_form: str = "auto"  # "auto" picks "A" or " A", whichever the chat template makes a single token
    # How a choice question's options are scored: "letters" = one next-token read over the labels A, B, … (one pass
    # per question; needs a model that binds letters to options), "per_option" = every option its own yes / no
    # continuation of a prefix holding the state and the question, the K yes − no logits through one softmax
    # (order-invariant by construction; what small models can learn; the default). Score questions have their own
    # key. A render config saved before these keys existed means letters (modeling.read_render_config).
    option_form: OptionForm = "per_option"
    score_form: OptionForm = "letters"
    # per_option only: show every option (choice: sorted by id, so the list does not depend on the client's order;
    # score: levels lowest first) in the shared prefix, so each option is judged against the others
    list_options: bool = False


class LabelError(ValueError):
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


def option_lines(question: Question, order: Sequence[int], show_ids: bool) -> list[str]:
    lines = []
    for position, index in enumerate(order):
        option, description = question.options[index], question.descriptions[index]
        if question.type == "score":
            text = description
        elif question.type == "noul":
            text = f"{option} — {description}" if description else option
        elif description:
            text = f"{option} — {description}" if show_ids else description
        else:
            text = option
        lines.append(f"{LETTERS[position]}. {text}")
    return lines


def option_text(question: Question, index: int, show_ids: bool) -> str:
    """How one option reads on its own (a per-option continuation): its id and description, or the level text."""
    option, description = question.options[index], question.descriptions[index]
    if question.type == "score":
        return description or option
    if description:
        return f"{option} — {description}" if show_ids else description
    return option


def per_option_question_text(question: Question, show_ids: bool, list_options: bool) -> str:
    """The shared part of a per-option prompt: the question, and (``list_options``) every option in an order the
    client cannot change — choice options sorted by id, score levels lowest first."""
    kind = {
        "choice": "Exactly one option is right. Is the option below the right one?",
        "score": "Exactly one level is right (levels are listed lowest first). Is the level below the right one?",
    }
    lines = ["", "", f"Question: {question.instructions}", kind[question.type]]
    if list_options:
        indices = (
            range(question.k)
            if question.type == "score"
            else sorted(range(question.k), key=lambda i: question.options[i])
        )
        lines += ["Options:", *(f"- {option_text(question, i, show_ids)}" for i in indices)]
    return "\n".join(lines)


def per_option_suffix_text(question: Question, index: int, show_ids: bool) -> str:
    name = "Level" if question.type == "score" else "Option"
    return "\n".join(
        ["", f"{name}: {option_text(question, index, show_ids)}", "A. yes", "B. no", "Answer with the letter only."]
    )


def question_text(question: Question, order: Sequence[int], show_ids: bool = True) -> str:
    kind = {
        "choice": "Choose one option.",
        "noul": "Answer yes or no.",
        "score": "Choose one level (levels are listed lowest first).",
        "set": "",
    }[question.type]
    lines = [
        "",
        "",
        f"Question: {question.instructions}",
        kind,
        *option_lines(question, order, show_ids),
        "Answer with the letter only.",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class Prompt:
    """A tokenised question: ``prefix + suffix`` ends at the answer slot. ``order[j]`` is the option shown at j."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    order: tuple[int, ...]
    truncated: bool = False

    @property
    def k(self) -> int:
        return len(self.order)

    def __len__(self) -> int:
        return len(self.prefix) + len(self.suffix)


class Renderer:
    """Turns (state, question, option order) into :class:`Prompt` token ids for one tokenizer.

    Checks at construction that every answer label is a single token in the form the chat template makes natural.
    """

    def __init__(self, tokenizer: Any, config: RenderConfig | None = None):
        self.tokenizer = tokenizer
        self.config = config or RenderConfig()
        self.head, self.tail = self._template_parts()
        self.label_form, self.label_ids = self._label_tokens()
        self._state_cache: dict[str, tuple[tuple[int, ...], bool]] = {}

    # -- template ------------------------------------------------------------------------------------------------
    def _template_parts(self) -> tuple[str, str]:
        """The chat template's text before the state and after the question (which ends at the answer slot)."""
        tok = self.tokenizer
        if not getattr(tok, "chat_template", None):
            return "", "\nAnswer:"
        messages = []
        if self.config.system_prompt:
            messages.append({"role": "system", "content": self.config.system_prompt})
        messages.append({"role": "user", "content": f"{_STATE_SLOT}{_QUESTION_SLOT}"})
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
        head, rest = text.split(_STATE_SLOT)
        _, tail = rest.split(_QUESTION_SLOT)
        return head + "State:\n", tail

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
        """Pick the label form ("A" or " A") whose tokens continue the prompt as single tokens."""
        name = getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__
        forms = ["", " "] if self.config.label_form == "auto" else [self.config.label_form.replace("A", "")]
        probe = self._encode(self.tail)
        for space in forms:
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
            f"(tried the forms {[f + 'A' for f in forms]}); this model cannot be used as a decision model"
        )

    # -- rendering -----------------------------------------------------------------------------------------------
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
        result = (tuple(self._encode(self.head) + state_ids), truncated)
        if len(self._state_cache) > 4096:
            self._state_cache.clear()
        self._state_cache[text] = result
        return result

    def form(self, question: Question) -> str:
        """How this renderer scores the options of ``question``: ``letters`` or ``per_option``.

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

        Every prompt has the same prefix (head, state, question and, with ``list_options``, the options in an order
        the client cannot change), so the state and question are computed once; the suffix names one option. No
        prompt depends on where its option stood in the request: permuting the options permutes the prompts.
        """
        if question.type not in ("choice", "score"):
            raise ValueError(f"a {question.type} question has no per-option form")
        state_ids, truncated = self.encode_state(state)
        shared = per_option_question_text(question, self.config.show_option_ids, self.config.list_options)
        prefix = state_ids + tuple(self._encode_user(shared))
        indices = range(question.k) if indices is None else indices
        return [
            Prompt(
                prefix,
                tuple(self._encode_user(per_option_suffix_text(question, i, self.config.show_option_ids), self.tail)),
                (0, 1),
                truncated,
            )
            for i in indices
        ]

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
        suffix = self._encode_user(question_text(question, order, self.config.show_option_ids), self.tail)
        return Prompt(prefix, tuple(suffix), order, truncated)


# ------------------------------------------------------------------------------------------------------ batches


@dataclass
class Batch:
    """Tensors for one forward pass. Either ``input_ids`` (whole prompts, left-padded) or the shared-prefix form.

    Shared-prefix form: ``prefix_ids`` (G, P) left-padded, one row per distinct state; ``suffix_ids`` (B, S)
    right-padded, one row per question; ``group`` (B,) maps a question to its prefix row; ``last`` (B,) is the index
    of each question's last real suffix token. ``option_mask`` (B, K) marks the options shown in each row.
    """

    option_mask: torch.Tensor
    input_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    prefix_ids: torch.Tensor | None = None
    prefix_mask: torch.Tensor | None = None
    suffix_ids: torch.Tensor | None = None
    suffix_mask: torch.Tensor | None = None
    group: torch.Tensor | None = None
    last: torch.Tensor | None = None
    n_tokens: int = 0  # real (non-pad) tokens processed
    n_padded: int = 0  # tokens processed including padding

    def to(self, device: Any) -> Batch:
        import torch

        fields = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return Batch(**fields)  # type: ignore[arg-type]


def collate(prompts: Sequence[Prompt], pad_id: int, shared_prefix: bool = True) -> Batch:
    """Build a :class:`Batch`. With ``shared_prefix``, questions with the same prefix share one prefix row."""
    import torch

    k_max = max(p.k for p in prompts)
    option_mask = torch.zeros(len(prompts), k_max, dtype=torch.bool)
    for i, p in enumerate(prompts):
        option_mask[i, : p.k] = True

    groups: dict[tuple[int, ...], int] = {}
    for p in prompts:
        groups.setdefault(p.prefix, len(groups))
    if not shared_prefix or len(groups) == len(prompts):
        seqs = [p.prefix + p.suffix for p in prompts]
        ids, mask = _pad(seqs, pad_id, left=True)
        return Batch(
            option_mask, input_ids=ids, attention_mask=mask, n_tokens=sum(map(len, seqs)), n_padded=ids.numel()
        )
    prefixes = list(groups)
    prefix_ids, prefix_mask = _pad(prefixes, pad_id, left=True)
    suffix_ids, suffix_mask = _pad([p.suffix for p in prompts], pad_id, left=False)
    group = torch.tensor([groups[p.prefix] for p in prompts])
    last = torch.tensor([len(p.suffix) - 1 for p in prompts])
    n_tokens = sum(map(len, prefixes)) + sum(len(p.suffix) for p in prompts)
    return Batch(
        option_mask,
        prefix_ids=prefix_ids,
        prefix_mask=prefix_mask,
        suffix_ids=suffix_ids,
        suffix_mask=suffix_mask,
        group=group,
        last=last,
        n_tokens=n_tokens,
        n_padded=prefix_ids.numel() + suffix_ids.numel(),
    )


def _pad(seqs: Sequence[Sequence[int]], pad_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if left:
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
        else:
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[i, : len(s)] = 1
    return ids, mask


def last_hidden(decoder: Any, batch: Batch) -> torch.Tensor:
    """(B, H) final hidden state at each question's answer slot; runs the decoder once or twice (shared prefix)."""
    import torch

    if batch.input_ids is not None:
        out = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        return out.last_hidden_state[:, -1]
    assert batch.prefix_ids is not None and batch.suffix_ids is not None
    assert batch.group is not None and batch.last is not None and batch.suffix_mask is not None
    assert batch.prefix_mask is not None
    from transformers import DynamicCache

    cache = DynamicCache(config=decoder.config)
    decoder(input_ids=batch.prefix_ids, attention_mask=batch.prefix_mask, past_key_values=cache, use_cache=True)
    cache.reorder_cache(batch.group)  # type: ignore[arg-type]  # (G, …) → (B, …): each question continues from its own state's prefix
    mask = torch.cat([batch.prefix_mask[batch.group], batch.suffix_mask], dim=1)
    out = decoder(input_ids=batch.suffix_ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    rows = torch.arange(batch.suffix_ids.shape[0], device=batch.suffix_ids.device)
    return out.last_hidden_state[rows, batch.last]  # suffixes are right-padded: read the last real position


def read_option_logits(
    hidden: torch.Tensor,
    output_weight: torch.Tensor,
    label_ids: torch.Tensor,
    option_mask: torch.Tensor,
    output_bias: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """(B, K) logits of the shown labels only; positions beyond a row's options are −inf.

    Only the K label rows of the output embedding are multiplied: no full-vocabulary logits are ever formed.
    """
    import torch

    k = option_mask.shape[1]
    weight = output_weight[label_ids[:k]]  # (K, H)
    logits = hidden.to(weight.dtype) @ weight.T  # (B, K)
    if output_bias is not None:
        logits = logits + output_bias[label_ids[:k]]
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return logits.float().masked_fill(~option_mask, float("-inf"))
