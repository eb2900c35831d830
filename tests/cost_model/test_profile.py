"""The CPU profiler's quick grid and the op database's estimates of shapes it did not measure
(``fxplan profile`` itself: ``tests/cli/test_profile.py``).

The estimates are checked deterministically: the profiler runs its real quick grid (every
other scale of the CPU grid, factor 4 apart in size) with the measurement replaced by a known
law, fixed cost plus rate (a different rate for each of linear's families); interpolation must give
back the law at every shape between two grid scales (the odd scales of the full grid and
``OFF_GRID``). Against fresh measurements on this CPU, which depend on the machine's load,
``benchmarks/op_database_accuracy.py`` measures and prints the error.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from fxplan.cost_model.compute import profiler
from fxplan.cost_model.compute.op_database import OPS, OpDatabase, element_bytes
from fxplan.cost_model.compute.profiler import GRID, profile

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "op_database_accuracy.py"
#: The shapes the accuracy benchmark measures, between two scales of the quick grid.
OFF_GRID = runpy.run_path(str(BENCHMARK), run_name="op_database_accuracy")["OFF_GRID"]


#: The law the fake measurement follows: a fixed cost, then the op's work (FLOPs or bytes, as
#: the database interpolates it) at a rate, so that an estimate extrapolated instead of
#: interpolated is visibly off. Linear's three families never share a shape, so they get
#: rates a factor 2 apart and an estimate from the wrong family is off too; bmm's two share
#: s = 64 (the same product), so they share a rate.
FIXED_S = 20e-6
RATE = {"flops": 1e10, "bytes": 1e9}
SLOWER = {"square": 1, "mlp-up": 2, "mlp-down": 4}
#: Which linear family a shape belongs to, for every scale up to the grid's largest.
LINEAR_FAMILY = {f.shape(s): f.name for f in GRID if f.op == "linear" for s in range(1, f.cpu[-1] + 1)}


def law_s(op: str, shapes: tuple[tuple[int, ...], ...]) -> float:
    kind = OPS[op]
    work = kind.flops(shapes) if kind.work == "flops" else kind.bytes(shapes, element_bytes("fp32"))
    slower = SLOWER[LINEAR_FAMILY[shapes]] if op == "linear" else 1
    return FIXED_S + work * slower / RATE[kind.work]


@pytest.fixture
def lawful_quick_db(monkeypatch) -> OpDatabase:  # type: ignore[no-untyped-def]
    """The quick CPU grid profiled with ``measure`` replaced by :func:`law_s` (no tensors)."""
    measured: list[tuple[str, tuple[tuple[int, ...], ...]]] = []

    def fake_measure(op, args, device, min_run_time):  # type: ignore[no-untyped-def]
        measured.append((op, args[0]))
        return law_s(op, args[0]), 0.0

    monkeypatch.setattr(profiler, "make_call", lambda op, shapes, dtype, device: (op, (shapes,)))
    monkeypatch.setattr(profiler, "measure", fake_measure)
    db = profile("cpu", quick=True, rounds=2, device_model="test-cpu")
    quick = [(f.op, f.shape(s)) for f in GRID for s in f.scales("cpu", quick=True)]
    assert measured == quick * 2  # the whole grid, twice
    return db


def test_quick_grid_records_follow_the_measurements(lawful_quick_db: OpDatabase) -> None:
    db = lawful_quick_db
    assert set(db.ops()) == set(OPS) and db.metadata["rounds"] == 2
    for record in db.records:
        assert record.time_s == pytest.approx(law_s(record.op, record.shapes), rel=1e-12)


def test_shapes_between_grid_scales_are_interpolated_in_their_family(lawful_quick_db: OpDatabase) -> None:
    db = lawful_quick_db
    measured = {(r.op, r.shapes) for r in db.records}
    between = [(f.op, f.shape(s)) for f in GRID for s in f.cpu[1:-1:2]]  # odd scales of the full grid
    assert len(between) == 40
    for op, shapes in [*OFF_GRID, *between]:
        shapes = tuple(tuple(d) for d in shapes)
        assert (op, shapes) not in measured
        estimate = db.estimate(op, "fp32", shapes=shapes)
        assert estimate == pytest.approx(law_s(op, shapes), rel=1e-9), (op, shapes)


def test_cpu_database_model_is_the_local_cpu_spec_model(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # one function names the CPU for both, whatever /proc/cpuinfo and platform say
    import platform
    from pathlib import Path

    from fxplan.cluster_specs import Cluster
    from fxplan.cost_model.compute.profiler import local_device_model

    real_exists = Path.exists
    monkeypatch.setattr(Path, "exists",
                        lambda self: False if str(self) == "/proc/cpuinfo" else real_exists(self))
    monkeypatch.setattr(platform, "processor", lambda: "")
    spec_model = Cluster.load("local-cpu:devices=1").device_groups[0].model
    assert local_device_model("cpu") == spec_model
