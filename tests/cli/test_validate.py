"""``fxplan validate`` on CPU ranks: a real launch, per-rank errors that are numbers, the exit
code set by the tolerance."""

from __future__ import annotations

import json
import math

import pytest

from fxplan.cli.main import main


@pytest.mark.multirank
def test_validate_reports_numbers_per_rank_and_fails_past_the_tolerance(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    plan = tmp_path / "plan.json"
    assert main(["plan", "gpt-tiny", "--cluster", "local-cpu:devices=2", "--batch", "8",
                 "--constrain", "dp=2", "-o", str(plan)]) == 0
    capsys.readouterr()
    run_dir = tmp_path / "run"
    # a tolerance of 0 cannot be met by a measurement: exit 1, with the errors as numbers
    assert main(["validate", str(plan), "--steps", "4", "--tolerance", "0", "--memory-tolerance",
                 "0%", "--run-dir", str(run_dir), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is False and report["warmup"] == 3 and report["steps"] == 4
    assert report["device"] == "cpu" and "resident set" in report["memory_measured_as"]
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    for r in report["ranks"]:
        for key in ("predicted_step_s", "measured_step_s", "step_error", "predicted_memory_gib",
                    "measured_memory_gib", "memory_error"):
            assert isinstance(r[key], float) and math.isfinite(r[key]), key
        assert r["measured_step_s"] > 0 and r["measured_memory_gib"] > 0
        assert r["reserved_error"] is None
    assert len(report["losses"]) == 4 and all(math.isfinite(x) for x in report["losses"])
    assert any("step time off by" in f for f in report["failures"])
    assert (run_dir / "summary.json").exists()


def test_a_warmup_that_leaves_no_step_is_refused(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    plan = tmp_path / "plan.json"
    assert main(["plan", "gpt-tiny", "--cluster", "local-cpu:devices=2", "--batch", "8",
                 "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["validate", str(plan), "--steps", "3", "--warmup", "3"]) == 2
    assert "no step would be timed" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["validate", str(plan), "--tolerance", "ten"])
    assert exit_.value.code == 2 and "expected a fraction (0.1) or a percentage" in capsys.readouterr().err
