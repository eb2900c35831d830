"""``PassError``: a plan the rewrite passes or the runtime cannot realise, as a user error.

It names the pass (or the runtime step) and, when one is to blame, the fx node:
``[insert-reshards] node 'view_3': cannot …``. It is a :class:`~fxplan.core.errors.UserError`
(the plan asks for something this runtime cannot do: one paragraph, exit 2), so it is raised
only for failures a user can act on; any other exception inside a pass is a bug
(:class:`fxplan.passes.rewrite.base.PassInternalError`).
"""

from __future__ import annotations

from torch import fx

from fxplan.core.errors import UserError

__all__ = ["PassError"]


class PassError(UserError):
    """A rewrite pass could not realise the plan; the message names the pass and the node."""

    def __init__(self, pass_name: str, message: str, node: fx.Node | str | None = None) -> None:
        self.pass_name = pass_name
        self.node = node.name if isinstance(node, fx.Node) else node
        where = f" node {self.node!r}:" if self.node is not None else ""
        super().__init__(f"[{pass_name}]{where} {message}")
