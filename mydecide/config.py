"""Typed recipes: pydantic models (unknown keys are errors) whose fields are the one home of every default.

A recipe is a YAML file from ``recipes/``, read and validated by :func:`mydecide.recipe_loading.load_recipe`, the one
way from a command line to a validated recipe; reading the text and telling errors in one line is
:mod:`mydecide.recipe_parsing`. :func:`dump_recipe` writes one back (beside a run's outputs).
"""

from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, field_validator

from mydecide.data_recipe import (  # noqa: F401 (prepare's recipe: imported here with every other recipe)
    EXPERIMENTAL,
    AugmentConfig,
    DataRecipe,
    DecontaminationConfig,
    DedupConfig,
    ExperimentalShare,
    NearDedupConfig,
    OutputConfig,
    RayEngineConfig,
    SourceSpec,
    SplitConfig,
)
from mydecide.prompt import OptionForm, RenderConfig, ScoreForm
from mydecide.recipe_parsing import Seed, Strict
from mydecide.records import MAX_CHOICE_OPTIONS, MAX_SCORE_LEVELS, MIN_CHOICE_OPTIONS, MIN_SCORE_LEVELS

# ---------------------------------------------------------------------------------------------------- training


class LoraConfig(Strict):
    r: int = Field(32, ge=1)  # LoRA rank
    alpha: int | None = Field(None, ge=1)  # default 2·r
    dropout: float = Field(0.05, ge=0.0, lt=1.0)  # LoRA dropout
    # "all-linear": every linear layer of the language model (attention, MLP, Gated DeltaNet projections),
    # never the output head or a vision tower. Or an explicit list of module-name suffixes.
    target_modules: str | list[str] = "all-linear"
    # adapt only the last N decoder layers (all-linear only): the backward pass stops there, so updates are cheaper
    last_layers: int | None = Field(None, ge=1)


class ProperObjective(Strict):
    kind: Literal["proper"] = "proper"


class CeObjective(Strict):
    kind: Literal["ce"] = "ce"


class RlcdObjective(Strict):
    kind: Literal["rlcd"] = "rlcd"
    group_size: int = Field(8, ge=2)
    sigma_start: float = Field(1.0, gt=0)
    sigma_end: float = Field(0.3, gt=0)


Objective = ProperObjective | CeObjective | RlcdObjective
Tracker = Literal["none", "tensorboard", "wandb", "mlflow"]


class OptimConfig(Strict):
    lr: float = Field(1e-4, gt=0)  # peak learning rate (AdamW)
    weight_decay: float = Field(0.0, ge=0)  # AdamW weight decay
    warmup_ratio: float = Field(0.03, ge=0, lt=1)  # share of the updates spent warming up the learning rate
    schedule: Literal["cosine", "linear", "constant"] = "cosine"  # learning-rate schedule after warm-up
    max_grad_norm: float = Field(1.0, gt=0)  # gradient clipping
    batch_size: int = Field(4, ge=1)  # questions per micro-batch (per process)
    grad_accum: int = Field(8, ge=1)  # micro-batches per optimizer update
    epochs: float = Field(2.0, gt=0, le=1_000_000)  # passes over the training split (fractions allowed)
    max_steps: int | None = Field(None, ge=1)  # optimizer updates; overrides epochs when set


class EarlyStopping(Strict):
    # stop training after this many dev evaluations in a row without a new lowest dev log loss (unset: train every
    # update); RUN/adapter is the adapter best on dev, as always, and the run's last line says why it stopped
    patience: int | None = Field(None, ge=1)


class ModelChoice(Strict):
    """The base model a command loads; the one default for every command."""

    model: str = "smollm2-135m"  # base model: a local HF directory, a hub name, a .gguf file or smollm2-135m


class ScoringModel(ModelChoice):
    """What a command that scores questions loads: the base model, an adapter, and how choice options are scored."""

    adapter: str | None = None  # a LoRA adapter directory (RUN/adapter)
    # how choice options are scored: letters | per_option; unset = as the adapter was trained (an error if it
    # contradicts the adapter's saved form)
    option_form: OptionForm | None = None
    # how score levels are scored: letters | per_option | thresholds | binomial; unset = as the adapter was trained (an
    # error if it contradicts the adapter's saved form)
    score_form: ScoreForm | None = None
    # load the adapter even on a base whose weights fingerprint is not the one it was trained on (a warning, not an
    # error); an adapter without its base record (mydecide_base.json) is refused either way
    allow_other_base: bool = False


class TrainRecipe(ModelChoice):
    data: str | None = None  # a prepare output directory (train.jsonl, dev.jsonl)
    out: str = "runs/train"  # run directory: adapter/ (best on dev), last/, checkpoints/, metrics.jsonl
    seed: Seed = 13  # seeds model init, option shuffling and batching
    # proper: log + 0.5·spherical − RPS; rlcd: perturbed-logit policy gradient; ce: soft cross-entropy
    objective: Objective = Field(default_factory=ProperObjective, discriminator="kind")
    lora: LoraConfig = Field(default_factory=LoraConfig)  # the LoRA adapter
    optim: OptimConfig = Field(default_factory=OptimConfig)  # optimizer, schedule and batch sizes
    prompt: RenderConfig = Field(default_factory=RenderConfig)  # how questions are rendered (saved with the adapter)
    shuffle_options: bool = True  # reshuffle choice options every epoch (score levels and yes / no keep their order)
    shared_prefix: bool = True  # questions on one state share the state's computation in a batch
    gradient_checkpointing: bool = True  # recompute activations in the backward pass: less memory, slower
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    eval_every: int = Field(50, ge=1)  # optimizer updates between dev evaluations
    # also evaluate the untrained adapter at update 0: the baseline line of metrics.jsonl (off: one dev pass fewer;
    # the last update is always evaluated, so a best adapter is always chosen)
    eval_at_start: bool = True
    dev_limit: int | None = Field(None, ge=1)  # score only the first N dev records during training
    # RUN/adapter: a later adapter replaces the best on dev unless its dev log loss is higher than the lowest so far
    # by more than this many standard errors of their question-by-question difference (0: only a strictly lower log
    # loss replaces it)
    best_margin: float = Field(1.0, ge=0.0)
    # stop early when the dev log loss stops improving (dev evaluations: every eval_every updates and each epoch's end)
    early_stopping: EarlyStopping = Field(default_factory=EarlyStopping)
    save_every: int = Field(50, ge=1)  # optimizer updates between resumable checkpoints
    keep_checkpoints: int = Field(2, ge=1)  # resumable checkpoints kept (the oldest are deleted)
    train_limit: int | None = Field(None, ge=1)  # train on the first N training records only
    tasks: list[str] | None = None  # train and evaluate on these tasks of the data directory only
    # show a task's records this many times per epoch (0.5: half of them, drawn anew each epoch; default 1), so a
    # small task gets its share of the updates (dev and test are not reweighted)
    task_weights: dict[str, float] = Field(default_factory=dict)
    eval_batch_size: int = Field(16, ge=1)  # prompts per forward pass in dev evaluation
    collapse_after: float = Field(0.3, ge=0, le=1)  # fraction of training after which collapse warnings count
    # experiment trackers (through Accelerate), one or a list: none, tensorboard, wandb, mlflow. They get the loss,
    # learning rate, gradient norm, throughput, dev metrics and collapse signals; TensorBoard writes to RUN/logs/
    report_to: list[Tracker] = ["none"]

    @field_validator("task_weights")
    @classmethod
    def _positive_weights(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {task: w for task, w in value.items() if not (0 < w <= 100)}
        if bad:
            raise ValueError(f"task weights must be > 0 and ≤ 100 (times per epoch): {bad}")
        return value

    @field_validator("report_to", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("report_to")
    @classmethod
    def _none_alone(cls, value: list[str]) -> list[str]:
        if "none" in value and len(value) > 1:
            raise ValueError(f"none cannot be combined with other trackers: {value}")
        return list(dict.fromkeys(value)) or ["none"]


# ------------------------------------------------------------------------------------------------------ writing


def dump_recipe(recipe: BaseModel, extra: dict[str, Any] | None = None) -> str:
    data = recipe.model_dump(mode="json")
    if extra:
        data = {**data, "_provenance": extra}
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


# --- calibrate / evaluate recipes ---------------------------------------------------------------------------
# The recipes of `mydecide calibrate` and `mydecide evaluate`, owned by calibration / evaluation.


class CalibrateRecipe(ScoringModel):
    data: str | None = None  # dev JSONL (never the training split)
    out: str = "runs/calibrate/temperatures.json"  # where temperatures.json is written
    by_bucket: bool = False  # also one temperature per (type, option-count bucket)
    min_rows: int = Field(30, ge=1)  # questions a type or bucket needs for its own temperature
    keep_fit: bool = False  # keep a fitted T even where it does not lower the dev log loss (default: T = 1 kept)
    level_maps: bool = True  # score questions: a level map per K after T, where dev holds enough and it helps
    alpha: float | None = Field(None, gt=0, lt=1)  # conformal sets missing the gold answer at most this often
    max_risk: float | None = Field(None, gt=0, lt=1)  # auto-act: error rate among answered questions at most this
    delta: float = Field(0.1, gt=0, lt=1)  # auto-act: with probability at least 1 − delta
    limit: int | None = Field(None, ge=1)  # only the first N records
    batch_size: int = Field(16, ge=1)  # prompts per forward pass
    shared_prefix: bool = True  # questions on one state share its computation


class Costs(Strict):
    """Payoffs of an auto-acted right / wrong answer and of escalating to a human."""

    right: float = 1.0  # payoff of an auto-acted right answer
    wrong: float = -3.0  # payoff of an auto-acted wrong answer
    escalate: float = -0.5  # payoff of handing the question to a human


COHERENCE_STATES = 40  # what `evaluate --coherence` sets `coherence` to


class EvalRecipe(ScoringModel):
    temperatures: str | None = None  # temperatures.json from `mydecide calibrate`
    data: list[str] = Field(default_factory=list)  # JSONL files, evaluated together
    out: str = "runs/eval"  # report.json, report.md, reliability.png, predictions.jsonl
    permutations: int = Field(4, ge=0)  # random option orders per question, besides the reversed one
    seed: Seed = 13  # of the option permutations and of the states coherence samples
    costs: Costs = Field(default_factory=Costs)
    thresholds: list[float] = Field(default_factory=lambda: [0.5, 0.6, 0.7, 0.8, 0.9, 0.95])  # auto-act table rows
    # JevBench's coherence laws (the jevbench package) on this many states of the data, sampled with the seed;
    # 0: off. `--coherence` is coherence=40. A state costs tens of requests (evaluate prints how many)
    coherence: int = Field(0, ge=0, strict=True)
    base: bool = True  # also score the base model (adapter disabled) when an adapter is given
    limit: int | None = Field(None, ge=1)  # only the first N records of each file
    batch_size: int = Field(16, ge=1)  # prompts per forward pass
    shared_prefix: bool = True  # questions on one state share its computation


# --- serve recipes ------------------------------------------------------------------------------------------
# The recipe of `mydecide serve` (and `mydecide predict`, which answers one request as the server would).


class Limits(Strict, frozen=True):
    """Request limits. All but the two token counts are counts of bytes or characters checked before anything is
    tokenised, so an oversized part is refused in milliseconds; the token counts are checked on the rendered prompts,
    before any forward pass (docs/wire.md)."""

    max_questions: int = Field(32, ge=1)  # questions per request
    # prompts scored per request: one per question, one per label of a set question, one per option of a question
    # scored per option (short continuations of one shared prefix: a 255-option choice must fit)
    max_prompts: int = Field(512, ge=1)
    max_state_chars: int = Field(100_000, ge=1)  # the state as the model reads it (a JSON object: its indented JSON)
    max_body_bytes: int = Field(1_000_000, ge=1)  # request body size in bytes
    max_name_chars: int = Field(200, ge=1)  # the model name, each question name
    max_instructions_chars: int = Field(4_000, ge=1)  # each question's instructions
    max_option_chars: int = Field(1_000, ge=1)  # each option id, option description, score level and yes / no text
    max_prompt_chars: int = Field(128_000, ge=1)  # question text over the request's prompts
    max_input_tokens: int = Field(32_000, ge=1)  # tokens of the rendered prompts: the state once plus every suffix
    max_prompt_tokens: int = Field(
        8_000, ge=1
    )  # tokens of one prompt: scored in one go, it bounds how long others wait
    min_choice_options: int = Field(MIN_CHOICE_OPTIONS, ge=1)  # options of a choice question, at least
    max_choice_options: int = Field(MAX_CHOICE_OPTIONS, ge=1)  # > 26: scored in groups + a final round
    min_score_levels: int = Field(MIN_SCORE_LEVELS, ge=1)  # levels of a score question, at least
    max_score_levels: int = Field(MAX_SCORE_LEVELS, ge=1)  # levels of a score question, at most


class BatchOptions(Strict, frozen=True):
    """How the server scores requests. ``baseline()`` is the naive server the benchmark compares against."""

    batching: bool = True  # collect concurrent requests into one forward pass
    shared_prefix: bool = True  # questions on one state share the state's computation
    packing: bool = True  # shared prefix as one padding-free row per state, where the model allows
    window_ms: float = Field(5.0, ge=0.0)  # how long the first request of a batch waits for company
    max_requests: int = Field(16, ge=1)  # requests per micro-batch
    max_prompts: int = Field(128, ge=1)  # prompts per micro-batch (a request may bring up to limits.max_prompts)
    forward_batch: int = Field(64, ge=1)  # prompts per forward pass inside a micro-batch (unpacked scoring)
    max_batch_tokens: int = Field(8192, ge=1)  # padded tokens per forward pass (packed scoring)
    max_pending: int = Field(256, ge=0)  # queued requests beyond which the server answers 503 (busy)
    # tokens scored in one go while other requests wait: a larger batch is scored in slices, and requests that
    # arrive meanwhile are answered between two slices
    slice_tokens: int = Field(8192, ge=1)

    @classmethod
    def baseline(cls) -> BatchOptions:
        """No micro-batching and no shared prefix: each question is its own prompt and its own forward pass."""
        return cls(batching=False, shared_prefix=False, packing=False, window_ms=0.0, max_requests=1, forward_batch=1)


class ServeRecipe(ScoringModel):
    temperatures: str | None = None  # temperatures.json from `mydecide calibrate`
    host: str = "127.0.0.1"  # interface to bind (loopback by default)
    port: int = Field(8741, ge=0, le=65535)  # TCP port
    name: str | None = None  # model name reported when a request names none (default: model, a path's last part)
    # Host header names answered ('*' for any); empty: any with an API key, else localhost, 127.0.0.1, ::1, host
    allowed_hosts: list[str] = Field(default_factory=list)
    shared_prefix: bool = True  # predict: questions on one state share its computation (serve: batching.*)
    request_timeout_s: float = Field(120.0, gt=0)  # seconds a request may wait for its answer before a 503
    limits: Limits = Field(default_factory=Limits)  # request limits (docs/wire.md)
    batching: BatchOptions = Field(default_factory=BatchOptions)  # micro-batching of concurrent requests
    # serve: what runs the forward passes (docs/serving.md); vllm: vLLM installed, a local base (an adapter served as a
    # per-request LoRA) or a merged model
    engine: Literal["torch", "vllm"] = "torch"
    device: str | None = None  # cpu, cuda, cuda:1 … (default: cuda when available)
    log_level: Literal["debug", "info", "warning", "error"] = "info"  # the server's log level
    # /v1/systemone noul answers also carry probabilities {yes, no} and confidence |2p - 1|, as vLLM's do
    noul_detail: bool = False


class MergeRecipe(Strict):
    """`mydecide merge`: fold an adapter into its base weights and check the merged model answers the same."""

    model: str | None = None  # base model; unset = the base recorded with the adapter
    adapter: str | None = None  # the LoRA adapter directory to merge (RUN/adapter)
    allow_other_base: bool = False  # merge even into a base whose weights are not the ones the adapter was trained on
    out: str | None = None  # the merged model directory to write
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"  # saved weights (auto: the base's own)
    tolerance: float = Field(1e-3, ge=0.0)  # largest allowed gap between merged and unmerged option probabilities
    check_data: str | None = None  # records JSONL whose first questions are checked (unset: built-in samples)
    check_n: int = Field(16, ge=1)  # how many records of check_data to check
    device: str | None = None  # cpu, cuda, cuda:1 … (default: cuda when available)
    overwrite: bool = False  # replace an earlier merge in out (never a directory merge did not write)
