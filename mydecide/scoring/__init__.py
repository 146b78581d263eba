"""The scoring layer: one path from a (state, question) to probabilities, used by every command.

1. :mod:`~mydecide.scoring.render` — a question as token ids (shared state prefix + question suffix);
2. :mod:`~mydecide.scoring.plan` — which prompts score each question (letters, one per option, one per set label,
   groups + a final round for more than 26 options), round by round;
3. :mod:`~mydecide.scoring.forward` — one batched decoder pass per chunk, the shared prefix computed once, only the
   answer labels' logits read;
   :mod:`~mydecide.scoring.packed` — the same pass with a state and all its questions packed into one row
   (training under gradient checkpointing, the server's packed route);
4. :mod:`~mydecide.scoring.probabilities` — the one softmax, where temperatures are applied;

and :mod:`~mydecide.scoring.engine`, which runs 1–3 on a loaded model (a :class:`~mydecide.scoring.model.LoadedModel`,
which ``modeling.load_model`` builds). Nothing is imported here, so importing the package costs nothing (torch is
imported inside the functions that run a model).
"""
