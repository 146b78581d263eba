"""Temperature scaling, so that a probability of 0.8 is right 80% of the time.

- :mod:`~mydecide.calibration.temperatures` — fitting temperatures, the per-type / per-bucket table, and reading
  temperatures.json (what predict, serve and evaluate apply);
- :mod:`~mydecide.calibration.run` — ``mydecide calibrate``: the training-split guard, scoring the dev data, writing
  temperatures.json.
"""
