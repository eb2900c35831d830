"""The inter-op strategy space: mesh families ``(tp, pp, dp)`` and the options inside each.

A **family** is a factorisation ``pp · dp · tp = N`` of the world size, ranks laid out
row-major with ``tp`` fastest (:class:`cost_model.mesh.LogicalMesh`), so ``tp`` stays inside a
node whenever ``tp ≤ devices per node`` and otherwise straddles nodes (allowed, priced by the
collective model). A family is **invalid**, with the reason recorded, when

    tp ∤ heads,  tp ∤ a width tensor parallelism splits (vocabulary, projections),
    pp > L (a stage needs a layer),  dp ∤ batch.

Inside a family a **candidate** fixes the microbatch size ``b`` (a divisor of ``batch/dp``
up to :data:`MAX_MICROBATCH`; ``m = batch/(dp·b)``), the schedule (``gpipe``, and ``1f1b`` when ``m ≥ pp``;
``interleaved:v`` for ``v ∈ {2, 4}`` when ``m mod pp = 0`` and ``L ≥ pp·v``; no pipeline:
``1f1b`` only), recompute (``none``/``selective``/``full``), sequence parallelism (``tp > 1``,
``tp | seq``) and the ZeRO stage (0–3; 0 when ``dp = 1``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator, Mapping

__all__ = ["Candidate", "Family", "MAX_MICROBATCH", "divisors", "families", "options"]

MAX_MICROBATCH = 16
INTERLEAVE_CHUNKS = (2, 4)
RECOMPUTE = ("none", "selective", "full")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True, order=True)
class Family:
    tp: int
    pp: int
    dp: int

    def __str__(self) -> str:
        return f"tp={self.tp}, pp={self.pp}, dp={self.dp}"


@dataclass(frozen=True)
class Candidate:
    """One point of the space; ``stage_layers`` is filled in by the partition."""

    tp: int
    pp: int
    dp: int
    microbatch_size: int
    num_microbatches: int
    schedule: str
    recompute: str
    sequence_parallel: bool
    zero_stage: int = 0
    stage_layers: tuple[int, ...] = ()

    @property
    def family(self) -> Family:
        return Family(self.tp, self.pp, self.dp)

    @property
    def v(self) -> int:
        return int(self.schedule.split(":")[1]) if self.schedule.startswith("interleaved:") else 1

    @property
    def schedule_kind(self) -> str:
        return self.schedule.split(":")[0]

    def with_(self, **changes: object) -> "Candidate":
        return replace(self, **changes)

    def summary(self) -> str:
        return (f"pp={self.pp} dp={self.dp} tp={self.tp} | zero={self.zero_stage} | "
                f"{self.schedule} mb={self.microbatch_size}×{self.num_microbatches} | "
                f"recompute={self.recompute} | sp={'on' if self.sequence_parallel else 'off'}")

    def to_config_string(self) -> str:
        """The :meth:`cost_model.config.ParallelConfig.parse` form."""
        text = (f"dp={self.dp},tp={self.tp},pp={self.pp},mb={self.microbatch_size},"
                f"m={self.num_microbatches},schedule={self.schedule},zero={self.zero_stage},"
                f"recompute={self.recompute},sp={'on' if self.sequence_parallel else 'off'}")
        if self.stage_layers:
            text += ",stages=" + "/".join(map(str, self.stage_layers))
        return text


def families(world: int, *, batch: int, layers: int, heads: int | None,
             tp_widths: Mapping[str, int], pruned: list[str]) -> list[Family]:
    """Valid ``(tp, pp, dp)``; each invalid one appends its reason to ``pruned``."""
    out: list[Family] = []
    for tp in divisors(world):
        if heads is not None and heads % tp:
            pruned.append(f"tp={tp}: does not divide heads={heads} ({heads} mod {tp} = {heads % tp})")
            continue
        bad = [f"{name}={w}" for name, w in sorted(tp_widths.items()) if w % tp]
        if bad:
            pruned.append(f"tp={tp}: does not divide {bad[0]}")
            continue
        for pp in divisors(world // tp):
            dp = world // (tp * pp)
            if pp > layers:
                pruned.append(f"tp={tp}, pp={pp}: more stages than layers ({pp} > {layers})")
            elif batch % dp:
                pruned.append(f"tp={tp}, pp={pp}, dp={dp}: batch={batch} not divisible by dp "
                              f"({batch} mod {dp} = {batch % dp})")
            else:
                out.append(Family(tp, pp, dp))
    return out


def options(family: Family, *, batch: int, layers: int, seq: int | None) -> Iterator[Candidate]:
    """Every candidate of ``family`` at ZeRO stage 0 (the search raises the stage as needed)."""
    tp, pp, dp = family.tp, family.pp, family.dp
    per_replica = batch // dp
    sps = [False] + ([True] if tp > 1 and (seq is None or seq % tp == 0) else [])
    for mb in (b for b in divisors(per_replica) if b <= MAX_MICROBATCH):
        m = per_replica // mb
        # With m < pp, 1F1B never reaches its steady state and runs GPipe's order (torch's
        # Schedule1F1B refuses it): offer it under the name of the schedule that will run.
        schedules = ["1f1b"] if pp == 1 or m >= pp else []
        if pp > 1:
            schedules.append("gpipe")
            schedules += [f"interleaved:{v}" for v in INTERLEAVE_CHUNKS
                          if m % pp == 0 and layers >= pp * v]
        for schedule in schedules:
            for recompute in RECOMPUTE:
                for sp in sps:
                    yield Candidate(tp, pp, dp, mb, m, schedule, recompute, sp)
