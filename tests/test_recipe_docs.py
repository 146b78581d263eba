"""docs/recipes.md is generated from the recipe models: the committed page must equal a fresh rendering, and the
rendering must name every key a recipe accepts, with its default and the comment written beside it."""

from __future__ import annotations

from pydantic import BaseModel

from mydecide import config
from mydecide.recipe_docs import DOCS_PAGE, RECIPES, field_comments, main, render


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
