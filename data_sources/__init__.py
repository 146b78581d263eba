"""Converter plugins: one module per data source, named after the source's ``kind`` in a recipe.

Each public module (a name without a leading underscore) has a docstring whose first line describes the source
and a ``convert(path=None, *, limit=None, seed=13, ...)`` generator that yields decision records (docs/records.md),
each with ``_where`` ("file:line" or "file:row") locating its source row. A row that cannot be converted is
yielded as ``{"_where", "_error", "raw"}`` so that ``prepare`` counts it and writes it to rejects.jsonl.
Modules whose names start with an underscore are shared code, not sources. Small real samples with their
licenses are in ``samples/``.
"""
