"""Data preparation: converter discovery, dedup, decontamination, splits, augmentation, the pipeline.

``prepare.prepare(recipe, out)`` runs the whole pipeline; the other modules are its steps, each a small set of
functions over records or texts that can be used and tested alone.
"""
