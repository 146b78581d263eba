"""The ``prompt:`` recipe section: how questions are shown to the model (:class:`RenderConfig`, with the span
windows and reads of :class:`SpanWindows`) and the names of the scoring forms.

A recipe model like those in :mod:`mydecide.config`, saved with every adapter as ``mydecide_render.json``
(:func:`mydecide.modeling.save_render_config`) so that every command renders as training did; the renderer that
applies it is :mod:`mydecide.scoring.render`. docs/scoring-forms.md and docs/spans.md say what each key does.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

OptionForm = Literal["letters", "per_option"]
OPTION_FORMS: tuple[str, ...] = ("letters", "per_option")
ScoreForm = Literal["letters", "per_option", "thresholds", "binomial"]
Continuation = Literal["full", "lean", "answer"]
AnswerFormat = Literal["each_question", "once"]
Wording = Literal["full", "short"]
SCORE_FORMS: tuple[str, ...] = ("letters", "per_option", "thresholds", "binomial")


class SpanWindows(BaseModel):
    """How a span question's text is cut into token windows (docs/spans.md)."""

    model_config = ConfigDict(extra="forbid")

    window_tokens: int = Field(512, ge=16)  # text tokens in one window (the question and label come on top)
    overlap_tokens: int = Field(128, ge=0)  # about how many text tokens consecutive windows share
    # show each window twice and read the second copy, so a word's read has seen the words after it too (the start of
    # a multi-word span is decided knowing the rest); twice the tokens
    echo: bool = False
    # the share of a label's words expected inside its spans: every span read starts from its log-odds, so an untuned
    # grid sits near the data's share (docs/spans.md: measured in the demo, no gain there); null: no offset
    prior: float | None = Field(None, gt=0, lt=1)
    # how a word × label cell is read: "head" = a small trained span head on the last hidden state that scores every
    # word against every label's line, one sequence per window; "letters" = the output head's rows of A (yes) and B
    # (no) at the word, one sequence per label, no new parameters; "auto" = a head is trained when the training data
    # has span questions and used when the model has one, the letters otherwise (docs/spans.md)
    read: Literal["auto", "head", "letters"] = "auto"
    # the span head's read of a label: "last" = the final hidden state at its line's last token, "line" = the mean
    # over its line's tokens (name and description; trained alone on the demo's PII spans it ended at exact F1 0.911
    # against 0.943 for "last", docs/LOG.md). A render config saved before the key existed means "last"
    # (modeling.read_render_config)
    label_read: Literal["line", "last"] = "last"
    # the order a span question's labels are shown and read in: "sorted" = by name, so the order a client lists them
    # in changes no probability; "given" = the question's own order. A render config saved before the key existed
    # means "given"
    label_order: Literal["sorted", "given"] = "sorted"
    # the span head's read of a word: "last" = the final hidden state at its last token, "mean" = the mean over its
    # tokens, "core" = the final hidden state at the last token of the word without the punctuation a span would
    # trim from its end (`52?` is read at the last token of `52`, the `?` encoded as its own piece after it; a word
    # that is all punctuation: its last token; docs/spans.md). The letters read always reads the last token. A render
    # config saved before "core" existed means "last"
    word_read: Literal["last", "mean", "core"] = "core"
    # where the span head reads: "own" = every window its own sequence (template head, context, question, labels,
    # text); "shared" = after the prefix every other question of the state shares (template head + state), one
    # block: the question, the label lines, then a copy of the text, read there, so every read has seen all labels
    # and the whole text (a window not wholly in the prefix, a state cut by max_state_tokens, carries its own first
    # copy); scored in the state's packed row beside its other questions (docs/spans.md#the-shared-layout). The
    # span head's read only (a letters read keeps its own sequences). A render config saved before the key existed
    # means "own"
    layout: Literal["own", "shared"] = "own"

    def resolve(self, head: bool) -> SpanWindows:
        """``auto`` made concrete: ``head`` when the model has (or training will give it) a span head, else
        ``letters``; an explicit read stays as it is."""
        return self if self.read != "auto" else self.model_copy(update={"read": "head" if head else "letters"})

    @property
    def offset(self) -> float:
        """The log-odds added to every span read: logit(``prior``), 0 without one."""
        return 0.0 if self.prior is None else math.log(self.prior / (1 - self.prior))

    @model_validator(mode="after")
    def _overlap_below_window(self) -> SpanWindows:
        if self.overlap_tokens > self.window_tokens // 2:
            raise ValueError(f"overlap_tokens must be at most half of window_tokens ({self.window_tokens // 2})")
        if self.layout == "shared" and self.read == "letters":
            raise ValueError("layout: shared is a layout of the span head's read; read: letters keeps its own layout")
        if self.layout == "shared" and self.echo:
            raise ValueError("layout: shared already reads a second copy of the text; leave echo off with it")
        return self


class RenderConfig(BaseModel):
    """How questions are shown to the model. Saved next to every adapter so serving renders as training did."""

    model_config = ConfigDict(extra="forbid")

    # the chat's system message (null: none); with answer_format: once the answer formats follow it there
    system_prompt: str | None = (
        "You are a decision model. Read the state, then answer the question with the letter of one option."
    )
    show_option_ids: bool = True
    max_state_tokens: int = Field(3000, ge=1)
    label_form: str = "auto"  # "auto" picks "A" or " A", whichever the chat template makes a single token
    # How a choice question's options are scored: "letters" = one next-token read over the labels A, B, … (one pass
    # per question; needs a model that binds letters to options), "per_option" = every option its own yes / no
    # continuation of a prefix holding the state and the question, the K yes − no logits through one softmax
    # (order-invariant by construction; what small models can learn; the default). Score questions have their own
    # key. A render config saved before these keys existed means letters (modeling.read_render_config).
    option_form: OptionForm = "per_option"
    # Score questions: "letters" and "per_option" as for choices (nominal reads of the levels; per_option is the
    # default: it ranked and scored the demo's 5-level task best of the three, docs/scoring-forms.md), or
    # "thresholds": the levels listed lowest first, then K − 1 yes / no reads "is the right level this one or a higher
    # one?" whose log-odds d_k sum into the level logits z_j = d_1 + … + d_j (z_0 = 0), so every read learns from
    # every example and the levels' order is in the model; or "binomial": the levels listed lowest first, then one
    # yes / no read s "is the right level closer to the top level than to the bottom one?", the level logits
    # z_k = log C(K − 1, k) + k·s (one read per question, always unimodal; docs/scoring-forms.md)
    score_form: ScoreForm = "per_option"
    # per_option only: show every option (choice: sorted by id, so the list does not depend on the client's order;
    # score: levels lowest first) in the shared prefix, so each option is judged against the others
    list_options: bool = False
    # per_option and thresholds (binomial has one read, whose prompt always says the answer format after its
    # question): what each yes / no continuation repeats. "answer" (the default) = the shared prefix ends the user's
    # turn (the question, the answer format, then the chat template's tail) and a continuation is the option's line
    # inside the answer turn, read at its line break: the fewest tokens per option, and on the demo the best choice
    # and score answers of the three (docs/scoring-forms.md); "full" = every continuation repeats the answer format
    # (A. yes, B. no, the letter only), as adapters before the key were trained; "lean" = the answer format is said
    # once in the shared prefix and a continuation is the option's line and the chat template's tail. A render
    # config saved before the key existed means "full" (modeling.read_render_config)
    continuation: Continuation = "answer"
    # where the answer formats of the default reads are said: "each_question" (the default) = every question says
    # its own, right before the answer; "once" = in one sentence after the system prompt, in the prompt's head
    # (which every question and every request shares: serving computes it once and keeps it), and a question's own
    # text drops the lines that sentence says (a yes / no question's "A. yes / B. no" where its options carry no
    # description, "Answer with the letter only.", and with continuation: answer the "Exactly one option is
    # right." and answer-format lines). 17% fewer tokens on a 4-question request, but on the demo it lost choice
    # and score accuracy (0.884 -> 0.798, 0.548 -> 0.308 tuned; docs/scoring-forms.md). The threshold, binomial,
    # lean and full reads keep their own lines (they ask something else). A render config saved before the key
    # existed means "each_question" (modeling.read_render_config)
    answer_format: AnswerFormat = "each_question"
    # how many words the default reads spend on what every question repeats: "full" = a per-option question (with
    # continuation: answer) says "Exactly one option is right." and "Answer with the option on its own line, then A
    # if it is the right one or B if not.", each answer line starts "Option: " or "Level: ", and a plain yes / no
    # question lists "A. yes" / "B. no" between "Answer yes or no." and "Answer with the letter only."; "short" = one
    # line "Write an option, then A if it is right, B if not.", the option's text alone on its answer line, and
    # "Answer A for yes or B for no." (the default: 15% fewer tokens on a 4-question request, and on the demo choice,
    # score and calibration no worse; docs/scoring-forms.md). Threshold, binomial, lean and full reads keep their
    # lines. A render config saved before the key existed means "full" (modeling.read_render_config)
    wording: Wording = "short"
    # span questions: how the text is cut into windows and how each word × label cell is read (docs/spans.md)
    span: SpanWindows = Field(default_factory=SpanWindows)
