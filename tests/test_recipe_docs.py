"""docs/recipes.md is generated from the recipe models: the committed page must equal a fresh rendering, and the
rendering must name every key a recipe accepts, with its default and the comment written beside it."""

from __future__ import annotations

from pydantic import BaseModel, Field

from mydecide import config
from mydecide.recipe_docs import DOCS_PAGE, EXPERIMENTAL_INTRO, RECIPES, experimental_keys, field_comments, main, render


def test_the_committed_page_is_the_generated_one() -> None:
    assert DOCS_PAGE.read_text(encoding="utf-8") == render(), "run `python -m mydecide.recipe_docs` (make docs)"
    assert main(["--check"]) == 0


def leaf_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    keys = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys |= leaf_keys(annotation, f"{prefix}{name}.")
        elif name != "objective":
            keys.add(f"{prefix}{name}")
    return keys


def test_every_recipe_key_is_on_the_page() -> None:
    page = render()
    for _, name, _ in RECIPES:
        for key in leaf_keys(getattr(config, name)):
            assert f"| `{key}` |" in page, key
    for key in ("objective.kind", "objective.group_size", "sources[].kind", "prompt.max_state_tokens"):
        assert f"| `{key}` |" in page, key


def test_a_new_field_and_its_comment_appear_in_the_rendering(monkeypatch) -> None:
    class Extra(config.Strict):
        width: int = 3  # how wide the thing is

    monkeypatch.setattr(config, "CalibrateRecipe", Extra)
    assert field_comments(Extra) == {"width": "how wide the thing is"}
    assert "| `width` | int | 3 | how wide the thing is |" in render()
    assert render() != DOCS_PAGE.read_text(encoding="utf-8")
    assert main(["--check"]) == 1


def test_experimental_keys_get_their_own_table_with_their_date() -> None:
    page = render()
    prepare = page.split("## `mydecide prepare`", 1)[1].split("\n## ", 1)[0]
    main_table, experimental = prepare.split("Experimental keys:", 1)
    marked = {
        "anonymize_options",
        "drop_distractors",
        "paraphrase_instructions",
        "paraphrases",
        "reword_instructions",
        "drop_span_labels",
        "rename_span_labels",
        "paraphrase_span_labels",
        "span_label_paraphrases",
        "add_absent_span_labels",
        "absent_span_labels",
        "schema_resampling",
        "negate_noul",
        "rename_options",
    }
    assert experimental_keys(config.DataRecipe) == {f"augment.{key}": "2026-12-21" for key in marked}
    for key in marked:
        assert f"| `augment.{key}` |" not in main_table, key
        assert f"| `augment.{key}` |" in experimental, key
    assert (
        "| `augment.drop_distractors` | float | 0.0 | choice with > 2 options: drop zero-mass options" in experimental
    )
    assert experimental.count("| 2026-12-21 |\n") == len(marked)
    for key in ("negation_templates", "seed", "soft_targets"):  # measured, or a mechanism
        assert f"| `augment.{key}` |" in main_table, key
    assert "Experimental keys:" not in page.split("## `mydecide train`", 1)[1]  # no other command has one yet


def test_a_field_marked_experimental_moves_to_that_table(monkeypatch) -> None:
    class Extra(config.Strict):
        width: int = 3  # how wide the thing is
        depth: int = Field(2, json_schema_extra={"tier": "experimental", "decide_by": "2027-01-05"})  # how deep

    monkeypatch.setattr(config, "CalibrateRecipe", Extra)
    calibrate = render().split("## `mydecide calibrate`", 1)[1].split("\n## ", 1)[0]
    assert calibrate.endswith(
        "| `width` | int | 3 | how wide the thing is |\n\n"
        f"{EXPERIMENTAL_INTRO}\n\n| key | type | default | meaning | measure or delete by |\n|---|---|---|---|---|\n"
        "| `depth` | int | 2 | how deep | 2027-01-05 |\n"
    )
