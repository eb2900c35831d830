"""``fxplan plan``: JSON keys, the plan file, the report, the infeasible exit code, ``--emit``
(run under torchrun in tests/cli/test_emit_program.py)."""

from __future__ import annotations

import json

from fxplan import load_plan
from fxplan.cli.main import main

TINY = ["plan", "gpt-tiny", "--cluster", "dgx-a100-80g", "--batch", "16"]
JSON_KEYS = {"summary", "degrees", "zero_stage", "schedule", "microbatch_size",
             "num_microbatches", "recompute", "sequence_parallel", "step_time_s", "mfu",
             "peak_memory_gib", "fits", "search_time_s", "solver_status", "runners_up",
             "timings", "pruned", "fallbacks"}


def test_json_has_the_promised_keys(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "plan.json"
    assert main([*TINY, "--json", "-o", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert JSON_KEYS <= set(data)
    assert set(data["degrees"]) == {"dp", "tp", "pp", "cp", "ep"} and data["offload"] == "none"
    assert data["degrees"]["dp"] * data["microbatch_size"] * data["num_microbatches"] == 16
    assert data["fits"] and data["step_time_s"] > 0
    plan = load_plan(out)
    assert plan.summary == data["summary"]


def test_report_prints_summary_memory_and_runners_up(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main([*TINY, "--time-budget", "30"]) == 0
    text = capsys.readouterr().out
    for needle in ("plan ", "step time", "tokens/s", "MFU", "memory per rank", "runners-up",
                   "pruned", "solver"):
        assert needle in text, needle


def test_infeasible_exits_2_with_the_memory_it_needs(capsys) -> None:  # type: ignore[no-untyped-def]
    # with offload gpt-18.4b trains on these 8 V100s (16 B/param of host memory, 488 GiB)
    code = main(["plan", "gpt-18.4b", "--cluster", "aws-p3-v100", "--batch", "8",
                 "--constrain", "offload=none"])
    err = capsys.readouterr().err
    assert code == 2
    assert "smallest memory any configuration allowed by the constraints offload=none needs" \
        in err and "16.0 GiB" in err


def test_emit_writes_a_program_with_the_listing(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    target = tmp_path / "program.py"
    assert main([*TINY, "--json", "--emit", str(target)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["emit"].startswith(f"program written to {target}: torchrun --nnodes=1 "
                                   "--nproc-per-node=8")
    text = target.read_text(encoding="utf-8")
    assert data["summary"] in text and "# planned " in text
    compile(text, str(target), "exec")   # valid Python (it runs: tests/cli/test_emit_program.py)


def test_demo_prints_graph_cluster_and_plan(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["demo", "--model", "gpt-tiny", "--cluster", "dgx-a100-80g", "--batch", "16",
                 "--seq", "64"]) == 0
    text = capsys.readouterr().out
    for needle in ("repeated blocks", "link levels", "plan ", "runners-up"):
        assert needle in text, needle


def test_plot_writes_timeline_and_memory_pngs(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fxplan.report.plotting import is_png

    prefix = tmp_path / "tiny"
    assert main([*TINY, "--plot", str(prefix)]) == 0
    for suffix in ("timeline", "memory"):
        assert is_png(tmp_path / f"tiny-{suffix}.png")
    assert "plots written to" in capsys.readouterr().out


def test_plans_for_part_of_a_node(capsys) -> None:  # type: ignore[no-untyped-def]
    """A 4-GPU job on an 8-GPU V100 box (``devices=4``)."""
    assert main(["plan", "gpt-tiny", "--cluster", "aws-p3-v100:devices=4", "--batch", "8",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    degrees = data["degrees"]
    assert degrees["dp"] * degrees["tp"] * degrees["pp"] == 4
    assert data["fits"]


def test_memory_headroom_is_kept_shown_and_checked(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "plan.json"
    assert main([*TINY, "--memory-headroom", "10%", "--json", "-o", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["memory_headroom"] == "10%" and data["fits"]
    assert data["min_free_gib"] >= 0.1 * data["capacity_gib"]
    assert load_plan(out).estimate["memory_headroom"] == "10%"
    assert main(["report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "headroom, 10 % required" in text and "fits with" in text
    for row in ("CUDA context", "NCCL communicator buffers", "fragmentation", "frag."):
        assert row in text, row


def test_bad_memory_headroom_is_one_paragraph_exit_2(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main([*TINY, "--memory-headroom", "120%"]) == 2
    err = capsys.readouterr().err
    assert "memory headroom '120%'" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_headroom_nothing_leaves_is_refused_with_the_headroom_named(capsys) -> None:  # type: ignore[no-untyped-def]
    code = main([*TINY, "--memory-headroom", "79.9GiB"])
    err = capsys.readouterr().err
    assert code == 2 and "headroom" in err


def test_constrain_sp_off_is_honoured_for_dp_by_tp(capsys) -> None:  # type: ignore[no-untyped-def]
    # dp=2 pinned: with tp=2 alone the search returns pp=2 × tp=2 on local-cpu (63.9 ms with
    # the FSDP2/gloo pricing of 2026-11-24 (`6803fb5`), where dp=2 × tp=2 prices 62.9 ms when asked for)
    assert main(["plan", "gpt-tiny", "--cluster", "local-cpu:devices=4", "--batch", "16",
                 "--constrain", "tp=2,dp=2,sp=off", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["degrees"]["tp"] == 2 and data["degrees"]["dp"] == 2
    assert data["sequence_parallel"] is False and "sp=off" in data["summary"]


def test_state_layout_is_searched_recorded_and_reported(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``--state-layout megatron``: the plan is priced in Megatron-LM's layout, says so under its
    memory table and records it in the plan file (which re-prices it in that layout)."""
    out = tmp_path / "plan.json"
    assert main([*TINY, "--state-layout", "megatron", "-o", str(out)]) == 0
    assert "Megatron-LM's layout" in capsys.readouterr().out
    plan = load_plan(out)
    assert plan.estimate["state_layout"] == "megatron"
    assert plan.estimate["optimizer"] == "adam-mixed"
