"""The root of every error a user can fix.

Each package raises its own subclass (:class:`~fxplan.cluster_specs.ClusterSpecError`,
:class:`~fxplan.examples.bundle.ModelSpecError`, :class:`~fxplan.passes.errors.CaptureError`,
:class:`~fxplan.core.config_error.CostModelError`, :class:`~fxplan.core.plan.PlanError`, …).
The command line catches :class:`UserError` alone and prints its message as one paragraph with
exit code 2; ``--debug`` shows the traceback. The message says what was wrong and what was
expected, with the arithmetic where there is arithmetic.
"""

from __future__ import annotations


class UserError(Exception):
    """Something the user can fix: the message says what was wrong and what was expected."""
