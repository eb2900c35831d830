"""Analyses that fill ``node.meta["fxplan"]``: op classes and FLOPs, saved activations,
parameters, module paths and repeated blocks."""

# The FLOP rules register themselves into the table of ``ops`` on import; importing them here,
# with the package, puts them in place before any analysis module is used.
from fxplan.passes.analyses import flops as _flops  # noqa: E402,F401
