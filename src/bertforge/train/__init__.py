"""Training: optimizer and schedule, the one training loop, checkpoints, distributed helpers."""
