"""Profiled op database: measured op times keyed by op, input shapes, dtype and device model.

A database holds the forward time of a few ops (``OPS``) over a grid of shapes, measured on
one device model by ``fxplan profile`` (:mod:`cost_model.compute.profiler`). The format (JSON,
``format_version`` 1) is documented in ``docs/cost_model.md``.

Estimating an op that was not measured (:meth:`OpDatabase.estimate`):

1. exact match on (op, dtype, shapes) → the measured median;
2. otherwise pick the *family* of records whose shape is nearest in aspect, i.e. in
   ``a(s) = log2 f(s) − mean(log2 f(s))`` where ``f`` are the op's shape features (for a
   matmul ``(M, K, N)``): each family of the grid scales one aspect up and down;
3. within the family, between the two records bracketing the work ``w`` (FLOPs for
   compute-bound ops, bytes for the others): linear in ``w`` where the segment fits
   ``t = α + w/R`` with ``α ≥ 0`` (``t₂/t₁ ≤ w₂/w₁``, fixed cost plus rate), else ``log t``
   linear in ``log w``. Beyond the largest record time grows as ``w`` (throughput
   saturated); below the smallest it follows the first segment's log-log slope clamped to
   ``[0, 1]`` (fixed costs dominate small ops).

Without shapes (only FLOPs or bytes are known, as for a captured node) the op's first family
in the file, its primary one, is used.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import logging
import math
import os
import re
import statistics
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from fxplan.cost_model.compute.efficiency import dtype_key, normalise_model

log = logging.getLogger(__name__)

__all__ = ["OpKind", "OPS", "OP_ALIASES", "OP_CLASS_OPS", "Record", "OpDatabase", "find_database",
           "frozen_databases",
           "find_database_file", "search_dirs", "default_database_path", "element_bytes", "FORMAT_VERSION"]

FORMAT = "fxplan-op-database"
FORMAT_VERSION = 1

Shapes = tuple[tuple[int, ...], ...]

_ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp64": 8, "int": 8}


def element_bytes(dtype: Any) -> int:
    """Bytes per element of ``dtype`` (integers counted as int64, as indices are)."""
    return _ELEMENT_BYTES[dtype_key(dtype)]


def _rows(shape: Sequence[int]) -> int:
    return math.prod(shape[:-1])


@dataclass(frozen=True)
class OpKind:
    """What the database knows about an op from its input shapes alone.

    ``flops(shapes)`` and ``bytes(shapes, e)`` (``e`` bytes per element) are the forward work;
    ``features(shapes)`` the numbers that characterise the shape (for the aspect distance);
    ``work`` names the one that sets the time: ``"flops"`` or ``"bytes"``.
    """

    name: str
    work: str
    flops: Callable[[Shapes], float]
    bytes: Callable[[Shapes, int], float]
    features: Callable[[Shapes], tuple[int, ...]]


def _numel(s: Shapes) -> int:
    return math.prod(s[0])


#: The ops the profiler times. Conventions for ``shapes`` (the inputs, in call order):
#: linear ``x[..., K], w[N, K]``; bmm ``a[B, M, K], b[B, K, N]``; softmax/layer_norm over the
#: last dim of ``x[..., C]``; gelu/dropout ``x``; add/mul ``x, y`` (same shape); embedding
#: ``idx[...], table[V, H]``; conv2d ``x[N, C, H, W], w[K, C, R, S]`` (stride 1, same
#: padding); sdpa ``q, k, v [B, H, S, D]`` (not causal).
OPS: dict[str, OpKind] = {op.name: op for op in (
    OpKind("linear", "flops",
           lambda s: 2.0 * _rows(s[0]) * s[0][-1] * s[1][0],
           lambda s, e: e * (_rows(s[0]) * s[0][-1] + s[1][0] * s[1][1] + _rows(s[0]) * s[1][0]),
           lambda s: (_rows(s[0]), s[0][-1], s[1][0])),
    OpKind("bmm", "flops",
           lambda s: 2.0 * s[0][0] * s[0][1] * s[0][2] * s[1][2],
           lambda s, e: e * s[0][0] * (s[0][1] * s[0][2] + s[1][1] * s[1][2] + s[0][1] * s[1][2]),
           lambda s: (s[0][0], s[0][1], s[0][2], s[1][2])),
    OpKind("softmax", "bytes", lambda s: 5.0 * _numel(s), lambda s, e: 2.0 * e * _numel(s),
           lambda s: (_rows(s[0]), s[0][-1])),
    OpKind("layer_norm", "bytes", lambda s: 8.0 * _numel(s),
           lambda s, e: e * (2.0 * _numel(s) + 2 * s[0][-1]), lambda s: (_rows(s[0]), s[0][-1])),
    OpKind("gelu", "bytes", lambda s: 8.0 * _numel(s), lambda s, e: 2.0 * e * _numel(s),
           lambda s: (_numel(s),)),
    OpKind("add", "bytes", lambda s: float(_numel(s)), lambda s, e: 3.0 * e * _numel(s),
           lambda s: (_numel(s),)),
    OpKind("mul", "bytes", lambda s: float(_numel(s)), lambda s, e: 3.0 * e * _numel(s),
           lambda s: (_numel(s),)),
    OpKind("dropout", "bytes", lambda s: 2.0 * _numel(s), lambda s, e: (2.0 * e + 1) * _numel(s),
           lambda s: (_numel(s),)),
    OpKind("embedding", "bytes", lambda s: 0.0,
           lambda s, e: _numel(s) * (8 + 2.0 * e * s[1][1]), lambda s: (_numel(s), s[1][1])),
    OpKind("conv2d", "flops",
           lambda s: 2.0 * s[0][0] * s[0][2] * s[0][3] * math.prod(s[1]),
           lambda s, e: e * (_numel(s) + math.prod(s[1]) + s[0][0] * s[1][0] * s[0][2] * s[0][3]),
           lambda s: (s[0][0] * s[0][2] * s[0][3], math.prod(s[1][1:]), s[1][0])),
    OpKind("sdpa", "flops",
           lambda s: 4.0 * s[0][0] * s[0][1] * s[0][2] ** 2 * s[0][3],
           lambda s, e: 4.0 * e * _numel(s), lambda s: (s[0][0] * s[0][1], s[0][2], s[0][3])),
)}

#: Other names callers use for the same measured op.
OP_ALIASES: dict[str, str] = {"matmul": "linear", "mm": "linear", "addmm": "linear",
                              "layernorm": "layer_norm", "scaled_dot_product_attention": "sdpa",
                              "conv": "conv2d", "baddbmm": "bmm"}

#: The measured op that stands for a NodeInfo ``op_class`` when only its work is known.
OP_CLASS_OPS: dict[str, str] = {"matmul": "linear", "attention": "sdpa", "norm": "layer_norm",
                                "softmax": "softmax", "elementwise": "add", "dropout": "dropout",
                                "embedding": "embedding", "conv": "conv2d"}


@dataclass(frozen=True)
class Record:
    """One measurement: the median forward time of ``op`` on ``shapes`` in ``dtype``."""

    op: str
    family: str
    dtype: str
    shapes: Shapes
    flops: float
    bytes: float
    time_s: float
    iqr_s: float = 0.0

    @property
    def work(self) -> float:
        return self.flops if OPS[self.op].work == "flops" else self.bytes

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["shapes"] = [list(s) for s in self.shapes]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Record":
        return cls(**{**data, "shapes": tuple(tuple(int(d) for d in s) for s in data["shapes"])})


def _aspect(features: Sequence[int]) -> tuple[float, ...]:
    logs = [math.log2(max(f, 1)) for f in features]
    mean = sum(logs) / len(logs)
    return tuple(x - mean for x in logs)


@dataclass
class OpDatabase:
    """Records of one device model, with the metadata of the run that measured them."""

    device_model: str
    device_kind: str = "cpu"
    metadata: dict[str, Any] = field(default_factory=dict)
    records: list[Record] = field(default_factory=list)

    # -- storage -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "device_model": self.device_model,
                "device_kind": self.device_kind, "metadata": self.metadata,
                "records": [r.to_dict() for r in self.records]}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> "OpDatabase":
        if data.get("format") != FORMAT or data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{source}: not an op database of format {FORMAT!r} version "
                             f"{FORMAT_VERSION} (found {data.get('format')!r} "
                             f"version {data.get('format_version')!r})")
        return cls(data["device_model"], data.get("device_kind", "cpu"), data.get("metadata", {}),
                   [Record.from_dict(r) for r in data["records"]])

    @classmethod
    def load(cls, path: str | Path) -> "OpDatabase":
        return cls.from_dict(json.loads(Path(path).read_text()), str(path))

    # -- queries -----------------------------------------------------------------------------
    def matches(self, device_model: str) -> bool:
        """Whether this database was measured on ``device_model`` (vendor prefixes ignored,
        one normalised name containing the other: ``NVIDIA A100-SXM4-80GB`` ~ ``A100-SXM4-80GB``)."""
        a, b = _strip_vendor(self.device_model), _strip_vendor(device_model)
        return bool(a and b) and (a in b or b in a)

    def ops(self) -> list[str]:
        return sorted({r.op for r in self.records})

    def estimate(self, op: str, dtype: Any, *, shapes: Iterable[Sequence[int]] | None = None,
                 flops: float | None = None, bytes_moved: float | None = None) -> float | None:
        """Estimated forward seconds of ``op``, or ``None`` if the database cannot say (op or
        dtype not measured, or neither shapes nor the op's work given). See the module docstring."""
        op = OP_ALIASES.get(op, op)
        key = dtype_key(dtype)
        candidates = [r for r in self.records if r.op == op and r.dtype == key]
        if not candidates:
            return None
        kind = OPS[op]
        if shapes is not None:
            shapes_t: Shapes = tuple(tuple(int(d) for d in s) for s in shapes)
            exact = [r.time_s for r in candidates if r.shapes == shapes_t]
            if exact:
                return statistics.median(exact)
            work = kind.flops(shapes_t) if kind.work == "flops" else kind.bytes(shapes_t, element_bytes(key))
            family = _nearest_family(candidates, _aspect(kind.features(shapes_t)))
        else:
            work = flops if kind.work == "flops" else bytes_moved
            if work is None:
                return None
            family = candidates[0].family
        return _interpolate([r for r in candidates if r.family == family], work)


def _nearest_family(records: list[Record], aspect: tuple[float, ...]) -> str:
    by_family: dict[str, list[tuple[float, ...]]] = {}
    for r in records:
        by_family.setdefault(r.family, []).append(_aspect(OPS[r.op].features(r.shapes)))

    def distance(family: str) -> float:
        aspects = by_family[family]
        centre = [sum(a[i] for a in aspects) / len(aspects) for i in range(len(aspect))]
        return math.dist(centre, aspect) if len(centre) == len(aspect) else math.inf

    return min(by_family, key=distance)


def _interpolate(records: list[Record], work: float) -> float:
    """Time at ``work`` along one family: linear in work on a fixed-cost-plus-rate segment,
    else log-log (module docstring, step 3)."""
    points: dict[float, list[float]] = {}
    for r in records:
        points.setdefault(math.log(max(r.work, 1e-30)), []).append(math.log(r.time_s))
    xs = sorted(points)
    ys = [statistics.mean(points[x]) for x in xs]
    x = math.log(max(work, 1e-30))
    if len(xs) == 1:
        return math.exp(ys[0] + (x - xs[0]))
    if x >= xs[-1]:
        return math.exp(ys[-1] + (x - xs[-1]))
    if x <= xs[0]:
        slope = min(max((ys[1] - ys[0]) / (xs[1] - xs[0]), 0.0), 1.0)
        return math.exp(ys[0] + slope * (x - xs[0]))
    i = bisect.bisect_right(xs, x)
    t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    if ys[i] - ys[i - 1] <= xs[i] - xs[i - 1]:
        # t₂/t₁ ≤ w₂/w₁: the segment fits t = α + w/R with α ≥ 0, linear in w
        w1, w2, t1, t2 = (math.exp(v) for v in (xs[i - 1], xs[i], ys[i - 1], ys[i]))
        return t1 + (work - w1) * (t2 - t1) / (w2 - w1)
    return math.exp(ys[i - 1] + t * (ys[i] - ys[i - 1]))


def _strip_vendor(model: str) -> str:
    name = normalise_model(model)
    for vendor in ("nvidia", "amd", "intel", "tesla"):
        name = name.removeprefix(vendor)
    return name


def search_dirs() -> list[Path]:
    """Where :func:`find_database` looks, in order: ``$FXPLAN_OP_DB_PATH`` (``os.pathsep``
    separated), ``$XDG_CACHE_HOME/fxplan/ops`` (default ``~/.cache/fxplan/ops``, where
    ``fxplan profile`` writes), and ``cost_model/data/ops`` (a search location for databases
    shipped with the package; none is shipped yet, so it does not exist)."""
    dirs = [Path(p) for p in os.environ.get("FXPLAN_OP_DB_PATH", "").split(os.pathsep) if p]
    return [*dirs, _cache_dir(), Path(__file__).parents[1] / "data" / "ops"]


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fxplan" / "ops"


def default_database_path(device_model: str) -> Path:
    """Where ``fxplan profile`` writes by default: the user cache of :func:`search_dirs`,
    one file per device model (``cpu.json``, ``nvidia-h100-80gb-hbm3.json``)."""
    slug = re.sub(r"[^a-z0-9]+", "-", device_model.lower()).strip("-") or "device"
    return _cache_dir() / f"{slug}.json"


#: The search path's files while :func:`frozen_databases` holds them (``None``: look each time).
_frozen: tuple[tuple[str, float], ...] | None = None


@contextlib.contextmanager
def frozen_databases() -> Iterator[None]:
    """Within the block, :func:`database_files` answers what it found on entry: one search
    prices tens of thousands of ops, and listing the search path for each (a directory scan
    and a ``stat`` per file) was a third of the time of pricing them. A database written
    during the block is seen by the next one. Nested blocks keep the outermost snapshot."""
    global _frozen
    if _frozen is not None:
        yield
        return
    _frozen = database_files()
    try:
        yield
    finally:
        _frozen = None


def database_files() -> tuple[tuple[str, float], ...]:
    """``(path, mtime)`` of every ``*.json`` in :func:`search_dirs`, in search order: what
    :func:`find_database` would read now (a cache key that changes when a database is
    written, rewritten or removed, or ``$FXPLAN_OP_DB_PATH`` changes), or inside
    :func:`frozen_databases`, what it read on entering the block."""
    if _frozen is not None:
        return _frozen
    found = []
    for directory in search_dirs():
        for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
            try:
                found.append((str(path), path.stat().st_mtime))
            except OSError:
                continue
    return tuple(found)


def find_database(device_model: str) -> OpDatabase | None:
    """The first database in :func:`search_dirs` measured on ``device_model``, or ``None``."""
    return _find_in(device_model, database_files())


@lru_cache(maxsize=64)
def _find_in(device_model: str, files: tuple[tuple[str, float], ...]) -> OpDatabase | None:
    """The first of ``files`` (:func:`database_files`) measured on ``device_model``; cached
    on the files and their mtimes, so a new or changed database is seen at once."""
    for path, mtime in files:
        db = _load_cached(path, mtime)
        if db is not None and db.matches(device_model):
            return db
    return None


@lru_cache(maxsize=32)
def _load_cached(path: str, mtime: float) -> OpDatabase | None:
    try:
        return OpDatabase.load(path)
    except (ValueError, KeyError, TypeError) as err:
        log.warning("ignoring %s: not a readable op database (%s)", path, err)
        return None


def find_database_file(device_model: str) -> str | None:
    """The file :func:`find_database` reads for ``device_model``, or ``None`` (for saying
    where the prices come from, as ``fxplan doctor`` does)."""
    for path, mtime in database_files():
        db = _load_cached(path, mtime)
        if db is not None and db.matches(device_model):
            return path
    return None
