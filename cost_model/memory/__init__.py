"""Bytes per rank: model states under ZeRO, activations, offload, the process's runtime memory and the headroom a plan leaves."""
