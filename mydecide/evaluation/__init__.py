"""Evaluation: how good, how calibrated and how robust a decision model's answers are.

- :mod:`~mydecide.evaluation.run` — orchestration (``run_evaluation``; ``evaluate_files`` is ``mydecide evaluate``);
- :mod:`~mydecide.evaluation.rows` — metric rows, per-type / per-task / per-slice blocks, predictions.jsonl rows;
- :mod:`~mydecide.evaluation.baselines` — the majority baseline (also training's dev metrics);
- :mod:`~mydecide.evaluation.coherence` — the coherence laws;
- :mod:`~mydecide.evaluation.report` — report.md, reliability.png and writing every output.

Scoring itself is :mod:`mydecide.scoring`. Nothing is imported here, so a submodule costs only what it imports.
"""
