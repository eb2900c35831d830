"""The one contract every rewrite pass follows, and the manager that runs them in order.

A rewrite pass is a callable ``pass_(gm, plan) -> PassResult``: it takes a
:class:`torch.fx.GraphModule` and the :class:`~fxplan.core.plan.Plan` it realises, and returns the
(possibly new) module and whether it changed anything. Context a pass needs beyond the graph and
the plan (a device mesh, the ranks of this process) is given to its constructor, never read from
globals. A pass that cannot do its job raises :class:`PassError`, which names the pass and, when
one is to blame, the fx node: ``[insert-reshards] node 'view_3': cannot …``. It is a
:class:`~fxplan.core.errors.UserError` (the plan asks for something this runtime cannot do: one
line, exit 2), so passes raise it only for failures a user can act on. Any other exception
is a bug: :class:`PassInternalError` (not a ``UserError``) names the pass and, when known, the
node or parameter it was at, and keeps the original exception and traceback as ``__cause__``.
A pass that realises part of the plan differently (a default, a skipped name) records a
readable line in :attr:`RewritePass.fallbacks` and logs it on ``fxplan.runtime``.

Modelled on ``torch/fx/passes/infra/pass_base.py`` / ``pass_manager.py``, reduced to what the
runtime needs: a fixed, ordered list of passes, each applied once, with an optional check of the
graph after each (``graph.lint()``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

import torch
from torch import fx

from fxplan.core.fallbacks import record_fallback
from fxplan.core.pass_error import PassError

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["PassError", "PassInternalError", "PassResult", "RewritePass", "PassManager",
           "record_fallback"]


class PassInternalError(RuntimeError):
    """An unexpected exception inside a pass (a bug, not a plan error); ``__cause__`` holds it."""

    def __init__(self, pass_name: str, err: BaseException, at: str | None = None) -> None:
        self.pass_name, self.at = pass_name, at
        where = f" at {at}" if at is not None else ""
        super().__init__(f"[{pass_name}] internal error{where}: {type(err).__name__}: {err}")


@dataclass(frozen=True)
class PassResult:
    """What a pass gives back: the module to continue with and whether anything changed."""

    module: torch.nn.Module
    changed: bool


class RewritePass:
    """Base class: subclasses set ``name`` and implement :meth:`run`.

    ``__call__`` lets :class:`PassError` through and turns any other exception into a
    :class:`PassInternalError` naming the pass and :attr:`at` (the node or parameter the pass
    set as it went, if any). :meth:`fallback` records and logs a deviation from the plan.
    """

    name: str = "rewrite-pass"
    at: str | None = None

    @property
    def fallbacks(self) -> list[str]:
        """Readable lines, one per deviation from the plan, in order, without repeats."""
        return self.__dict__.setdefault("_fallbacks", [])

    def fallback(self, message: str) -> None:
        record_fallback(self.fallbacks, f"[{self.name}] {message}")

    def run(self, gm: fx.GraphModule, plan: "Plan") -> PassResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def error(self, message: str, node: fx.Node | str | None = None) -> PassError:
        return PassError(self.name, message, node)

    def __call__(self, gm: fx.GraphModule, plan: "Plan") -> PassResult:
        self.at = None
        try:
            return self.run(gm, plan)
        except PassError:
            raise
        except Exception as err:  # a bug: keep the traceback, name where it happened
            raise PassInternalError(self.name, err, self.at) from err


class PassManager:
    """Run passes in order; each sees the module the previous one returned.

    ``run`` returns a :class:`PassResult` whose ``changed`` is true if any pass changed the
    module; ``history`` records ``(pass name, changed)`` for the report; :attr:`fallbacks`
    gathers the passes' fallback lines.
    """

    def __init__(self, passes: Iterable[RewritePass], *, lint: bool = True) -> None:
        self.passes: Sequence[RewritePass] = tuple(passes)
        self.lint = lint
        self.history: list[tuple[str, bool]] = []

    def run(self, gm: fx.GraphModule, plan: "Plan") -> PassResult:
        module: torch.nn.Module = gm
        changed_any = False
        for pass_ in self.passes:
            result = pass_(module, plan)  # type: ignore[arg-type]
            module, changed = result.module, result.changed
            self.history.append((pass_.name, changed))
            changed_any |= changed
            if self.lint and changed and isinstance(module, fx.GraphModule):
                try:
                    module.graph.lint()
                except Exception as err:  # noqa: BLE001 - an invalid graph is a bug
                    raise PassInternalError(pass_.name, err, "graph lint") from err
        return PassResult(module, changed_any)

    @property
    def fallbacks(self) -> list[str]:
        return list(dict.fromkeys(line for p in self.passes for line in p.fallbacks))
