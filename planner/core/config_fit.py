"""Whether a configuration fits a model, a cluster and a global batch — the world size, the
heads and widths tensor parallelism splits, the sequence, the layers of each (virtual) stage,
the microbatches a schedule needs — and the microbatch count a global batch implies.

:meth:`ParallelConfig.check` validates the configuration against the facts of a model and a
cluster and raises :class:`CostModelError` with the arithmetic::

    dp·tp·pp = 24·8·8 = 1536 ≠ 3072 devices
    tp=8 does not divide heads=12 (12 mod 8 = 4)
    pp=5 does not divide layers=24 (24 mod 5 = 4); or give stages=… (5 counts summing to 24) for uneven stages
    batch=512 is not divisible by dp·mb = 24·1 = 24 (512 mod 24 = 8)
    interleaved:2 needs layers divisible by pp·v = 8·2 = 16 (24 mod 16 = 8)
"""

from __future__ import annotations

from typing import Mapping

from fxplan.core.config_error import CostModelError, positive_int
from fxplan.core.config_fields import ConfigFields, ConfigSelf

__all__ = ["ModelFit"]


class ModelFit(ConfigFields):
    """The checks of a :class:`~fxplan.core.config.ParallelConfig` against a model and a
    cluster."""

    def resolve(self: ConfigSelf, batch: int) -> ConfigSelf:
        """This configuration with ``num_microbatches = batch / ((dp/cp) · mb)`` filled in.

        Raises when ``batch`` is not a multiple of ``(dp/cp) · mb`` or contradicts an explicit
        ``num_microbatches``.
        """
        positive_int("batch", batch)
        per_step = self.replicas * self.microbatch_size
        if batch % per_step:
            who = (f"dp·mb = {self.dp}·{self.microbatch_size}" if self.cp == 1 else
                   f"(dp/cp)·mb = ({self.dp}/{self.cp})·{self.microbatch_size}")
            raise CostModelError(
                f"batch={batch} is not divisible by {who} = "
                f"{per_step} ({batch} mod {per_step} = {batch % per_step})"
            )
        m = batch // per_step
        if self.num_microbatches is not None and self.num_microbatches != m:
            who = "dp·mb" if self.cp == 1 else "(dp/cp)·mb"
            raise CostModelError(
                f"m={self.num_microbatches} contradicts batch={batch}: batch / ({who}) = "
                f"{batch} / {per_step} = {m} microbatches"
            )
        return self if self.num_microbatches == m else self.replace(num_microbatches=m)

    def check(self, *, world_size: int, layers: int, heads: int | None = None,
              seq: int | None = None, batch: int | None = None,
              tp_widths: Mapping[str, int] | None = None) -> None:
        """Raise :class:`CostModelError` unless the configuration fits the model and cluster.

        ``layers`` counts the repeated blocks, ``heads`` the attention heads, ``tp_widths``
        names dimensions tensor parallelism must split evenly (``{"vocab": 51200}``).
        """
        if self.world_size != world_size:
            raise CostModelError(
                f"dp·tp·pp = {self.dp}·{self.tp}·{self.pp} = {self.world_size} ≠ {world_size} "
                "devices in the cluster"
            )
        if heads is not None and heads % self.tp:
            raise CostModelError(
                f"tp={self.tp} does not divide heads={heads} ({heads} mod {self.tp} = "
                f"{heads % self.tp})"
            )
        for name, width in (tp_widths or {}).items():
            if width % self.tp:
                raise CostModelError(
                    f"tp={self.tp} does not divide {name}={width} ({width} mod {self.tp} = "
                    f"{width % self.tp})"
                )
        if self.sequence_parallel and self.tp == 1:
            raise CostModelError("sp=on needs tp > 1: sequence parallelism splits the sequence "
                                 "over the tensor-parallel ranks, and tp=1 has one")
        if self.sequence_parallel and seq is not None and seq % self.tp:
            raise CostModelError(
                f"sequence parallelism splits seq={seq} over tp={self.tp} ({seq} mod {self.tp} = "
                f"{seq % self.tp})"
            )
        if self.cp > 1 and seq is not None and seq % (2 * self.cp):
            raise CostModelError(
                f"context parallelism cuts seq={seq} into 2·cp = {2 * self.cp} chunks (the "
                f"load-balanced causal split) and {seq} mod {2 * self.cp} = {seq % (2 * self.cp)}")
        if self.cp > 1 and self.sequence_parallel and seq is not None \
                and seq % (self.cp * self.tp):
            raise CostModelError(
                f"sequence parallelism splits each rank's seq/cp = {seq}/{self.cp} tokens over "
                f"tp={self.tp} ({seq} mod {self.cp * self.tp} = {seq % (self.cp * self.tp)})")
        self._check_stages(layers)
        if batch is not None:
            resolved = self.resolve(batch)
            m = resolved.num_microbatches or 0
            if self.schedule.needs_round_microbatches and self.pp > 1 and m % self.pp:
                raise CostModelError(
                    f"{self.schedule} needs the microbatch count to be a multiple of pp: "
                    f"m = batch / ({'dp·mb' if self.cp == 1 else '(dp/cp)·mb'}) = {batch} / "
                    f"({self.replicas}·{self.microbatch_size}) = {m}, {m} mod {self.pp} = "
                    f"{m % self.pp}"
                )
            if m < self.schedule.min_microbatches(self.pp):
                raise CostModelError(
                    f"{self.schedule} needs at least 2·pp = {2 * self.pp} microbatches (one per "
                    f"virtual stage): m = batch / ({'dp·mb' if self.cp == 1 else '(dp/cp)·mb'}) "
                    f"= {batch} / ({self.replicas}·{self.microbatch_size}) = {m}")

    def _check_stages(self, layers: int) -> None:
        v = self.virtual_stages
        if self.stage_layers is not None:
            if sum(self.stage_layers) != layers:
                raise CostModelError(
                    f"stages={'/'.join(map(str, self.stage_layers))} hold "
                    f"{sum(self.stage_layers)} layers, the model has {layers}"
                )
            return
        stages = self.pp * v
        if stages > max(layers, 1):  # uneven stages cannot help: every stage needs a layer
            # (a model without repeated layers runs as one stage: layers = 0, pp·v = 1)
            raise CostModelError(
                f"pp·v = {self.pp}·{v} = {stages} stages for {layers} layers: every stage needs "
                f"at least one layer; use pp·v ≤ {max(layers, 1)}"
            )
        uneven = f"; or give stages=… ({stages} counts summing to {layers}) for uneven stages"
        if v > 1 and layers % stages:
            raise CostModelError(
                f"{self.schedule} needs layers divisible by pp·v = {self.pp}·{v} = "
                f"{stages} ({layers} mod {stages} = {layers % stages}){uneven}"
            )
        if layers % self.pp:
            raise CostModelError(
                f"pp={self.pp} does not divide layers={layers} ({layers} mod {self.pp} = "
                f"{layers % self.pp}){uneven}"
            )

    def layers_per_stage(self, layers: int) -> tuple[int, ...]:
        """Layer count of each virtual stage in pipeline order (``pp · v`` entries).

        Virtual stage ``j`` is chunk ``j // pp`` of pipeline stage ``j mod pp`` (Megatron's
        interleaved assignment), in a V (``zbv``, ``dualpipev``) that of
        :meth:`Schedule.placement`; without chunks ``j`` is simply stage ``j``.
        """
        if self.stage_layers is not None:
            return self.stage_layers
        chunks = self.pp * self.virtual_stages
        self._check_stages(layers)
        return (layers // chunks,) * chunks
