"""The rule registry: ``@register_rule(op, …)`` maps op identities to short rule functions.

A rule takes an :class:`~fxplan.sharding.context.OpContext` and returns the
:class:`~fxplan.sharding.strategy.AxisOption` list for one mesh axis. Keys are what
:func:`~fxplan.sharding.context.op_identity` returns: a ``torch.nn`` module class (found
through the class's MRO, so subclasses share the rule), a function, or a method name.
``follows=True`` marks follow-the-producer ops (unary pointwise, views) that the solver may
merge into their producer. An op without a rule gets :func:`replicate_fallback`, is logged,
and is listed by the caller.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional

from fxplan.sharding.context import OpContext
from fxplan.sharding.strategy import R, AxisOption

__all__ = ["Rule", "register_rule", "find_rule", "replicate_fallback"]

log = logging.getLogger(__name__)

RuleFn = Callable[[OpContext], list[AxisOption]]


@dataclass(frozen=True)
class Rule:
    fn: RuleFn
    name: str
    follows: bool = False


_RULES: dict[Any, Rule] = {}
_LOADED = False


def register_rule(*ops: Any, follows: bool = False) -> Callable[[RuleFn], RuleFn]:
    """Register the decorated function as the rule of every op in ``ops``."""

    def decorate(fn: RuleFn) -> RuleFn:
        for op in ops:
            if op in _RULES and _RULES[op].fn is not fn:
                raise ValueError(f"op {op!r} already has rule {_RULES[op].name}; cannot add {fn.__name__}")
            _RULES[op] = Rule(fn, fn.__name__, follows)
        return fn

    return decorate


def _load() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        importlib.import_module("fxplan.sharding.rules")


def find_rule(op: Any) -> Optional[Rule]:
    """The rule for ``op`` (module classes through their MRO), or ``None``."""
    _load()
    if isinstance(op, type):
        for cls in op.__mro__:
            if cls in _RULES:
                return _RULES[cls]
        return None
    try:
        return _RULES.get(op)
    except TypeError:  # unhashable target
        return None


def replicate_fallback(ctx: OpContext) -> list[AxisOption]:
    """Every operand and the output replicated: always valid, never cheap. Logged (debug: the
    search reports these nodes once, per op, among the plan's fallbacks)."""
    log.debug("no sharding rule for %s (node %s): replicated", ctx.op, ctx.node.name)
    return [AxisOption(tuple(R for _ in ctx.operands), R)]
