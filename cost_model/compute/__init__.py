"""Compute time of ops: roofline, efficiencies, profiled op databases, fused attention and FP8."""
