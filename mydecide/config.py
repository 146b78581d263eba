"""Typed recipes: pydantic models (unknown keys are errors) and ``load_recipe(path, overrides)``.

A recipe is a YAML file from ``recipes/``; dotted ``KEY=VALUE`` overrides from the command line are applied before
validation (``lora.r=16``, ``objective.kind=rlcd``). Values are parsed as YAML scalars (``1e-4``, ``true``, ``[a,b]``).
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from mydecide.scoring.render import OptionForm, RenderConfig


class RecipeError(ValueError):
    """A recipe file or override is invalid; the message names the file and the key."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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


class CeThenProperObjective(Strict):
    """Warm start: soft cross-entropy for the first ``ce_fraction`` of updates, then the proper composite."""

    kind: Literal["ce_then_proper"] = "ce_then_proper"
    ce_fraction: float = Field(0.5, gt=0, lt=1)


Objective = ProperObjective | CeObjective | RlcdObjective | CeThenProperObjective
Tracker = Literal["none", "tensorboard", "wandb", "mlflow"]


class OptimConfig(Strict):
    lr: float = Field(1e-4, gt=0)  # peak learning rate (AdamW)
    weight_decay: float = Field(0.0, ge=0)  # AdamW weight decay
    warmup_ratio: float = Field(0.03, ge=0, lt=1)  # share of the updates spent warming up the learning rate
    schedule: Literal["cosine", "linear", "constant"] = "cosine"  # learning-rate schedule after warm-up
    max_grad_norm: float = Field(1.0, gt=0)  # gradient clipping
    batch_size: int = Field(4, ge=1)  # questions per micro-batch (per process)
    grad_accum: int = Field(8, ge=1)  # micro-batches per optimizer update
    epochs: float = Field(2.0, gt=0)  # passes over the training split (fractions allowed)
    max_steps: int | None = Field(None, ge=1)  # optimizer updates; overrides epochs when set


class TrainRecipe(Strict):
    model: str = "smollm2-135m"  # base model: a local HF directory, a hub name, a .gguf file or smollm2-135m
    data: str | None = None  # a prepare output directory (train.jsonl, dev.jsonl)
    out: str = "runs/train"  # run directory: adapter/ (best on dev), last/, checkpoints/, metrics.jsonl
    seed: int = 13  # seeds model init, option shuffling and batching
    # proper: log + 0.5·spherical − RPS; rlcd: perturbed-logit policy gradient; ce: soft cross-entropy;
    # ce_then_proper: cross-entropy first, then proper
    objective: Objective = Field(default_factory=ProperObjective, discriminator="kind")
    lora: LoraConfig = Field(default_factory=LoraConfig)  # the LoRA adapter
    optim: OptimConfig = Field(default_factory=OptimConfig)  # optimizer, schedule and batch sizes
    prompt: RenderConfig = Field(default_factory=RenderConfig)  # how questions are rendered (saved with the adapter)
    shuffle_options: bool = True  # reshuffle choice options every epoch (score levels and yes / no keep their order)
    # share of choice records shown in a random order each epoch (the rest keep the given order)
    shuffle_fraction: float = Field(1.0, ge=0.0, le=1.0)
    # each choice record shown in this many rotations of its order, together in one batch (sharing its state)
    orders_per_record: int = Field(1, ge=1, le=26)
    # share of the updates trained with every option in its given order before shuffling (and rotations) start
    shuffle_start: float = Field(0.0, ge=0.0, lt=1.0)
    shared_prefix: bool = True  # questions on one state share the state's computation in a batch
    gradient_checkpointing: bool = True  # recompute activations in the backward pass: less memory, slower
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    eval_every: int = Field(50, ge=1)  # optimizer updates between dev evaluations
    dev_limit: int | None = Field(None, ge=1)  # score only the first N dev records during training
    save_every: int = Field(50, ge=1)  # optimizer updates between resumable checkpoints
    keep_checkpoints: int = Field(2, ge=1)  # resumable checkpoints kept (the oldest are deleted)
    train_limit: int | None = Field(None, ge=1)  # train on the first N training records only
    tasks: list[str] | None = None  # train and evaluate on these tasks of the data directory only
    eval_batch_size: int = Field(16, ge=1)  # prompts per forward pass in dev evaluation
    collapse_after: float = Field(0.3, ge=0, le=1)  # fraction of training after which collapse warnings count
    # experiment trackers (through Accelerate), one or a list: none, tensorboard, wandb, mlflow. They get the loss,
    # learning rate, gradient norm, throughput, dev metrics and collapse signals; TensorBoard writes to RUN/logs/
    report_to: list[Tracker] = ["none"]

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


# ------------------------------------------------------------------------------------------------------ loading

R = TypeVar("R", bound=BaseModel)


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """``["lora.r=16", "objective.kind=rlcd"]`` → nested dict."""
    nested: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise RecipeError(f"override {item!r} must look like KEY=VALUE (for example lora.r=16)")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise RecipeError(f"override {item!r}: empty key segment")
        try:
            value = load_yaml(raw) if raw.strip() else None
        except yaml.YAMLError as err:
            raise RecipeError(f"override {item!r}: {yaml_problem(err, 'value is not valid YAML')}") from None
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise RecipeError(f"override {item!r}: {part!r} is not a section")
        node[parts[-1]] = value
    return nested


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load`` keeps the last of two equal keys, so a setting would vanish silently; refuse instead."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` entries may be overridden on purpose
                continue
            key = self.construct_object(key_node, deep=True)
            with contextlib.suppress(TypeError):  # an unhashable key: the base constructor says so
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)


def load_yaml(text: str) -> Any:
    """Safe YAML (no tags that build objects) with duplicate keys refused."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader: builds no objects


def yaml_problem(err: yaml.YAMLError, invalid: str = "not valid YAML") -> str:
    """A YAML error in one line: ``duplicate key 'seed' (line 4)``, ``not valid YAML (line 2: expected ',')``."""
    mark = getattr(err, "problem_mark", None)
    line = f"line {mark.line + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or " ".join(str(err).split())
    if problem.startswith("duplicate key"):
        return f"{problem} ({line})" if line else problem
    return f"{invalid} ({line}: {problem})" if line else f"{invalid} ({problem})"


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"{path}: no such recipe file")
    try:
        data = load_yaml(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: {yaml_problem(err)}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping")
    return data


def load_recipe(path: str | Path | None, overrides: Sequence[str] = (), *, model: type[R]) -> R:
    """Read, override and validate a recipe; errors name the file or the command-line override, and the key."""
    from_file = read_yaml(path) if path is not None else {}
    data = merge(from_file, parse_overrides(overrides))
    try:
        return model.model_validate(data)
    except ValidationError as err:
        where = str(path) if path is not None else "recipe"
        other = recipe_kind(from_file, exclude=model) if path is not None else None
        if other is not None and any(
            len(e["loc"]) == 1 and e["type"] in ("extra_forbidden", "missing") for e in err.errors()
        ):
            kind, verb = other
            article = "an" if kind[0] in "aeiou" else "a"
            raise RecipeError(f"{where}: this is {article} {kind} recipe: use `mydecide {verb}`") from None
        raise RecipeError(describe_errors(err, model, where, overrides)) from None


def validate_recipe(model: type[R], data: dict[str, Any], where: str = "command line") -> R:
    """Validate ``data`` (a recipe updated by command-line options) with the messages of :func:`load_recipe`."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise RecipeError(describe_errors(err, model, where)) from None


# recipe model name → (what the recipe is, the command that takes it); filled in below the recipe models
RECIPE_COMMANDS: dict[str, tuple[str, str]] = {}


def recipe_kind(data: dict[str, Any], *, exclude: type[BaseModel]) -> tuple[str, str] | None:
    """(kind, command) of the first other recipe model that ``data`` is valid for, or None."""
    for name, kind in RECIPE_COMMANDS.items():
        other = globals()[name]
        if other is exclude:
            continue
        try:
            other.model_validate(data)
        except ValidationError:
            continue
        return kind
    return None


def describe_errors(err: ValidationError, model: type[BaseModel], where: str, overrides: Sequence[str] = ()) -> str:
    """One line for all of a validation error's problems, each blamed on the override that set the key (when
    one did) or on ``where``; an unknown key gets a did-you-mean among the keys of its section."""
    typed = [(item, item.split("=", 1)[0].strip()) for item in overrides if "=" in item]
    problems = []
    for e in err.errors():
        loc = tuple(e["loc"])
        keys, parent = section_keys(model, loc[:-1])
        message = e["msg"]
        if e["type"] == "extra_forbidden":
            message = "unknown key"
            close = difflib.get_close_matches(str(loc[-1]), keys, n=1, cutoff=0.6)
            if close:
                message += f" (did you mean {'.'.join([*parent, close[0]])}?)"
        written = ".".join([*parent, str(loc[-1])] if loc else parent)
        key = written or "(top)"
        blamed = next((item for item, dotted in typed if _same_key(dotted, written)), None)
        problems.append(f"command-line override {blamed}: {key}: {message}" if blamed else f"{where}: {key}: {message}")
    return "; ".join(problems)


def _same_key(dotted: str, written: str) -> bool:
    """Whether an override of ``dotted`` set the key ``written`` (itself, a section holding it, or a key below a
    value that is not a section)."""
    return bool(written) and (written == dotted or written.startswith(dotted + ".") or dotted.startswith(written + "."))


def section_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[list[str], list[str]]:
    """The keys of the recipe section at a validation error's ``loc`` ([] when unknown), and ``loc`` as the user
    writes it: without the tags of tagged unions."""
    current: Any = model
    written: list[str] = []
    for part in loc:
        if isinstance(part, int):  # an item of a list: shown, as in sources.0.kind
            written.append(str(part))
            continue
        if isinstance(current, list):  # a tagged union: the part is the tag
            current = next((m for m in current if m.model_fields["kind"].default == part), None)
            continue
        written.append(str(part))
        is_model = isinstance(current, type) and issubclass(current, BaseModel)
        field = current.model_fields.get(part) if is_model else None
        members = _models_in(field.annotation) if field is not None else []
        current = members[0] if len(members) == 1 else members or None
    is_model = isinstance(current, type) and issubclass(current, BaseModel)
    return (list(current.model_fields) if is_model else []), written


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in get_args(annotation) for m in _models_in(a)]


def dump_recipe(recipe: BaseModel, extra: dict[str, Any] | None = None) -> str:
    data = recipe.model_dump(mode="json")
    if extra:
        data = {**data, "_provenance": extra}
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


# --- data recipes (prepare) ---------------------------------------------------------------------------------
# The recipe of `mydecide prepare`, owned by the data-preparation code.


class SourceSpec(Strict):
    """One converter run: ``kind`` names a module in ``data_sources/``; ``options`` go to its ``convert``."""

    kind: str  # a converter module in data_sources/ (`mydecide prepare --list-sources`)
    path: str | None = None  # None: the converter's default (its bundled sample, or the hub when online)
    name: str | None = None  # label in the manifest and rejects.jsonl; default: kind (kind#i when repeated)
    limit: int | None = Field(None, ge=0)  # read at most this many rows of the source
    seed: int = 13  # for converters that sample
    options: dict[str, Any] = Field(default_factory=dict)  # converter-specific keyword arguments


class NearDedupConfig(Strict):
    """MinHash LSH near-duplicate removal on the state text of records that ask the same question."""

    enabled: bool = True  # false: exact dedup only
    threshold: float = Field(0.7, gt=0.0, le=1.0)  # Jaccard of the shingle sets (candidates verified exactly)
    shingle: Literal["char", "word"] = "char"  # n-grams of characters of the normalised text, or of words
    ngram: int = Field(5, ge=1, le=32)  # characters (shingle: char) or words (shingle: word) per shingle
    num_perm: int = Field(128, ge=16, le=1024)  # MinHash permutations
    seed: int = 1  # of the MinHash permutations
    keep_slot_changes: bool = True  # keep short look-alikes differing in a number, a name or a negation


class DedupConfig(Strict):
    exact: bool = True  # normalised key: case-folded, whitespace-collapsed state + instructions + options
    near: NearDedupConfig = Field(default_factory=NearDedupConfig)


class DecontaminationConfig(Strict):
    """How training rows are matched against the ``decontaminate_against`` files (state text only)."""

    exact: bool = True  # drop training rows whose normalised state equals an eval item's
    near: bool = True  # MinHash with dedup.near's shingles; threshold below or dedup.near.threshold
    near_threshold: float | None = Field(None, gt=0.0, le=1.0)
    ngram: int = Field(13, ge=0, le=64)  # n-gram overlap length in words; 0 turns the check off
    # a text shorter than ngram words, with at least this many, overlaps when it appears whole inside the
    # other (an eval item inside a training row, or a row inside an eval item); 0 turns this off
    whole_min_words: int = Field(8, ge=0, le=64)


class SplitConfig(Strict):
    heldout_tasks: list[str] = Field(default_factory=list)  # whole tasks → heldout_tasks.jsonl
    dev_fraction: float = Field(0.05, ge=0.0, lt=1.0)  # share of each trained task's rows in dev.jsonl
    test_fraction: float = Field(0.0, ge=0.0, lt=1.0)  # > 0 also writes test.jsonl (trained tasks only)
    seed: int = 13  # of the stable hash that assigns rows to splits

    @model_validator(mode="after")
    def _fractions(self) -> SplitConfig:
        if self.dev_fraction + self.test_fraction >= 1.0:
            raise ValueError(
                f"dev_fraction + test_fraction must leave rows for training, got "
                f"{self.dev_fraction} + {self.test_fraction}"
            )
        return self


class AugmentConfig(Strict):
    """Augmentation of the train split only; each field is the fraction of eligible rows that get a copy."""

    anonymize_options: float = Field(0.0, ge=0.0, le=1.0)  # choice: ids → option_1.. (descriptions kept)
    drop_distractors: float = Field(0.0, ge=0.0, le=1.0)  # choice with > 2 options: drop zero-mass options
    paraphrase_instructions: float = Field(0.0, ge=0.0, le=1.0)  # swap instructions for a listed variant
    paraphrases: dict[str, list[str]] = Field(default_factory=dict)  # exact instructions → variants
    reword_instructions: float = Field(0.0, ge=0.0, le=1.0)  # any type: instructions in a generic rewording
    # schema resampling (Vela 2.0): anonymize_options, drop_distractors and reword_instructions at once
    schema_resampling: float = Field(0.0, ge=0.0, le=1.0)
    # consistency copies (coherence laws by example): `consistency` is both of the next two at once
    consistency: float = Field(0.0, ge=0.0, le=1.0)
    negate_noul: float = Field(0.0, ge=0.0, le=1.0)  # noul: the negated question, target complemented
    rename_options: float = Field(0.0, ge=0.0, le=1.0)  # choice: ids → random neutral codes (descriptions kept)
    negation_templates: list[str] | None = None  # "{instructions}" templates; None: augment.NEGATION_TEMPLATES
    seed: int = 13  # which rows get augmented copies

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "shuffle_options" in data:
            raise PydanticCustomError(
                "removed_key",
                "shuffle_options was removed (it changed nothing: `mydecide train` reshuffles choice options every "
                "epoch, see the training recipe's shuffle_options); delete it",
            )
        return data

    @model_validator(mode="after")
    def _paraphrases(self) -> AugmentConfig:
        if self.paraphrase_instructions > 0 and not any(self.paraphrases.values()):
            raise ValueError("paraphrase_instructions > 0 needs paraphrases: {instructions: [variant, ...]}")
        for template in self.negation_templates or []:
            if template.count("{instructions}") != 1 or template.replace("{instructions}", "").count("{"):
                raise ValueError(
                    f"negation template {template!r} must contain {{instructions}} once and no other {{…}} field"
                )
        if self.negation_templates is not None and not self.negation_templates:
            raise ValueError("negation_templates must list at least one template (or be left out)")
        return self


class DataRecipe(Strict):
    sources: list[SourceSpec] = Field(min_length=1)  # the converter runs whose rows are prepared
    decontaminate_against: list[str | SourceSpec] = Field(default_factory=list)  # JSONL paths or sources
    decontamination: DecontaminationConfig = Field(default_factory=DecontaminationConfig)
    dedup: DedupConfig = Field(default_factory=DedupConfig)  # duplicate removal within the sources
    cap_per_task: int | dict[str, int] | None = None  # one cap for every task, or {task: cap}
    split: SplitConfig = Field(default_factory=SplitConfig)  # held-out tasks, dev and test shares
    augment: AugmentConfig = Field(default_factory=AugmentConfig)
    out: str = "runs/data"  # output directory (train / dev / test / heldout_tasks / rejects JSONL, manifest)


# --- calibrate / evaluate recipes ---------------------------------------------------------------------------
# The recipes of `mydecide calibrate` and `mydecide evaluate`, owned by calibration / evaluation.


class CalibrateRecipe(Strict):
    model: str = "smollm2-135m"  # base model, as in the training recipe
    adapter: str | None = None  # a LoRA adapter directory (RUN/adapter)
    data: str | None = None  # dev JSONL (never the training split)
    out: str = "runs/calibrate/temperatures.json"  # where temperatures.json is written
    by_bucket: bool = False  # also one temperature per (type, option-count bucket)
    min_rows: int = Field(30, ge=1)  # questions a type or bucket needs for its own temperature
    limit: int | None = Field(None, ge=1)  # only the first N records
    batch_size: int = Field(16, ge=1)  # prompts per forward pass
    shared_prefix: bool = True  # questions on one state share its computation
    # how choice options are scored: letters | per_option; unset = as the adapter was trained (an error if it
    # contradicts the adapter's saved form)
    option_form: OptionForm | None = None


class Costs(Strict):
    """Payoffs of an auto-acted right / wrong answer and of escalating to a human."""

    right: float = 1.0  # payoff of an auto-acted right answer
    wrong: float = -3.0  # payoff of an auto-acted wrong answer
    escalate: float = -0.5  # payoff of handing the question to a human


class EvalRecipe(Strict):
    model: str = "smollm2-135m"  # base model, as in the training recipe
    adapter: str | None = None  # a LoRA adapter directory (RUN/adapter)
    temperatures: str | None = None  # temperatures.json from `mydecide calibrate`
    data: list[str] = Field(default_factory=list)  # JSONL files, evaluated together
    out: str = "runs/eval"  # report.json, report.md, reliability.png, predictions.jsonl
    permutations: int = Field(4, ge=0)  # random option orders per question, besides the reversed one
    seed: int = 13  # of the option permutations
    costs: Costs = Field(default_factory=Costs)
    thresholds: list[float] = Field(default_factory=lambda: [0.5, 0.6, 0.7, 0.8, 0.9, 0.95])  # auto-act table rows
    coherence: bool = False  # negation, option renaming and context-independence checks
    base: bool = True  # also score the base model (adapter disabled) when an adapter is given
    limit: int | None = Field(None, ge=1)  # only the first N records of each file
    batch_size: int = Field(16, ge=1)  # prompts per forward pass
    shared_prefix: bool = True  # questions on one state share its computation
    # how choice options are scored: letters | per_option; unset = as the adapter was trained (an error if it
    # contradicts the adapter's saved form)
    option_form: OptionForm | None = None


RECIPE_COMMANDS.update(
    {
        "DataRecipe": ("data", "prepare"),
        "TrainRecipe": ("training", "train"),
        "CalibrateRecipe": ("calibration", "calibrate"),
        "EvalRecipe": ("evaluation", "evaluate"),
    }
)
