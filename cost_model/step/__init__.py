"""One training step: per-layer profiles, per-stage costs, pipeline schedules, the simulator and the estimate."""
