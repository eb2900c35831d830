"""``fxplan profile --device cpu``: the database it writes, and whether its estimates of shapes
it did not measure match fresh measurements within 25 %.

The accuracy test profiles the quick grid (every other scale of the full grid, factor 4 apart
in size) and measures shapes in between. Both sides are medians of single-threaded
``blocked_autorange`` runs on the thread's CPU clock (immune to time slices taken by other
processes), and the fresh measurements are interleaved with the profile's own (through its
``progress`` hook) over two rounds, so that what load remains (memory bandwidth, caches shared
with a neighbour) hits both sides alike rather than one.
"""

from __future__ import annotations

import itertools
import json
import statistics
import time

from fxplan.cost_model.op_database import OPS, OpDatabase
from fxplan.cost_model.profiler import make_call, measure, profile
from fxplan.cli.main import main

#: Shapes not in the quick grid: between two of its scales, or of another aspect. Chosen in the
#: smooth parts of the CPU's time curves (see docs/cost_model.md on cache cliffs).
OFF_GRID: list[tuple[str, tuple[tuple[int, ...], ...]]] = [
    ("linear", ((128, 128), (128, 128))),
    ("linear", ((512, 512), (512, 512))),
    ("linear", ((1024, 128), (512, 128))),
    ("linear", ((384, 384), (384, 384))),
    ("bmm", ((8, 128, 128), (8, 128, 64))),
    ("softmax", ((1024, 256),)),
    ("layer_norm", ((1024, 256),)),
    ("gelu", ((128, 1024),)),
    ("add", ((512, 1024), (512, 1024))),
    ("mul", ((2048, 1024), (2048, 1024))),
    ("dropout", ((128, 1024),)),
    ("embedding", ((256,), (8192, 64))),
    ("conv2d", ((4, 64, 32, 32), (64, 64, 3, 3))),
    ("sdpa", ((4, 4, 256, 64),) * 3),
]


def test_cli_writes_a_versioned_database(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "cpu.json"
    started = time.perf_counter()
    assert main(["profile", "--device", "cpu", "--quick", "--ops", "add,linear", "--min-run-time",
                 "0.01", "-o", str(out)]) == 0
    assert time.perf_counter() - started < 20
    assert str(out) in capsys.readouterr().out
    raw = json.loads(out.read_text())
    assert raw["format"] == "fxplan-op-database" and raw["format_version"] == 1
    assert {"torch_version", "threads", "date", "processor"} <= set(raw["metadata"])
    assert raw["metadata"]["threads"] == 1
    db = OpDatabase.load(out)
    assert db.ops() == ["add", "linear"]
    assert all(r.time_s > 0 and r.dtype == "fp32" for r in db.records)
    assert main(["profile", "--ops", "nope"]) == 2


def test_off_grid_estimates_within_25_percent_of_fresh_measurements() -> None:
    calls = [make_call(op, shapes, "fp32", "cpu") for op, shapes in OFF_GRID]
    fresh: list[list[float]] = [[] for _ in OFF_GRID]
    turn = itertools.cycle(range(len(OFF_GRID)))

    def interleave(_record: object) -> None:
        i = next(turn)
        fresh[i].append(measure(*calls[i], "cpu", 0.02)[0])

    db = profile("cpu", quick=True, rounds=2, min_run_time=0.02, progress=interleave)
    assert set(db.ops()) == set(OPS)
    errors = {}
    for (op, shapes), times in zip(OFF_GRID, fresh):
        assert len(times) >= 3
        estimate = db.estimate(op, "fp32", shapes=shapes)
        assert estimate is not None
        errors[f"{op} {shapes}"] = estimate / statistics.median(times) - 1
    bad = {k: f"{v:+.0%}" for k, v in errors.items() if abs(v) > 0.25}
    assert not bad, f"estimates off by more than 25 %: {bad}"


def test_cpu_database_model_is_the_local_cpu_spec_model(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # one function names the CPU for both, whatever /proc/cpuinfo and platform say
    import platform
    from pathlib import Path

    from fxplan.cluster_specs import Cluster
    from fxplan.cost_model.profiler import local_device_model

    real_exists = Path.exists
    monkeypatch.setattr(Path, "exists",
                        lambda self: False if str(self) == "/proc/cpuinfo" else real_exists(self))
    monkeypatch.setattr(platform, "processor", lambda: "")
    spec_model = Cluster.load("local-cpu:devices=1").device_groups[0].model
    assert local_device_model("cpu") == spec_model
