"""Applying a plan: the model built per stage, sharded as planned, ready to train (graph and module paths)."""
