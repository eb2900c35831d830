"""Which machines, how many, how long, at what cost: ``fxplan compare`` (its arithmetic).

For each cluster kind ``k`` (a spec name such as ``dgx-h100``) and each size ``n`` tried, the
search (:func:`fxplan.inter_op.search`) plans MODEL on ``k`` resized to ``n`` devices
(:func:`fxplan.cluster_specs.overrides.with_devices`) for the global batch ``B`` sequences of
``s`` tokens; from the plan's predicted step time ``t``::

    steps         S = ⌈T / (B·s)⌉                  T: the tokens to train on
    days          D = S·t / 86 400
    device-hours  H = n·S·t / 3600
    cost          C = H·p_k                        p_k: the user's price per device-hour of k

With a deadline ``D*``, the sizes of ``k`` are tried in increasing order and the first whose
``D ≤ D*`` is kept (the smallest number of devices, among the sizes tried, that trains MODEL by
the deadline); none meeting it keeps the largest tried, marked. Without a deadline every size is
a row (a sweep). Rows are sorted by cost, or by device-hours when no prices are given. The
**Pareto front** of days against cost (device-hours without prices): the rows no other row
beats on both, i.e. with ``D_j ≤ D_i`` and ``C_j ≤ C_i`` and one of them strictly.

Sizes: the powers of two in ``[low, high]`` that the kind can be resized to (part of one node,
or whole nodes). One graph is captured per training dtype (:func:`capture_for_search`) and
reused by every search. The searches of one kind share their intra-op answers
(:func:`fxplan.inter_op.placements.shared_solves`), and with several worker processes
(``jobs``) each sweeps whole kinds; neither changes a row.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from fxplan.core.errors import UserError

__all__ = ["CompareError", "CompareRow", "Comparison", "DEFAULT_CLUSTERS", "compare",
           "pareto_front", "parse_duration_days", "parse_prices", "parse_size_range",
           "parse_tokens", "sizes_for"]

#: The kinds compared when ``--clusters`` is not given.
DEFAULT_CLUSTERS: tuple[str, ...] = ("dgx-h100", "hgx-h200", "dgx-b200", "gb200-nvl72", "mi300x")
_SUFFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
_DAYS = {"d": 1.0, "h": 1 / 24, "w": 7.0}


class CompareError(UserError, ValueError):
    """A bad ``fxplan compare`` input (tokens, deadline, prices, sizes), said in one paragraph."""


def parse_tokens(text: str, what: str = "--tokens") -> float:
    """``"2T"`` → 2·10¹², ``"300B"`` → 3·10¹¹, ``"4M"`` → 4·10⁶, ``"4096"`` → 4096 (K/k, M, B/G, T)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKMBGT]?)\s*", str(text))
    if not match or float(match[1]) <= 0:
        raise CompareError(f"{what}: found {text!r}, expected a positive number of tokens with an "
                           "optional suffix K, M, B (or G) or T, e.g. 2T, 300B, 4M")
    return float(match[1]) * _SUFFIX[match[2]]


def parse_duration_days(text: str) -> float:
    """``"30d"`` → 30, ``"12h"`` → 0.5, ``"2w"`` → 14 (days)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([dhw])\s*", str(text))
    if not match or float(match[1]) <= 0:
        raise CompareError(f"--deadline: found {text!r}, expected a positive duration in days, "
                           "hours or weeks, e.g. 30d, 12h, 2w")
    return float(match[1]) * _DAYS[match[2]]


def parse_prices(text: str | None = None, mapping: Mapping[str, Any] | None = None,
                 source: str = "--price") -> dict[str, float]:
    """``"dgx-h100=2.10,dgx-b200=3.90"`` (or a mapping read from ``--prices FILE``) → prices per
    device-hour by cluster kind."""
    items: list[tuple[str, Any]] = []
    if text:
        for part in text.split(","):
            name, eq, value = part.partition("=")
            if not eq or not name.strip():
                raise CompareError(f"{source}: found {part.strip()!r}, expected KIND=PRICE (the "
                                   "price of one device-hour), several separated by commas, e.g. "
                                   "dgx-h100=2.10,dgx-b200=3.90")
            items.append((name.strip(), value.strip()))
    if mapping is not None:
        if not isinstance(mapping, Mapping):
            raise CompareError(f"{source}: found {type(mapping).__name__}, expected a mapping "
                               "from cluster kind to its price per device-hour")
        items += list(mapping.items())
    out: dict[str, float] = {}
    for name, value in items:
        try:
            price = float(value)
        except (TypeError, ValueError):
            price = -1.0
        if isinstance(value, bool) or not math.isfinite(price) or price <= 0:
            raise CompareError(f"{source}: {name}: found {value!r}, expected a price > 0 per "
                               "device-hour")
        out[str(name)] = price
    return out


def parse_size_range(text: str) -> tuple[int, int]:
    """``"64..4096"`` → (64, 4096); ``"512"`` → (512, 512)."""
    match = re.fullmatch(r"\s*(\d+)\s*(?:\.\.\s*(\d+))?\s*", str(text))
    low, high = (int(match[1]), int(match[2] or match[1])) if match else (0, 0)
    if not match or low < 1 or high < low:
        raise CompareError(f"--devices: found {text!r}, expected LOW..HIGH device counts with "
                           "1 ≤ LOW ≤ HIGH (e.g. 64..4096), or one count")
    return low, high


def sizes_for(per_node: int, low: int, high: int) -> list[int]:
    """The powers of two in ``[low, high]`` a kind of ``per_node`` devices per node can be
    resized to: ``n ≤ per_node`` (part of a node) or a multiple of ``per_node``."""
    out, n = [], 1
    while n <= high:
        if n >= low and (n <= per_node or n % per_node == 0):
            out.append(n)
        n *= 2
    return out


@dataclass(frozen=True)
class CompareRow:
    """One cluster kind at one size, with the plan the search chose there."""

    cluster: str
    spec: str
    devices: int
    summary: str
    step_time_s: float
    mfu: float | None
    peak_memory_gib: float | None
    steps: int
    days: float
    device_hours: float
    price_per_device_hour: float | None
    cost: float | None
    meets_deadline: bool | None = None
    pareto: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Comparison:
    """The rows, sorted (module docstring), and what they were computed for."""

    model: str
    tokens: float
    batch: int
    seq: int | None
    deadline_days: float | None
    ranked_by: str                     # "cost" or "device-hours"
    rows: list[CompareRow]
    unplanned: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "tokens": self.tokens, "batch": self.batch, "seq": self.seq,
                "deadline_days": self.deadline_days, "ranked_by": self.ranked_by,
                "rows": [r.to_dict() for r in self.rows], "unplanned": self.unplanned,
                "elapsed_s": self.elapsed_s}


def pareto_front(points: Sequence[tuple[float, float]]) -> list[bool]:
    """Whether each ``(days, cost)`` point is on the front: no other point is ≤ in both and
    < in one."""
    return [not any(d2 <= d and c2 <= c and (d2 < d or c2 < c) for d2, c2 in points)
            for d, c in points]


def _check_prices(prices: Mapping[str, float], kinds: Sequence[str]) -> None:
    """A price for every compared kind, or none (module docstring)."""
    unknown = sorted(set(prices) - set(kinds))
    if unknown:
        raise CompareError(f"prices given for {', '.join(unknown)}, which are not among the "
                           f"clusters compared ({', '.join(kinds)}); expected a price for a "
                           "compared kind (or add it to --clusters)")
    if prices and set(prices) != set(kinds):
        missing = sorted(set(kinds) - set(prices))
        raise CompareError(f"no price for {', '.join(missing)}; expected a price for every "
                           "compared cluster kind, or none (then the comparison ranks by "
                           "device-hours)")


def _row(kind: str, spec: str, devices: int, plan: Any, tokens: float, batch: int, seq: int,
         price: float | None, deadline_days: float | None) -> CompareRow:
    est = plan.estimate
    step = float(est["step_time_s"])
    steps = math.ceil(tokens / (batch * seq))
    days = steps * step / 86400
    hours = devices * steps * step / 3600
    return CompareRow(
        cluster=kind, spec=spec, devices=devices, summary=plan.summary, step_time_s=step,
        mfu=est.get("mfu"), peak_memory_gib=est.get("max_memory_gib"), steps=steps, days=days,
        device_hours=hours, price_per_device_hour=price,
        cost=None if price is None else hours * price,
        meets_deadline=None if deadline_days is None else days <= deadline_days)


@dataclass
class _Sweep:
    """What every size of every kind is planned with: the graphs by training dtype, the
    global batch, the search options, and the arithmetic's inputs (module docstring)."""

    graphs: dict[str, Any]
    batch: int
    seq: int | None
    options: dict[str, Any]
    tokens: float
    prices: Mapping[str, float]
    deadline_days: float | None
    sizes: tuple[int, int]

    def kind(self, kind: str, on_row: Callable[[CompareRow], None] | None = None) -> _Swept:
        """The rows of ``kind`` (every size, or with a deadline the one kept) and the sizes it
        could not plan, with their reasons."""
        from fxplan.cluster_specs import Cluster, training_dtype
        from fxplan.cluster_specs.overrides import with_devices
        from fxplan.inter_op import search
        from fxplan.inter_op.constraints import ConstraintError
        from fxplan.inter_op.infeasible import InfeasibleError
        from fxplan.inter_op.placements import shared_solves

        base = Cluster.load(kind)
        graph = self.graphs[training_dtype(base)]
        found = sizes_for(base.devices_per_node(), *self.sizes)
        if not found:
            return _Swept([], [{"cluster": kind, "reason": f"no power-of-two size in "
                                f"{self.sizes[0]}..{self.sizes[1]} fits its "
                                f"{base.devices_per_node()} devices per node"}])
        kept: list[CompareRow] = []
        unplanned: list[dict[str, Any]] = []
        seqs: list[int | None] = []
        with shared_solves():     # an intra-op answer per tp degree, not one per size
            for n in found:
                resized = with_devices(kind, n)
                try:
                    plan = search(graph, Cluster.load(resized), batch=self.batch, seq=self.seq,
                                  **self.options)
                except (InfeasibleError, ConstraintError) as err:
                    unplanned.append({"cluster": kind, "devices": n,
                                      "reason": str(err).split("\n")[0]})
                    continue
                seqs.append(plan.seq)
                row = _row(kind, resized, n, plan, self.tokens, self.batch, plan.seq or 1,
                           self.prices.get(kind), self.deadline_days)
                kept.append(row)
                if on_row is not None:
                    on_row(row)
                if self.deadline_days is not None and row.meets_deadline:
                    break
        if self.deadline_days is not None and kept:
            kept = [kept[-1]]          # the first meeting the deadline, else the largest tried
        return _Swept(kept, unplanned, seqs)


@dataclass
class _Swept:
    """A kind swept: its rows, the sizes it could not plan, the ``seq`` of each plan made."""

    rows: list[CompareRow]
    unplanned: list[dict[str, Any]]
    seqs: list[int | None] = field(default_factory=list)


#: The sweep the worker processes of :func:`_sweep_in_parallel` run (inherited when they fork).
_FORKED: list[_Sweep] = []


def _sweep_forked(kind: str) -> _Swept | None:
    """:meth:`_Sweep.kind` in a worker process; ``None`` when it raised (the parent then plans
    the kind itself, so the error is raised there as it would be without workers)."""
    try:
        return _FORKED[-1].kind(kind)
    except Exception:  # noqa: BLE001 - re-raised by the parent's own run of the kind
        return None


def _sweep_in_parallel(sweep: _Sweep, kinds: Sequence[str], jobs: int,
                       on_row: Callable[[CompareRow], None] | None
                       ) -> dict[str, _Swept]:
    """Each kind swept in one of ``jobs`` forked worker processes (the captured graphs are
    inherited, not copied); ``on_row`` sees a kind's rows when it is done. The searches are
    the same as in one process (no time budget enters them: :func:`compare`), so are the
    rows."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    _FORKED.append(sweep)
    out: dict[str, _Swept] = {}
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            futures = {pool.submit(_sweep_forked, kind): kind for kind in kinds}
            for future in as_completed(futures):
                kind = futures[future]
                done = future.result()
                out[kind] = done if done is not None else sweep.kind(kind)
                for row in out[kind].rows if on_row is not None else ():
                    on_row(row)
    finally:
        _FORKED.pop()
    return out


def _jobs(jobs: int | None, kinds: int, time_budget_s: float | None) -> int:
    """Worker processes for ``kinds`` kinds: ``jobs``, or one per CPU (at most one per kind);
    one under a time budget, whose searches depend on the CPU time they get."""
    import multiprocessing
    import os

    if time_budget_s is not None or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    if jobs is None:
        jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
    return max(1, min(jobs, kinds))


def compare(model: str, *, tokens: float, batch: int | None = None,
            batch_tokens: int | None = None, seq: int | None = None,
            clusters: Iterable[str] = DEFAULT_CLUSTERS, sizes: tuple[int, int] = (64, 4096),
            prices: Mapping[str, float] | None = None, deadline_days: float | None = None,
            time_budget_s: float | None = None, constraints: Mapping[str, Any] | None = None,
            on_row: Callable[[CompareRow], None] | None = None,
            jobs: int | None = None) -> Comparison:
    """Plan ``model`` on each cluster kind at each size (module docstring). The global batch is
    ``batch`` sequences, or ``batch_tokens`` tokens (:mod:`fxplan.batch_tokens`; one of them).
    ``jobs``: worker processes, each sweeping whole kinds (default: one per CPU, at most one
    per kind; 1 with a time budget); the rows do not depend on it."""
    from fxplan.batch_tokens import batch_from_tokens
    from fxplan.cost_model.step.layer_costs import graph_segments
    from fxplan.api import capture_for_search
    from fxplan.cluster_specs import Cluster, training_dtype
    from fxplan.examples.model_spec import canonical_spec

    start = time.perf_counter()
    prices = dict(prices or {})
    kinds = list(dict.fromkeys(clusters))
    _check_prices(prices, kinds)
    spec = canonical_spec(model)
    graphs: dict[str, Any] = {}
    for kind in kinds:             # one capture per training dtype, before any search
        dtype = training_dtype(Cluster.load(kind))
        if dtype not in graphs:
            graphs[dtype] = capture_for_search(spec, seq=seq, dtype=dtype)
        if batch is None:
            batch = batch_from_tokens(int(batch_tokens or 0),
                                      seq or graph_segments(graphs[dtype]).seq)
    sweep = _Sweep(graphs, batch or 0, seq, {
        "constraints": dict(constraints or {}), "time_budget_s": time_budget_s,
        "progress": False, "model": spec}, tokens, prices, deadline_days, sizes)
    workers = _jobs(jobs, len(kinds), time_budget_s)
    swept = (_sweep_in_parallel(sweep, kinds, workers, on_row) if workers > 1
             else {kind: sweep.kind(kind, on_row) for kind in kinds})
    rows = [row for kind in kinds for row in swept[kind].rows]
    unplanned = [item for kind in kinds for item in swept[kind].unplanned]
    seqs = [s for kind in kinds for s in swept[kind].seqs]
    seq_seen = seqs[-1] if seqs else seq      # the last plan's, as one process finds it
    ranked_by = "cost" if prices else "device-hours"
    metric = (lambda r: r.cost) if prices else (lambda r: r.device_hours)
    front = pareto_front([(r.days, metric(r)) for r in rows])
    rows = sorted((CompareRow(**{**r.to_dict(), "pareto": on}) for r, on in zip(rows, front)),
                  key=lambda r: (metric(r), r.days))
    return Comparison(model=spec, tokens=tokens, batch=batch or 0, seq=seq_seen,
                      deadline_days=deadline_days, ranked_by=ranked_by,
                      rows=rows, unplanned=unplanned, elapsed_s=time.perf_counter() - start)
