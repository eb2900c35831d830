"""Analyses that fill ``node.meta["fxplan"]``: op classes and FLOPs, saved activations,
parameters, module paths and repeated blocks."""
