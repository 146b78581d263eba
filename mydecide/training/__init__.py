"""Training: scoring rules, objectives, batching and the training loop."""
