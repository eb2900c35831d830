"""Placements of distributed tensors: the typed placement map of a plan, compact placement
strings and local shapes.

A distributed tensor carries one placement per mesh axis, using PyTorch's public types
(:class:`~torch.distributed.tensor.Shard`, :class:`~torch.distributed.tensor.Replicate`,
:class:`~torch.distributed.tensor.Partial`). fxplan prints them compactly, one token per
axis, in mesh-axis order:

    ``S(d)``  shard tensor dim ``d`` over the axis
    ``R``     replicate over the axis
    ``P``     partial sum over the axis (each rank holds an addend)

so ``S(0)R`` is "batch-sharded over axis 0, replicated over axis 1". The local shape of a
tensor with global shape ``g`` is ``g[d] / n_a`` on every dim ``d`` sharded by an axis ``a``
of size ``n_a`` (ceil division, as torch pads uneven shards).

:data:`Placements` is one placement per mesh axis; :class:`PlacementMap` is what a plan (and the
cost model, :attr:`fxplan.core.config.ParallelConfig.placements`) says about a whole graph on
the stage mesh: node outputs, what a consumer needs of one of its inputs where that differs
from the producer's output (keyed by the typed :class:`DataEdge`), and parameters. The map is typed
throughout; it becomes strings only in :meth:`PlacementMap.to_json` / :meth:`PlacementMap.from_json`.
"""

from __future__ import annotations

import math
import re
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

__all__ = [
    "DataEdge",
    "Placement",
    "PlacementMap",
    "Placements",
    "Partial",
    "Replicate",
    "Shard",
    "format_placements",
    "parse_placements",
    "local_shape",
    "shard_factor",
]

#: One placement per mesh axis, in mesh-axis order: ``(Shard(0), Replicate())`` is ``S(0)R``.
Placements = tuple[Placement, ...]

_TOKEN = re.compile(r"S\((-?\d+)\)|R|P")


def format_placement(placement: Placement) -> str:
    """One token: ``S(d)``, ``R`` or ``P``."""
    # the exact types first: torch's Placement classes check isinstance in Python, and a
    # search formats tens of thousands of placements
    kind = type(placement)
    if kind is Replicate:
        return "R"
    if kind is Shard:
        return f"S({placement.dim})"
    if isinstance(placement, Shard):
        return f"S({placement.dim})"
    if isinstance(placement, Replicate):
        return "R"
    if isinstance(placement, Partial):
        return "P"
    raise TypeError(f"unknown placement type {type(placement).__name__}")


def format_placements(placements: Sequence[Placement]) -> str:
    """``(Shard(0), Replicate())`` → ``"S(0)R"``."""
    return "".join(format_placement(p) for p in placements)


def parse_placements(text: str) -> tuple[Placement, ...]:
    """``"S(0)R"`` → ``(Shard(0), Replicate())``; the inverse of :func:`format_placements`."""
    placements: list[Placement] = []
    position = 0
    compact = text.replace(" ", "")
    while position < len(compact):
        match = _TOKEN.match(compact, position)
        if match is None:
            raise ValueError(
                f"bad placement string {text!r} at position {position}: expected one token per "
                "mesh axis among S(d), R, P (e.g. 'S(0)R')"
            )
        token = match.group(0)
        if token == "R":
            placements.append(Replicate())
        elif token == "P":
            placements.append(Partial())
        else:
            placements.append(Shard(int(match.group(1))))
        position = match.end()
    return tuple(placements)


def shard_factor(placements: Sequence[Placement], mesh_shape: Sequence[int], ndim: int | None = None) -> int:
    """How many ways the tensor's elements are split: the product of the sizes of the axes
    that shard it (replicated and partial axes hold full-size local tensors)."""
    factor = 1
    for placement, size in zip(placements, mesh_shape, strict=True):
        if isinstance(placement, Shard):
            factor *= size
    return factor


def local_shape(
    global_shape: Sequence[int], placements: Sequence[Placement], mesh_shape: Sequence[int]
) -> tuple[int, ...]:
    """Per-rank shape: ``ceil(g[d] / n_a)`` for each axis ``a`` sharding dim ``d``."""
    shape = list(global_shape)
    for placement, size in zip(placements, mesh_shape, strict=True):
        if isinstance(placement, Shard):
            dim = placement.dim % len(shape) if shape else 0
            if not shape:
                raise ValueError("cannot shard a scalar")
            shape[dim] = math.ceil(shape[dim] / size)
    return tuple(shape)


@dataclass(frozen=True, order=True)
class DataEdge:
    """The data edge from ``producer`` into its consumer node ``consumer`` (fx node names)."""

    consumer: str
    producer: str


#: Placement types checked by identity before ``isinstance`` (torch's is slow for them).
_EXACT = frozenset({Shard, Replicate, Partial})


def _frozen(items: Mapping[Any, Placements], axes: tuple[str, ...], what: str
            ) -> types.MappingProxyType:
    out = {}
    for key, placements in items.items():
        placements = tuple(placements)
        if len(placements) != len(axes) or not all(type(p) in _EXACT or isinstance(p, Placement)
                                                   for p in placements):
            raise ValueError(
                f"{what} {key}: placements {placements!r} must be one torch Placement per mesh "
                f"axis {axes} ({len(axes)}), got {len(placements)}")
        out[key] = placements
    return types.MappingProxyType(out)


#: One live map per text hash, whose text the equal maps made later share (by identity).
_TEXTS: "weakref.WeakValueDictionary[int, PlacementMap]" = weakref.WeakValueDictionary()


@dataclass(frozen=True, eq=True)
class PlacementMap:
    """Placements chosen for a graph on the stage mesh whose axes are ``axes``.

    ``nodes``   node name → the placements of its output;
    ``inputs``  :class:`DataEdge` ``(consumer, producer)`` → what ``consumer`` reads of
                ``producer``, listed only where it differs from ``nodes[producer]`` (each such
                edge is a reshard);
    ``params``  parameter name (its fully qualified name) → its placements.

    Every value has one :data:`Placement` per axis. The map is immutable and hashable (the
    cost model caches by it); JSON uses strings (:meth:`to_json`)::

        {"axes": ["dp", "tp"], "nodes": {"h_0_ln1": "S(0)S(1)"},
         "inputs": [{"consumer": "h_0_attn_qkv", "producer": "h_0_ln1", "placements": "S(0)R"}],
         "params": {"h.0.attn.qkv.weight": "RS(0)"}}
    """

    nodes: Mapping[str, Placements] = field(default_factory=dict)
    inputs: Mapping[DataEdge, Placements] = field(default_factory=dict)
    params: Mapping[str, Placements] = field(default_factory=dict)
    axes: tuple[str, ...] = ("dp", "tp")
    _text: tuple = field(init=False, repr=False, compare=False, default=())
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        axes = tuple(self.axes)
        object.__setattr__(self, "axes", axes)
        object.__setattr__(self, "nodes", _frozen(self.nodes, axes, "node"))
        for edge in self.inputs:
            if not isinstance(edge, DataEdge):
                raise ValueError(f"inputs are keyed by DataEdge(consumer, producer), got {edge!r}")
        object.__setattr__(self, "inputs", _frozen(self.inputs, axes, "input"))
        object.__setattr__(self, "params", _frozen(self.params, axes, "parameter"))
        # The map is immutable and the cost model memoises by it thousands of times per search,
        # often with an equal map built anew: compare and hash its text form, made once
        # (comparing torch Placement objects entry by entry made a search several times slower).
        object.__setattr__(self, "_text", (
            axes,
            tuple(sorted((name, format_placements(p)) for name, p in self.nodes.items())),
            tuple(sorted((e.consumer, e.producer, format_placements(p))
                         for e, p in self.inputs.items())),
            tuple(sorted((name, format_placements(p)) for name, p in self.params.items()))))
        object.__setattr__(self, "_hash", hash(self._text))
        # equal maps share one text (compared once here, by identity after): a finalist's map
        # is looked up in the memos once per segment it prices
        known = _TEXTS.get(self._hash)
        if known is not None and known._text == self._text:
            object.__setattr__(self, "_text", known._text)
        else:
            _TEXTS[self._hash] = self

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PlacementMap):
            return NotImplemented
        return self is other or self._text is other._text or self._text == other._text

    def __hash__(self) -> int:
        return self._hash

    def axis(self, name: str) -> int:
        """The index of mesh axis ``name`` in every value of the map."""
        if name not in self.axes:
            raise ValueError(f"placements are over axes {self.axes}, not {name!r}")
        return self.axes.index(name)

    def to_json(self) -> dict[str, Any]:
        """The JSON form (class docstring): compact strings, inputs as a sorted list."""
        return {
            "axes": list(self.axes),
            "nodes": {name: format_placements(p) for name, p in self.nodes.items()},
            "inputs": [{"consumer": e.consumer, "producer": e.producer,
                        "placements": format_placements(self.inputs[e])}
                       for e in sorted(self.inputs)],
            "params": {name: format_placements(p) for name, p in self.params.items()},
        }

    @classmethod
    def from_json(cls, data: Any) -> "PlacementMap":
        """The inverse of :meth:`to_json`; raises ``ValueError`` naming what is malformed."""
        if not isinstance(data, Mapping):
            raise ValueError(f"placements must be an object, got {type(data).__name__}")
        unknown = sorted(set(data) - {"axes", "nodes", "inputs", "params"})
        if unknown:
            raise ValueError(f"placements has unknown keys {unknown}")
        axes = data.get("axes", ["dp", "tp"])
        if not isinstance(axes, list) or not all(isinstance(a, str) for a in axes):
            raise ValueError(f"placements.axes must be a list of axis names, got {axes!r}")
        nodes, params = (_strings(data.get(key, {}), f"placements.{key}")
                         for key in ("nodes", "params"))
        inputs = data.get("inputs", [])
        if not isinstance(inputs, list):
            raise ValueError(f"placements.inputs must be a list, got {type(inputs).__name__}")
        edges: dict[DataEdge, Placements] = {}
        for i, item in enumerate(inputs):
            where = f"placements.inputs[{i}]"
            if not isinstance(item, Mapping) or set(item) != {"consumer", "producer", "placements"}:
                raise ValueError(f"{where} must be an object with keys consumer, producer, "
                                 f"placements, got {item!r}")
            edges[DataEdge(str(item["consumer"]), str(item["producer"]))] = \
                _parsed(item["placements"], where)
        return cls(nodes, edges, params, tuple(axes))


def _parsed(text: Any, where: str) -> Placements:
    if not isinstance(text, str):
        raise ValueError(f"{where} must be a placement string such as 'S(0)R', got {text!r}")
    try:
        return parse_placements(text)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def _strings(value: Any, where: str) -> dict[str, Placements]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be an object, got {type(value).__name__}")
    return {str(k): _parsed(v, f"{where}[{k!r}]") for k, v in value.items()}
