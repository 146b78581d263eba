"""mydecide: train, calibrate, evaluate and serve your own decision model."""

__version__ = "0.1.0"
