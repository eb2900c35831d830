"""Constraints on the search's candidates: validated up front, then a membership test.

``constraints`` maps a field of :class:`fxplan.core.config.ParallelConfig` to one value or a
collection (list, tuple, set, frozenset) of values. Allowed keys and values:

=====================  =========================================================
``tp``, ``pp``, ``dp``  divisors of the world size
``microbatch_size``     positive integers
``schedule``            ``1f1b``, ``gpipe``, ``interleaved:v`` (``v`` in
                        :data:`fxplan.inter_op.space.INTERLEAVE_CHUNKS`), ``zb``,
                        ``zb:v`` (:data:`~fxplan.inter_op.space.ZERO_BUBBLE_CHUNKS`), ``zbv``,
                        ``dualpipev``
``recompute``           ``none``, ``selective``, ``full`` (naming it fixes the policy of
                        every layer; unnamed, the search recomputes as few layers of
                        each stage as memory needs, :mod:`fxplan.inter_op.driver`)
``sequence_parallel``   ``True``, ``False``
``zero_stage``          ``0``–``3``
``offload``             ``none``, ``optimizer``, ``optimizer+params``
``fp8``                 ``True``, ``False`` (the search offers FP8 only when allowed)
``ep``                  divisors of the world size (expert parallelism; a divisor of
                        ``dp``, and of the experts, for a candidate to use it)
``cp``                  divisors of the world size (context parallelism; a divisor
                        of ``dp`` with ``2·cp | seq`` for a candidate to use it)
=====================  =========================================================

Anything else raises :class:`ConstraintError` (a ``UserError``) naming the allowed keys or
values, before any work is done. Schedules are given as text (``"interleaved:2"``) and read
into :class:`~fxplan.core.schedule.Schedule` values by :func:`validate_constraints`.

Two degrees are checked against the model as well, once it is profiled: an ``ep`` constraint
that only ``ep > 1`` satisfies needs ``E mod ep = 0`` for some allowed ``ep`` (``E`` the experts,
:func:`check_ep_constraint`), a ``cp`` constraint that only ``cp > 1`` satisfies needs
``s mod 2·cp = 0`` for some allowed ``cp`` (``s`` the sequence, :func:`check_cp_constraint`).
"""

from __future__ import annotations

from typing import Any, Mapping

from fxplan.core.config import ParallelConfig
from fxplan.core.config_fields import OFFLOAD_POLICIES, RECOMPUTE_POLICIES
from fxplan.core.schedule import Schedule
from fxplan.core.errors import UserError
from fxplan.inter_op.space import INTERLEAVE_CHUNKS, ZERO_BUBBLE_CHUNKS, divisors, expert_degrees

__all__ = ["ConstraintError", "CONSTRAINT_FIELDS", "allowed", "allowed_values",
           "check_cp_constraint", "check_ep_constraint", "describe", "ep_degrees", "only",
           "validate_constraints"]

CONSTRAINT_FIELDS = ("tp", "pp", "dp", "microbatch_size", "schedule", "recompute",
                     "sequence_parallel", "zero_stage", "offload", "fp8", "cp", "ep")
_COLLECTIONS = (list, tuple, set, frozenset)


class ConstraintError(UserError, ValueError):
    """A constraint names an unknown field or a value outside its field's range, or the
    constraints exclude every candidate."""


def _schedule_names() -> list[str]:
    """The schedules a constraint may name: those the search offers (:mod:`.space`)."""
    return (["1f1b", "gpipe"] + [f"interleaved:{v}" for v in INTERLEAVE_CHUNKS]
            + [str(Schedule("zb", v)) for v in ZERO_BUBBLE_CHUNKS] + ["zbv", "dualpipev"])


def allowed_values(world: int) -> dict[str, str]:
    """Field → the values it accepts, as text (for messages)."""
    degrees = ", ".join(map(str, divisors(world)))
    schedules = ", ".join(_schedule_names())
    return {"tp": f"{degrees} (divisors of the {world} devices)",
            "pp": f"{degrees} (divisors of the {world} devices)",
            "dp": f"{degrees} (divisors of the {world} devices)",
            "microbatch_size": "positive integers",
            "schedule": schedules, "recompute": ", ".join(RECOMPUTE_POLICIES),
            "sequence_parallel": "True, False", "zero_stage": "0, 1, 2, 3",
            "offload": ", ".join(OFFLOAD_POLICIES), "fp8": "True, False",
            "cp": f"{degrees} (context parallelism; divides dp, 2·cp divides seq)",
            "ep": f"{degrees} (expert parallelism; divides dp)"}


def _valid(key: str, value: Any, world: int) -> bool:
    if key in ("tp", "pp", "dp", "microbatch_size", "cp", "ep"):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return False
        return key == "microbatch_size" or world % value == 0
    if key == "schedule":
        return value in _schedule_names()
    if key == "recompute":
        return value in RECOMPUTE_POLICIES
    if key in ("sequence_parallel", "fp8"):
        return isinstance(value, bool)
    if key == "offload":
        return value in OFFLOAD_POLICIES
    if key == "cp":
        return not isinstance(value, bool) and value == 1
    return not isinstance(value, bool) and value in (0, 1, 2, 3)   # zero_stage


def validate_constraints(constraints: Mapping[str, Any] | None, world: int) -> dict[str, Any]:
    """``constraints`` checked against :func:`allowed_values`, schedules read into
    :class:`Schedule` values; raises :class:`ConstraintError`."""
    constraints = dict(constraints or {})
    table = allowed_values(world)
    unknown = sorted(set(constraints) - set(CONSTRAINT_FIELDS))
    if unknown:
        raise ConstraintError(
            f"unknown constraints {unknown}; allowed keys: {', '.join(CONSTRAINT_FIELDS)}")
    for key, want in constraints.items():
        values = list(want) if isinstance(want, _COLLECTIONS) else [want]
        if not values:
            raise ConstraintError(f"constraint {key} is an empty collection; allowed values: "
                                  f"{table[key]}")
        bad = [v for v in values if not _valid(key, v, world)]
        if bad:
            raise ConstraintError(f"constraint {key}={bad[0]!r} is not allowed; {key} takes "
                                  f"{table[key]} (a value or a collection of values)")
    if "schedule" in constraints:
        want = constraints["schedule"]
        constraints["schedule"] = (tuple(map(Schedule.parse, want))
                                   if isinstance(want, _COLLECTIONS) else Schedule.parse(want))
    return constraints


def allowed(c: ParallelConfig, constraints: Mapping[str, Any]) -> bool:
    """Whether ``c`` satisfies every constraint (validated ones)."""
    for key, want in constraints.items():
        have = getattr(c, key)
        if isinstance(want, _COLLECTIONS):
            if have not in want:
                return False
        elif have != want:
            return False
    return True


def describe(constraints: Mapping[str, Any]) -> str:
    """``tp=2, zero_stage∈{1, 2}``."""
    parts = []
    for key, want in constraints.items():
        if isinstance(want, _COLLECTIONS):
            parts.append(f"{key}∈{{{', '.join(map(str, want))}}}")
        else:
            parts.append(f"{key}={want}")
    return ", ".join(parts)


def only(constraints: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The constraints on the fields ``keys`` (the others dropped)."""
    return {k: v for k, v in constraints.items() if k in keys}


def _degree_wanted(constraints: Mapping[str, Any], key: str) -> tuple[Any, set[int] | None]:
    """The ``key`` constraint as given and its values, or ``None`` for the values when
    it is absent or allows 1 (the degree may stay unused: nothing to check)."""
    want = constraints.get(key)
    if want is None:
        return want, None
    values = set(want) if isinstance(want, _COLLECTIONS) else {want}
    return want, None if 1 in values else values


def check_ep_constraint(constraints: Mapping[str, Any], experts: int | None) -> None:
    """An ``ep`` constraint only ``ep > 1`` satisfies needs experts (``experts``, ``None`` for
    a dense model) that ``ep`` divides; raises :class:`ConstraintError`."""
    want, values = _degree_wanted(constraints, "ep")
    if values is None:
        return
    if experts is None:
        raise ConstraintError(f"constraint {describe({'ep': want})} needs a mixture of "
                              f"experts, and the model has no expert "
                              f"parameters (3-D [E, ·, ·] batched expert weights); allow "
                              f"ep=1")
    if all(experts % v for v in values):
        raise ConstraintError(f"constraint ep: none of {sorted(values)} divides the "
                              f"model's {experts} experts")


def check_cp_constraint(constraints: Mapping[str, Any], seq: int | None) -> None:
    """A ``cp`` constraint only ``cp > 1`` satisfies needs a sequence (``seq``, ``None`` when
    the model has none) that ``2·cp`` chunks divide; raises :class:`ConstraintError`."""
    want, values = _degree_wanted(constraints, "cp")
    if values is None:
        return
    if seq is None:
        raise ConstraintError(f"constraint {describe({'cp': want})} splits the sequence, "
                              "and the model has no token sequence (a 2-D integer input); "
                              "allow cp=1")
    if all(seq % (2 * v) for v in values):
        raise ConstraintError(f"constraint cp: context parallelism cuts the sequence into "
                              f"2·cp chunks, and none of {sorted(values)} gives chunks that "
                              f"divide seq={seq}")


def ep_degrees(dp: int, experts: int | None, constraints: Mapping[str, Any]) -> tuple[int, ...]:
    """The expert-parallel degrees of a family with ``dp`` data-parallel ranks
    (:func:`fxplan.inter_op.space.expert_degrees`) the ``ep`` constraint allows (``(1,)`` for
    a dense model, or when it allows none of them)."""
    want = only(constraints, ("ep",))
    return tuple(e for e in expert_degrees(dp, experts)
                 if allowed(ParallelConfig(dp=e, ep=e), want)) or (1,)
