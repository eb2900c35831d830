"""The inter-op strategy space: mesh families ``(tp, pp, dp)`` and the options inside each.

A **family** is a factorisation ``pp · dp · tp = N`` of the world size, ranks laid out
row-major with ``tp`` fastest (:class:`cost_model.comm.mesh.LogicalMesh`), so ``tp`` stays inside a
node whenever ``tp ≤ devices per node`` and otherwise straddles nodes (allowed, priced by the
collective model). A family is **invalid**, with the reason recorded, when

    tp ∤ heads,  tp ∤ a width tensor parallelism splits (vocabulary, projections),
    pp > L (a stage needs a layer),  dp/cp ∤ batch for every context-parallel degree cp
    the family offers (cp = 1 only, unless ``cps`` offers more).

Inside a family a **candidate**, a :class:`~fxplan.core.config.ParallelConfig`, fixes the
microbatch size ``b`` (a divisor of ``batch/(dp/cp)`` up to :data:`MAX_MICROBATCH`;
``m = batch/((dp/cp)·b)``), the schedule (``gpipe``, and ``1f1b`` when ``m ≥ pp``; ``interleaved:v``
for ``v ∈`` :data:`INTERLEAVE_CHUNKS` when ``m mod pp = 0`` and ``L ≥ pp·v``; no pipeline:
``1f1b`` only; also the zero-bubble ``zb:v`` for ``v ∈``
:data:`ZERO_BUBBLE_CHUNKS` under the same conditions as ``interleaved:v``, ``zbv`` when
``L ≥ 2·pp`` and ``dualpipev`` when also ``m ≥ 2·pp`` (neither where the first and the last
stage share a weight: both run on rank 0), each with every recompute policy (full
recompute's block keeps its recompute for the weight pass,
:mod:`fxplan.passes.rewrite.split_recompute`; selective recompute checkpoints the attention
alone, which the weight pass never reads,
:func:`fxplan.runtime.train.pipeline.zero_bubble_refusal`);
with ``dp > 1`` their gradients are all-reduced after the step, so only at the memory rungs
without FSDP2, ZeRO-0 and ZeRO-1 (ZeRO-1 only with ``tp = ep = 1``; ``offload=optimizer``
included, ``optimizer+params`` is ZeRO-3's):
:func:`fxplan.core.zero_bubble_dp.after_step_refusal`, which the search's rungs obey), recompute
(:data:`~fxplan.core.config_fields.RECOMPUTE_POLICIES`; with ``per_stage_recompute`` only
:data:`PER_STAGE_POLICIES`, each run by the search on as few layers of each stage as memory
needs, none at all where none need it, :meth:`fxplan.inter_op.stage_split.StageSplits.
fit_recompute`, so ``none`` is among their answers), sequence parallelism (``tp > 1``,
``tp | seq``), the ZeRO stage (0–3; 0 when ``dp = 1``) and, for a mixture of experts, the
expert-parallel degree ``ep`` (``ep | dp``, ``ep | E``; ``ep > 1`` only with sequence
parallelism off, the form the runtime runs beside tp) and the context-parallel degree ``cp``
(:func:`context_degrees`: ``cp | dp``, ``2·cp | seq``, and
``(dp/cp) | batch``; which of them the search offers a family is its bound,
:mod:`fxplan.inter_op.context_bound`); the search fills in ``stage_layers`` (the partition).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

from fxplan.core.config import ParallelConfig
from fxplan.core.config_fields import RECOMPUTE_POLICIES
from fxplan.core.schedule import Schedule
from fxplan.inter_op.reasons import DIVIDE, STAGES, Reason

__all__ = ["Family", "INTERLEAVE_CHUNKS", "MAX_MICROBATCH", "PER_STAGE_POLICIES",
           "ZERO_BUBBLE_CHUNKS", "context_degrees", "divisors",
           "expert_degrees", "families", "options"]

MAX_MICROBATCH = 16
#: The ``v`` of ``interleaved:v`` the search offers.
INTERLEAVE_CHUNKS = (2, 4)
#: The ``v`` of the zero-bubble ``zb:v`` the search offers (``zb`` is ZB1P, ``v = 1``).
ZERO_BUBBLE_CHUNKS = (1, 2)
#: The policies a candidate carries when the search chooses the recomputed layers per stage.
PER_STAGE_POLICIES = ("selective", "full")


def divisors(n: int) -> list[int]:
    """The divisors of ``n ≥ 1`` in increasing order, by trial division up to ``√n``:
    each ``d ≤ √n`` that divides ``n`` pairs with ``n / d ≥ √n`` (cost ``O(√n)``, not ``O(n)``;
    the inputs that reach here are bounded, :mod:`fxplan.core.bounds`)."""
    small: list[int] = []
    large: list[int] = []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


@dataclass(frozen=True, order=True)
class Family:
    """A mesh factorisation ``pp · dp · tp = N`` (ordered by ``(tp, pp, dp)``)."""

    tp: int
    pp: int
    dp: int

    @classmethod
    def of(cls, config: ParallelConfig) -> "Family":
        return cls(config.tp, config.pp, config.dp)

    def __str__(self) -> str:
        return f"tp={self.tp}, pp={self.pp}, dp={self.dp}"


def families(world: int, *, batch: int, layers: int, heads: int | None,
             tp_widths: Mapping[str, int], pruned: list[Reason],
             cps: Callable[[int], tuple[int, ...]] = lambda dp: (1,)) -> list[Family]:
    """Valid ``(tp, pp, dp)``; each invalid one appends its reason to ``pruned``. ``cps(dp)``
    are the context-parallel degrees a family of ``dp`` may use: it needs ``(dp/cp) | batch``
    for one of them."""
    out: list[Family] = []
    for tp in divisors(world):
        if heads is not None and heads % tp:
            pruned.append(Reason(f"tp={tp}: does not divide heads={heads} ({heads} mod {tp} = "
                                 f"{heads % tp})", DIVIDE))
            continue
        bad = [f"{name}={w}" for name, w in sorted(tp_widths.items()) if w % tp]
        if bad:
            pruned.append(Reason(f"tp={tp}: does not divide {bad[0]}", DIVIDE))
            continue
        for pp in divisors(world // tp):
            dp = world // (tp * pp)
            if layers == 0 and pp > 1:
                pruned.append(Reason(f"tp={tp}, pp={pp}: no repeated layers found to split into "
                                     "pipeline stages (only pp=1 applies to this model)", STAGES))
            elif pp > max(layers, 1):
                pruned.append(Reason(f"tp={tp}, pp={pp}: more stages than layers ({pp} > "
                                     f"{layers})", STAGES))
            elif all(batch % (dp // cp) for cp in cps(dp)):
                pruned.append(Reason(f"tp={tp}, pp={pp}, dp={dp}: batch={batch} not divisible "
                                     f"by dp ({batch} mod {dp} = {batch % dp})", DIVIDE))
            else:
                out.append(Family(tp, pp, dp))
    return out


def expert_degrees(dp: int, experts: int | None) -> tuple[int, ...]:
    """The ``ep`` a family of ``dp`` data-parallel ranks offers a mixture of ``experts``
    experts: the common divisors of ``dp`` and ``E`` (``(1,)`` for a dense model)."""
    if not experts:
        return (1,)
    return tuple(d for d in divisors(dp) if experts % d == 0)


def context_degrees(dp: int, seq: int | None, batch: int) -> tuple[int, ...]:
    """The ``cp`` a family of ``dp`` data-parallel ranks can run: ``cp | dp``, the sequence
    cut into ``2·cp`` chunks (``2·cp | seq``; ``(1,)`` without a sequence) and the batch split
    over the ``dp/cp`` CP groups (``(dp/cp) | batch``)."""
    if not seq:
        return (1,) if batch % dp == 0 else ()
    return tuple(c for c in divisors(dp) if (c == 1 or seq % (2 * c) == 0)
                 and batch % (dp // c) == 0)


def options(family: Family, *, batch: int, layers: int, seq: int | None,
            eps: tuple[int, ...] = (1,), cps: tuple[int, ...] = (1,),
            per_stage_recompute: bool = False, tied_ends: bool = False,
            zero_stage: int = 0, offload: str = "none") -> Iterator[ParallelConfig]:
    """Every candidate of ``family`` at ZeRO stage ``zero_stage`` and ``offload`` (default 0
    and none; the search raises the stage as needed),
    for each expert-parallel degree of ``eps`` (:func:`expert_degrees`) and context-parallel
    degree of ``cps`` (:func:`context_degrees`); ``per_stage_recompute``: the policies of
    :data:`PER_STAGE_POLICIES` (module docstring) on a model with repeated layers;
    ``tied_ends``: the first and the last stage share a weight, so the V-shaped schedules,
    which run both on pipeline rank 0, are not offered (the runtime keeps tied copies equal
    across ranks only, :func:`fxplan.runtime.apply.tied.same_rank_refusal`)."""
    policies = PER_STAGE_POLICIES if per_stage_recompute and layers else RECOMPUTE_POLICIES
    for cp in cps:
        yield from _options(family, batch=batch, layers=layers, seq=seq, eps=eps, cp=cp,
                            policies=policies, v_shapes=not tied_ends,
                            rung={"zero_stage": zero_stage, "offload": offload})


def _options(family: Family, *, batch: int, layers: int, seq: int | None,
             eps: tuple[int, ...], cp: int,
             policies: tuple[str, ...] = RECOMPUTE_POLICIES, v_shapes: bool = True,
             rung: dict[str, object] | None = None) -> Iterator[ParallelConfig]:
    rung = rung or {}
    tp, pp, dp = family.tp, family.pp, family.dp
    per_replica = batch // (dp // cp)
    sps = [False] + ([True] if tp > 1 and (seq is None or seq % (tp * cp) == 0) else [])
    for mb in (b for b in divisors(per_replica) if b <= MAX_MICROBATCH):
        m = per_replica // mb
        # With m < pp, 1F1B never reaches its steady state and runs GPipe's order (torch's
        # Schedule1F1B refuses it): offer it under the name of the schedule that will run.
        schedules = [Schedule("1f1b")] if pp == 1 or m >= pp else []
        if pp > 1:
            schedules.append(Schedule("gpipe"))
            schedules += [Schedule("interleaved", v) for v in INTERLEAVE_CHUNKS
                          if m % pp == 0 and layers >= pp * v]
            # what torch's split backward runs (runtime.pipeline; beside dp > 1 at the ZeRO
            # stages core.zero_bubble_dp allows)
            schedules += [Schedule("zb", v) for v in ZERO_BUBBLE_CHUNKS
                          if m % pp == 0 and layers >= pp * v]
            if v_shapes:
                schedules += [Schedule("zbv", 2)] if layers >= 2 * pp else []
                schedules += ([Schedule("dualpipev", 2)] if layers >= 2 * pp and m >= 2 * pp
                              else [])
        for schedule in schedules:
            for recompute in policies:
                for sp in sps:
                    # sequence parallelism with ep > 1: not in the runtime
                    # (fxplan.runtime.styles.expert_tp), so not offered
                    for ep in (eps if not sp else (1,) if 1 in eps else ()):
                        yield ParallelConfig(dp=dp, tp=tp, pp=pp, microbatch_size=mb,
                                             num_microbatches=m, schedule=schedule,
                                             recompute=recompute, sequence_parallel=sp, ep=ep,
                                             cp=cp, **rung)
