"""The processes of a run: torchrun on loopback, supervision and restarts, heartbeats, pinning and the errors ranks report."""
