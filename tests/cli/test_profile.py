"""``fxplan profile --device cpu``: the versioned database it writes, with the flags honoured."""

from __future__ import annotations

import json

from fxplan.cli.main import main
from fxplan.cost_model.compute.op_database import OpDatabase
from fxplan.cost_model.compute.profiler import GRID


def test_writes_a_versioned_database(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "cpu.json"
    assert main(["profile", "--device", "cpu", "--quick", "--ops", "add,linear", "--min-run-time",
                 "0.01", "-o", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    raw = json.loads(out.read_text())
    assert raw["format"] == "fxplan-op-database" and raw["format_version"] == 1
    assert {"torch_version", "threads", "date", "processor"} <= set(raw["metadata"])
    assert raw["metadata"]["threads"] == 1
    assert raw["metadata"]["quick"] is True and raw["metadata"]["min_run_time_s"] == 0.01
    db = OpDatabase.load(out)
    assert db.ops() == ["add", "linear"]
    quick_grid = {(f.op, f.shape(s)) for f in GRID if f.op in ("add", "linear")
                  for s in f.scales("cpu", quick=True)}
    assert sorted((r.op, r.shapes) for r in db.records) == sorted(quick_grid)
    assert all(r.time_s > 0 and r.dtype == "fp32" for r in db.records)
    assert main(["profile", "--ops", "nope"]) == 2
