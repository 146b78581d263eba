"""Typed recipes: unknown keys are errors naming the key and the file, dotted overrides parse as YAML scalars,
malformed overrides fail with a message naming the override."""

from __future__ import annotations

from pathlib import Path

import pytest

from mydecide.config import CeObjective, DataRecipe, ProperObjective, RlcdObjective, TrainRecipe, dump_recipe
from mydecide.recipe_loading import load_recipe
from mydecide.recipe_parsing import RecipeError, parse_overrides

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str, name: str = "train.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_follow_the_spec() -> None:
    recipe = load_recipe(None, model=TrainRecipe)
    assert recipe.objective == ProperObjective()
    assert (recipe.lora.r, recipe.lora.alpha, recipe.lora.dropout) == (32, None, 0.05)
    assert (recipe.optim.lr, recipe.optim.weight_decay, recipe.optim.warmup_ratio) == (1e-4, 0.0, 0.03)
    assert (recipe.optim.schedule, recipe.optim.max_grad_norm) == ("cosine", 1.0)
    assert (recipe.optim.batch_size, recipe.optim.grad_accum, recipe.optim.epochs) == (4, 8, 2.0)


def test_unknown_key_names_the_key_and_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "lora:\n  r: 8\n  rank: 8\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path, model=TrainRecipe)
    assert str(info.value) == f"{path}: lora.rank: unknown key"
    top = write(tmp_path, "learning_rate: 0.1\n", "top.yaml")
    with pytest.raises(RecipeError, match=r"top\.yaml: learning_rate: unknown key$"):
        load_recipe(top, model=TrainRecipe)


def test_an_unknown_key_given_as_an_override_is_an_error_too(tmp_path: Path) -> None:
    path = write(tmp_path, "seed: 1\n")  # blamed on the command line, not on the file
    with pytest.raises(
        RecipeError,
        match=r"^command-line override optim\.learning_rate=0\.1: optim\.learning_rate: "
        r"unknown key$",
    ):
        load_recipe(path, ["optim.learning_rate=0.1"], model=TrainRecipe)
    with pytest.raises(
        RecipeError,
        match=r"^command-line override optim\.lrr=0\.1: optim\.lrr: unknown key "
        r"\(did you mean optim\.lr\?\)$",
    ):
        load_recipe(path, ["optim.lrr=0.1"], model=TrainRecipe)


def test_dotted_overrides_parse_and_win_over_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "lora: {r: 8, dropout: 0.1}\noptim: {lr: 0.5}\nobjective: {kind: ce}\n")
    recipe = load_recipe(
        path,
        [
            "lora.r=16",
            "objective.kind=rlcd",
            "optim.lr=1e-3",
            "shuffle_options=false",
            "prompt.system_prompt=null",
            "lora.target_modules=[q_proj, v_proj]",
        ],
        model=TrainRecipe,
    )
    assert recipe.lora.r == 16 and recipe.lora.dropout == 0.1  # siblings in the file are kept
    assert recipe.objective == RlcdObjective()  # the tagged union switches kind and takes its defaults
    assert recipe.optim.lr == 1e-3 and isinstance(recipe.optim.lr, float)
    assert recipe.shuffle_options is False
    assert recipe.prompt.system_prompt is None
    assert recipe.lora.target_modules == ["q_proj", "v_proj"]
    assert load_recipe(path, model=TrainRecipe).objective == CeObjective()


def test_an_empty_mapping_override_clears_what_the_file_set(tmp_path: Path) -> None:
    path = write(tmp_path, "task_weights: {spans: 3}\nlora: {r: 8, dropout: 0.1}\n")
    assert load_recipe(path, model=TrainRecipe).task_weights == {"spans": 3}
    assert load_recipe(path, ["task_weights={}"], model=TrainRecipe).task_weights == {}  # not merged into
    assert load_recipe(path, ["lora={}"], model=TrainRecipe).lora.r == TrainRecipe().lora.r  # the defaults again
    assert load_recipe(path, ["task_weights={other: 2}"], model=TrainRecipe).task_weights == {"spans": 3, "other": 2}


def test_parse_overrides_nests_and_parses_yaml_scalars() -> None:
    assert parse_overrides(
        [
            "lora.r=16",
            "lora.alpha=32.5",
            "objective.kind=rlcd",
            "optim.lr=1e-3",
            "prompt.system_prompt=",
            "out=runs/a=b",
        ]
    ) == {
        "lora": {"r": 16, "alpha": 32.5},
        "objective": {"kind": "rlcd"},
        "optim": {"lr": 1e-3},  # a number with an exponent is a float (YAML 1.1 would keep the string "1e-3")
        "prompt": {"system_prompt": None},
        "out": "runs/a=b",
    }


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("lora.r", "override 'lora.r' must look like KEY=VALUE (for example lora.r=16)"),
        ("lora..r=16", "override 'lora..r=16': empty key segment"),
        ("=16", "override '=16': empty key segment"),
        ("lora.target_modules=[q_proj", "override 'lora.target_modules=[q_proj': value is not valid YAML"),
    ],
)
def test_malformed_overrides(override: str, message: str) -> None:
    with pytest.raises(RecipeError) as info:
        parse_overrides([override])
    assert str(info.value).startswith(message)


def test_an_override_below_a_scalar_is_refused() -> None:
    with pytest.raises(RecipeError, match=r"^override 'seed\.x=1': 'seed' is not a section$"):
        parse_overrides(["seed=3", "seed.x=1"])


def test_bad_values_name_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, "seed: 1\n")
    with pytest.raises(
        RecipeError,
        match=r"^command-line override lora\.r=0: lora\.r: Input should be greater than "
        r"or equal to 1",
    ):
        load_recipe(path, ["lora.r=0"], model=TrainRecipe)
    with pytest.raises(RecipeError, match=r"train\.yaml: lora\.r: Input should be greater than or equal to 1"):
        load_recipe(write(tmp_path, "lora: {r: 0}\n"), model=TrainRecipe)
    with pytest.raises(RecipeError, match=r"override optim\.lr=fast: optim\.lr: Input should be a valid number"):
        load_recipe(path, ["optim.lr=fast"], model=TrainRecipe)
    with pytest.raises(RecipeError, match=r"objective: Input tag 'sgd' found using 'kind' does not match"):
        load_recipe(path, ["objective.kind=sgd"], model=TrainRecipe)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("lora.r=true", "lora.r: Input should be a valid integer, not true"),
        ("lora.r=8.0", "lora.r: Input should be a valid integer, not 8.0"),
        ('seed="13"', 'seed: Input should be a valid integer, not "13"'),
        ("gradient_checkpointing=1", "gradient_checkpointing: Input should be a valid boolean, not 1"),
        ("optim.lr=true", "optim.lr: Input should be a valid number, not true"),
        ("out=7", "out: Input should be a valid string, not 7"),
    ],
)
def test_a_value_of_another_type_is_refused_not_converted(override: str, message: str) -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe(None, [override], model=TrainRecipe)
    assert str(info.value) == f"command-line override {override}: {message}"


def test_numbers_with_an_exponent_are_numbers_in_a_file_too(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path, "optim: {lr: 3e-4, weight_decay: 1.5e-2, epochs: 2}\n"), model=TrainRecipe)
    assert (recipe.optim.lr, recipe.optim.weight_decay, recipe.optim.epochs) == (3e-4, 1.5e-2, 2.0)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("sources=[{kind: jsonl, limit: true}]", "sources.0.limit: Input should be a valid integer, not true"),
        ("cap_per_task=0", "cap_per_task: a cap is a whole number of rows, at least 1, not 0"),
        ("cap_per_task=true", "cap_per_task: a cap is a whole number of rows, at least 1, not true"),
        ("cap_per_task={spam: 0}", "cap_per_task: a cap is a whole number of rows, at least 1, not 0 (task spam)"),
        ("split.dev_fraction=true", "split.dev_fraction: Input should be a valid number, not true"),
    ],
)
def test_nonsense_data_recipe_values_name_the_key(override: str, message: str) -> None:
    base = [] if override.startswith("sources") else ["sources=[{kind: jsonl}]"]
    with pytest.raises(RecipeError) as info:
        load_recipe(None, [*base, override], model=DataRecipe)
    assert str(info.value) == f"command-line override {override}: {message}"


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"nope\.yaml: no such recipe file$"):
        load_recipe(tmp_path / "nope.yaml", model=TrainRecipe)
    with pytest.raises(RecipeError, match=r"list\.yaml: a recipe must be a YAML mapping$"):
        load_recipe(write(tmp_path, "- a\n- b\n", "list.yaml"), model=TrainRecipe)
    with pytest.raises(RecipeError, match=r"bad\.yaml: not valid YAML"):
        load_recipe(write(tmp_path, "lora: {r: 8\n", "bad.yaml"), model=TrainRecipe)
    assert load_recipe(write(tmp_path, "", "empty.yaml"), model=TrainRecipe) == TrainRecipe()


def test_a_dumped_recipe_loads_back_to_the_same_recipe(tmp_path: Path) -> None:
    recipe = load_recipe(None, ["objective.kind=rlcd", "lora.r=8", "optim.max_steps=3"], model=TrainRecipe)
    path = write(tmp_path, dump_recipe(recipe), "resolved.yaml")
    assert load_recipe(path, model=TrainRecipe) == recipe


@pytest.mark.parametrize("path", sorted((REPO / "recipes" / "train").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_train_recipe_loads(path: Path) -> None:
    assert isinstance(load_recipe(path, model=TrainRecipe), TrainRecipe)


def test_a_data_recipe_that_still_sets_augment_shuffle_options_gets_one_line_saying_why(tmp_path: Path) -> None:
    path = write(tmp_path, "sources: [{kind: jsonl}]\naugment:\n  shuffle_options: true\n", "data.yaml")
    with pytest.raises(RecipeError) as info:
        load_recipe(path, model=DataRecipe)
    message = str(info.value)
    assert message.startswith(f"{path}: augment: shuffle_options was removed (it changed nothing")
    assert "\n" not in message and "training recipe's shuffle_options" in message
    with pytest.raises(RecipeError, match=r"^command-line override augment\.shuffle_options=false: augment: "):
        load_recipe(None, ["sources=[{kind: jsonl}]", "augment.shuffle_options=false"], model=DataRecipe)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("seed=-1", "seed: Input should be greater than or equal to 0"),
        ("seed=4294967296", "seed: Input should be less than or equal to 4294967295"),
        ("optim.lr=.inf", "optim.lr: Input should be a finite number"),
        ("optim.lr=.nan", "optim.lr: Input should be a finite number"),
        ("optim.epochs=.inf", "optim.epochs: Input should be a finite number"),
        ("optim.epochs=1e300", "optim.epochs: Input should be less than or equal to 1000000"),
        ("prompt.max_state_tokens=0", "prompt.max_state_tokens: Input should be greater than or equal to 1"),
    ],
)
def test_values_no_library_can_use_are_refused_before_use(override: str, message: str) -> None:
    """Seeds numpy and datasketch refuse, infinite numbers, a step count past any run, an empty state (issue 64)."""
    with pytest.raises(RecipeError) as info:
        load_recipe(None, [override], model=TrainRecipe)
    assert str(info.value) == f"command-line override {override}: {message}"
    assert load_recipe(None, ["seed=4294967295"], model=TrainRecipe).seed == 2**32 - 1


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("seed: " + "9" * 5000, "a value too large to read (Exceeds the limit (4300 digits) for integer string "),
        ("a: " + "[" * 100_000, "nested too deeply to read"),
    ],
    ids=["huge integer", "recursion bomb"],
)
def test_yaml_python_cannot_hold_is_one_line(tmp_path: Path, text: str, problem: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path, model=TrainRecipe)
    assert str(info.value).startswith(f"{path}: not valid YAML ({problem}")
    with pytest.raises(RecipeError) as info:
        load_recipe(None, ["seed=" + "9" * 5000], model=TrainRecipe)
    assert str(info.value) == (
        f"override 'seed={'9' * 74}…': value is not valid YAML (a value too large to read (Exceeds the limit "
        "(4300 digits) for integer string conversion))"
    )


def test_an_unknown_key_with_a_look_alike_or_invisible_character_says_so(tmp_path: Path) -> None:
    """``split\\u200b`` or a Cyrillic ``ѕources`` looks like the key on screen; "did you mean split?" did not say
    why it was unknown (issue 64). The key is shown escaped, with the character named."""
    zero_width = write(tmp_path, "sources: [{kind: jsonl, path: a.jsonl}]\nsplit\u200b: {seed: 1}\n", "a.yaml")
    with pytest.raises(RecipeError) as info:
        load_recipe(zero_width, model=DataRecipe)
    assert str(info.value) == (
        f"{zero_width}: split\\u200b: unknown key: it holds U+200B ZERO WIDTH SPACE, invisible; in plain letters it "
        "reads split: retype it"
    )
    cyrillic = write(tmp_path, "\u0455ources: [{kind: jsonl, path: a.jsonl}]\n", "b.yaml")
    with pytest.raises(RecipeError) as info:  # and no "sources: Field required" beside it
        load_recipe(cyrillic, model=DataRecipe)
    assert str(info.value) == (
        f"{cyrillic}: \\u0455ources: unknown key: it holds U+0455 CYRILLIC SMALL LETTER DZE, a look-alike of 's'; in "
        "plain letters it reads sources: retype it"
    )
    with pytest.raises(RecipeError) as info:
        load_recipe(None, ["optim.warmup_ratio\u00e9=0.1"], model=TrainRecipe)
    assert str(info.value) == (
        "command-line override optim.warmup_ratio\u00e9=0.1: optim.warmup_ratio\\xe9: unknown key: it holds U+00E9 "
        "LATIN SMALL LETTER E WITH ACUTE, not ASCII (did you mean optim.warmup_ratio?)"
    )


def test_a_dotted_override_below_a_value_the_file_sets_whole_is_refused(tmp_path: Path) -> None:
    """``cap_per_task.alpha=5`` over ``cap_per_task: 7`` replaced the one cap by {alpha: 5}: every other task went
    uncapped, and the manifest recorded the map, not the recipe's cap (issue 64)."""
    path = write(tmp_path, "sources: [{kind: jsonl, path: a.jsonl}]\ncap_per_task: 7\n", "data.yaml")
    with pytest.raises(RecipeError) as info:
        load_recipe(path, ["cap_per_task.alpha=5"], model=DataRecipe)
    assert str(info.value) == (
        f"command-line override cap_per_task.alpha=5: cap_per_task is 7 in {path}, not a section: an override sets "
        "it whole (cap_per_task=...)"
    )
    with pytest.raises(RecipeError, match=r"sources is a list in .*data\.yaml, not a section"):
        load_recipe(path, ["sources.0.path=b.jsonl"], model=DataRecipe)
    assert load_recipe(path, ["cap_per_task={alpha: 5}"], model=DataRecipe).cap_per_task == {"alpha": 5}
    no_cap = write(tmp_path, "sources: [{kind: jsonl, path: a.jsonl}]\n", "plain.yaml")
    assert load_recipe(no_cap, ["cap_per_task.alpha=5"], model=DataRecipe).cap_per_task == {"alpha": 5}
