"""Checkpoints: sharded tensors through DCP, the manifest, and everything a run needs to go on at the next sample."""
