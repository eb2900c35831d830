"""The training loop: data, microbatches, pipeline schedules, the optimizer and what a run logs."""
