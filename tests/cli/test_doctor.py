"""``fxplan doctor``: the checks, the spec matching, failures reported and never raised."""

from __future__ import annotations

import json

import pytest

from fxplan.cli import doctor
from fxplan.cli.main import main
from fxplan.cluster_specs.local_cpu import cpu_cores, cpu_model


def test_table_on_this_cpu_machine(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for name in ("fxplan", "Python", "torch", "torch.distributed", "gloo", "NCCL", "CUDA devices",
                 "CPU", "cluster spec", "op database", "transformers", "OR-Tools", "HiGHS"):
        assert name in out
    assert f"local-cpu:devices={cpu_cores()}" in out and "none (CPU)" in out
    assert "no check failed" in out


def test_json_parses_and_agrees(capsys):
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["ok"] is True
    assert checks["cluster spec"]["data"]["spec"] == f"local-cpu:devices={cpu_cores()}"
    assert checks["gloo"]["status"] == "ok" and checks["HiGHS"]["status"] == "ok"
    assert all(c["status"] in ("ok", "warn", "fail") for c in report["checks"])


def test_a_torch_feature_this_torch_lacks_is_a_warning_naming_it(monkeypatch):
    from fxplan.core import torch_support

    assert doctor._check_torch_features().status == (
        "ok" if all(torch_support.torch_has(f) for f in torch_support.FEATURES) else "warn")
    monkeypatch.setitem(torch_support.FEATURES, "imaginary",
                        ("torch", "no_such_attribute", "an imaginary API (schedule x)"))
    torch_support.torch_has.cache_clear()
    try:
        check = doctor._check_torch_features()
    finally:
        torch_support.torch_has.cache_clear()
    assert check.status == "warn" and check.data["imaginary"] is False
    assert "imaginary, an imaginary API (schedule x)" in check.detail
    assert "refused before training" in check.detail


def test_a_failing_check_is_reported_not_raised(monkeypatch, capsys):
    def broken() -> doctor.Check:
        raise ImportError("no module named torch\nsecond line")

    monkeypatch.setattr(doctor, "_check_torch", broken)
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "ImportError: no module named torch" in out and "second line" not in out
    assert "1 check failed: torch" in out


def test_op_database_found_and_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("FXPLAN_OP_DB_PATH", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))
    missing = doctor._check_op_database([doctor.Devices()])
    assert missing.status == "warn" and "roofline only" in missing.detail
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"format": "fxplan-op-database", "format_version": 1,
                                "device_model": cpu_model(), "device_kind": "cpu",
                                "metadata": {}, "records": []}))
    found = doctor._check_op_database([doctor.Devices()])
    assert found.status == "ok" and found.data["path"] == str(path)


def _gpus(name: str, gib: float, n: int) -> list[doctor.Devices]:
    return [doctor.Devices((name,) * n, (gib,) * n)]


@pytest.mark.parametrize("name, gib, n, spec", [
    ("NVIDIA H100 80GB HBM3", 79.1, 8, "dgx-h100"),
    ("NVIDIA H200", 139.8, 1, "h200-single"),
    ("NVIDIA H200", 139.8, 8, "hgx-h200"),
    ("NVIDIA A100-SXM4-80GB", 79.2, 8, "dgx-a100-80g"),
    ("NVIDIA A100-SXM4-40GB", 39.4, 8, "dgx-a100-40g"),
    ("NVIDIA A100-PCIE-40GB", 39.4, 8, "a100-pcie-8"),
    ("NVIDIA B200", 178.4, 8, "dgx-b200"),
    ("AMD Instinct MI300X", 191.5, 8, "mi300x"),
    ("AMD Instinct MI325X", 255.5, 8, "mi325x"),
])
def test_gpu_spec_matches_model_memory_and_count(name, gib, n, spec):
    check = doctor._check_cluster_spec(_gpus(name, gib, n))
    assert check.status == "ok" and check.data["spec"] == spec


def test_gpu_count_without_a_spec_suggests_an_override():
    check = doctor._check_cluster_spec(_gpus("NVIDIA H100 80GB HBM3", 79.1, 4))
    assert check.status == "warn" and check.data["spec"] == "dgx-h100:nodes=1,devices_per_node=4"
    from fxplan.cluster_specs import Cluster
    assert Cluster.load(check.data["spec"]).num_devices == 4


def test_unknown_gpu_matches_nothing():
    check = doctor._check_cluster_spec(_gpus("Tesla T4", 14.6, 1))
    assert check.status == "warn" and "none matches" in check.detail
    assert "fxplan clusters --show" in check.detail


def test_summary_counts():
    ok, warn, fail = (doctor.Check(n, s, "") for n, s in (("a", "ok"), ("b", "warn"), ("c", "fail")))
    assert doctor.summary([ok, warn]) == "no check failed (1 warning)"
    assert doctor.summary([ok, fail, fail]) == "2 checks failed: c, c (0 warnings)"


def test_nccl_on_a_rocm_build_is_rccl(monkeypatch):
    import torch
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "hip", "6.3.42131", raising=False)
    check = doctor._check_nccl()
    assert check.status == "ok" and check.data["library"] == "rccl"
    assert "RCCL: the nccl backend of this ROCm build of torch" in check.detail
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert doctor._check_nccl().data["library"] == "nccl"


def test_a_gb200_tray_is_suggested_from_the_rack_spec():
    check = doctor._check_cluster_spec(_gpus("NVIDIA GB200", 184.0, 4))
    assert check.status == "warn" and check.data["spec"] == "gb200-nvl72:nodes=1,devices_per_node=4"
