"""``--constrain "tp=8,pp=2,zero=1"``: the API's search constraints written as text.

Items are ``key=value`` separated by commas; ``value`` may list alternatives with ``|``
(``tp=4|8``). Keys are the fields of :mod:`fxplan.inter_op.constraints` or their short
forms: ``zero`` → ``zero_stage``, ``sp`` → ``sequence_parallel``, ``mb`` and ``microbatch``
→ ``microbatch_size``. Degrees (``cp``, ``ep`` included), microbatch sizes and ZeRO stages
are integers, ``sequence_parallel`` and ``fp8`` are true/false, ``schedule``, ``recompute``
and ``offload`` (``none``, ``optimizer``, ``optimizer+params``) are words. The parsed
mapping is validated by :func:`fxplan.inter_op.constraints.validate_constraints` inside the
search, against the cluster's world size.
"""

from __future__ import annotations

from typing import Any

from fxplan.inter_op.constraints import CONSTRAINT_FIELDS, ConstraintError

__all__ = ["parse_constraints", "ALIASES"]

ALIASES = {"zero": "zero_stage", "sp": "sequence_parallel", "mb": "microbatch_size",
           "microbatch": "microbatch_size"}
_INTEGERS = {"tp", "pp", "dp", "microbatch_size", "zero_stage", "cp", "ep"}
_TRUE, _FALSE = {"true", "yes", "1", "on"}, {"false", "no", "0", "off"}


def _value(key: str, raw: str, item: str) -> Any:
    if key in _INTEGERS:
        try:
            return int(raw)
        except ValueError:
            raise ConstraintError(f"--constrain {item!r}: {key} takes integers, got "
                                  f"{raw!r}") from None
    if key in ("sequence_parallel", "fp8"):
        if raw.lower() not in _TRUE | _FALSE:
            raise ConstraintError(f"--constrain {item!r}: {key} takes true or false, got {raw!r}")
        return raw.lower() in _TRUE
    return raw


def parse_constraints(text: str | None) -> dict[str, Any]:
    """``"tp=8,pp=2|4,zero=1,sp=true"`` → ``{"tp": 8, "pp": [2, 4], "zero_stage": 1,
    "sequence_parallel": True}``; raises :class:`ConstraintError` naming the allowed keys."""
    constraints: dict[str, Any] = {}
    keys = ", ".join([*CONSTRAINT_FIELDS, *(f"{a} ({f})" for a, f in ALIASES.items())])
    for item in filter(None, (i.strip() for i in (text or "").split(","))):
        key, eq, raw = (p.strip() for p in item.partition("="))
        key = ALIASES.get(key, key)
        if not eq or not raw:
            raise ConstraintError(f"--constrain {item!r} is not key=value; keys: {keys}")
        if key not in CONSTRAINT_FIELDS:
            raise ConstraintError(f"--constrain: unknown key {item.partition('=')[0]!r}; "
                                  f"keys: {keys}")
        if key in constraints:
            raise ConstraintError(f"--constrain gives {key} twice; list alternatives with | "
                                  f"(tp=4|8)")
        values = [_value(key, v.strip(), item) for v in raw.split("|")]
        constraints[key] = values[0] if len(values) == 1 else values
    return constraints
