"""``benchmarks/gpu_check.py``'s record is committed beside the project: it names the machine's
places (the checkout, the Python installation, the work folder) by role, never by path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _gpu_check():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_machine_paths_are_named_by_role_inside_nested_records() -> None:
    check = _gpu_check()
    record = {"doctor": {"checks": [
        {"detail": f"0.1.0 at {ROOT}/planner", "data": {"location": f"{ROOT}/planner"}},
        {"detail": f"3.12 at {sys.prefix}/bin/python", "data": {"executable": sys.executable}}]},
        "errors": ["/scratch/run/out/plan.json missing", 3, None]}
    places = {str(ROOT): "<checkout>", sys.prefix: "<python>", "/scratch/run": "<work>"}
    public = check.without_machine_paths(record, places)
    checks = public["doctor"]["checks"]
    assert checks[0]["data"]["location"] == "<checkout>/planner"
    assert checks[0]["detail"] == "0.1.0 at <checkout>/planner"
    assert checks[1]["detail"] == "3.12 at <python>/bin/python"
    assert public["errors"] == ["<work>/out/plan.json missing", 3, None]
    assert str(ROOT) not in repr(public) and sys.prefix not in repr(public)
    assert record["doctor"]["checks"][0]["data"]["location"] == f"{ROOT}/planner"  # untouched


def test_a_path_inside_another_keeps_its_own_name() -> None:
    check = _gpu_check()
    places = {"/opt": "<python>", "/opt/src/fxplan": "<checkout>"}
    assert check.without_machine_paths("/opt/src/fxplan/x and /opt/bin", places) == \
        "<checkout>/x and <python>/bin"
