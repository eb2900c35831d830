"""``fxplan calibrate --quick`` on CPU ranks: a spec that loads and plans, with measured numbers
beside the spec's, and the values it wrote commented with how they were measured."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from fxplan.cli.main import main
from fxplan.cluster_specs import Cluster


@pytest.mark.multirank
def test_quick_calibration_writes_a_spec_that_plans(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "my-cluster.yaml"
    assert main(["calibrate", "--cluster", "local-cpu:devices=2", "--quick", "-o", str(out),
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["spec_file"] == str(out) and report["name"] == "local-cpu-devices-2-calibrated"
    rows = {r["quantity"]: r for r in report["rows"]}
    # every collective kind measured on the two ranks, a real number beside the model's
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"):
        row = next(r for q, r in rows.items() if q.startswith(kind))
        assert math.isfinite(row["measured"]) and row["measured"] > 0
        assert math.isfinite(row["spec"]) and row["spec"] > 0
        assert math.isfinite(row["difference"])
    baseline = rows["process baseline per rank"]
    assert baseline["written"] and 0.05 < baseline["measured"] < 4.0
    assert rows["op database records"]["measured"] > 10
    fitted = rows["loopback effective bandwidth"]
    assert fitted["measured"] > 0 and not fitted["written"]      # CPU: reported, not written

    text = out.read_text()
    spec = yaml.safe_load(text)
    cluster = Cluster.from_dict(spec)
    assert cluster.device_groups[0].reserved_memory_gib == round(baseline["measured"], 3)
    line = next(l for l in text.splitlines() if l.strip().startswith("reserved_memory_gib:"))
    assert "# fxplan calibrate 20" in line and "resident set" in line
    assert (tmp_path / "my-cluster.ops.json").exists()
    assert main(["plan", "gpt-tiny", "--cluster", str(out), "--batch", "8"]) == 0
    assert "local-cpu-devices-2-calibrated" in capsys.readouterr().out


def test_a_gpu_spec_on_a_cpu_machine_is_refused(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert main(["calibrate", "--cluster", "dgx-h100", "-o", str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err
    assert "describes gpu devices but this machine runs on its CPU" in err
    assert "Traceback" not in err and not (tmp_path / "x.yaml").exists()
