"""Parallel styles of the runtime: tensor, sequence, context, expert and data parallelism applied to modules."""
