"""A ``datasets`` ClassLabel column read by its names (the datasets source): which columns are ClassLabels, and an
index (or a list of them) turned into its name."""

from __future__ import annotations

from typing import Any

from data_sources._columns import RowError


def class_names(features: Any) -> dict[str, list[str]]:
    """``{column: names}`` for the ClassLabel columns (and lists of ClassLabel) of a table's features."""
    from datasets import ClassLabel

    found = {}
    for column, feature in dict(features).items():
        inner = getattr(feature, "feature", None)
        if isinstance(feature, ClassLabel):
            found[column] = list(feature.names)
        elif isinstance(inner, ClassLabel):
            found[column] = list(inner.names)
    return found


def named(value: Any, names: list[str], column: str) -> Any:
    """A ClassLabel index (or a list of them) as its name; -1 (no label) becomes None."""
    if isinstance(value, list):
        return [named(v, names, column) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        if value == -1:
            return None
        if not 0 <= value < len(names):
            raise RowError(f"column {column!r}: class {value} is outside 0..{len(names) - 1}")
        return names[value]
    return value
