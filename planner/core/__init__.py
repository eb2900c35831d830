"""The shared vocabulary every layer may import: the user-error root, the parallel
configuration, placement types and the plan record.

Nothing in :mod:`fxplan.core` imports another fxplan package: it is the bottom layer (see
``docs/architecture.md`` and ``tests/test_layers.py``).
"""
