"""``fxplan estimate``: JSON, the tables, ``--plot``, and user errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fxplan.cli.main import main
from fxplan.report.plotting import is_png


def test_json_and_plot(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    plot = tmp_path / "timeline.png"
    code = main(["estimate", "gpt-tiny", "--cluster", "dgx-a100-80g", "--batch", "16",
                 "--config", "dp=2,tp=2,pp=2,mb=1,schedule=1f1b,zero=1,recompute=full,sp=on",
                 "--json", "--plot", str(plot)])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["breakdown"]) == {"compute", "tp_comm", "zero_comm", "p2p", "bubble",
                                      "stage_imbalance", "dp_comm", "optimizer"}
    assert len(data["peak_memory_gib"]) == 2
    assert is_png(plot) and plot.stat().st_size > 2000  # a drawing, not a blank image


def test_tables_and_user_errors(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["estimate", "gpt-tiny", "--cluster", "dgx-a100-80g", "--batch", "16",
                 "--config", "dp=4,tp=2"]) == 0
    out = capsys.readouterr().out
    assert "step time" in out and "memory per rank" in out
    assert main(["estimate", "gpt-tiny", "--cluster", "dgx-a100-80g", "--batch", "16",
                 "--config", "dp=3,tp=2"]) == 2
    assert "dp·tp·pp = 3·2·1 = 6 ≠ 8 devices" in capsys.readouterr().err


def test_plot_writes_the_timeline(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "timeline.png"
    assert main(["estimate", "gpt-tiny", "--cluster", "dgx-a100-80g", "--batch", "16",
                 "--config", "dp=2,tp=2,pp=2,mb=2,schedule=1f1b,zero=0,recompute=none,sp=off",
                 "--plot", str(out)]) == 0
    assert is_png(out) and out.stat().st_size > 2000


def _estimate_json(capsys, cluster: str, *extra: str) -> dict:  # type: ignore[no-untyped-def]
    code = main(["estimate", "gpt-1.7b", "--cluster", cluster, "--batch", "8",
                 "--config", "dp=8,tp=1,pp=1,mb=1" if "devices=2" not in cluster
                 else "dp=2,tp=1,pp=1,mb=1", "--json", *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def test_default_dtype_follows_the_devices(capsys) -> None:  # type: ignore[no-untyped-def]
    """No bf16 on a V100 or a CPU: the default is fp16 there, fp32 here."""
    v100 = _estimate_json(capsys, "aws-p3-v100")
    cpu = _estimate_json(capsys, "local-cpu:devices=2")
    assert v100["step_time_s"] > 0 and cpu["step_time_s"] > 0
    # the MFU is against the default precision's peak: fp16 on a V100 (125 TFLOP/s) ...
    fp16 = _estimate_json(capsys, "aws-p3-v100", "--dtype", "fp16")
    assert v100["mfu"] == fp16["mfu"] and v100["step_time_s"] == fp16["step_time_s"]
    # ... and fp32 on CPU ranks (their only peak)
    fp32 = _estimate_json(capsys, "local-cpu:devices=2", "--dtype", "fp32")
    assert cpu["mfu"] == fp32["mfu"] and cpu["step_time_s"] == fp32["step_time_s"]


def test_a_dtype_the_devices_lack_is_a_user_error(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["estimate", "gpt-1.7b", "--cluster", "aws-p3-v100", "--batch", "8",
                 "--config", "dp=8,tp=1,pp=1,mb=1", "--dtype", "bf16"]) == 2
    err = capsys.readouterr().err
    assert "no bf16 peak" in err and "their dtypes are fp32, fp16" in err
    assert "Traceback" not in err


def test_memory_headroom_decides_fits(capsys) -> None:  # type: ignore[no-untyped-def]
    base = ["estimate", "gpt-tiny", "--cluster", "dgx-a100-80g", "--batch", "16",
            "--config", "dp=8", "--json"]
    assert main([*base, "--memory-headroom", "4GiB"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] and data["memory_headroom"] == "4GiB"
    assert data["memory_breakdown_gib"][0]["headroom"] == 4.0
    assert main([*base, "--memory-headroom", "79.9GiB"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"] is False
    assert main([*base, "--memory-headroom", "lots"]) == 2
    assert "memory headroom 'lots'" in capsys.readouterr().err


def test_state_layout_prices_the_model_states_as_named(capsys) -> None:  # type: ignore[no-untyped-def]
    """``--state-layout``: the runtime's (default) against Megatron-LM's — at ZeRO-1 with
    dp = 8, 8 + 8/8 against 4 + 12/8 bytes per parameter of model states; the table's legend
    says which; an unknown layout is a usage error (exit 2)."""
    args = ["estimate", "gpt-tiny", "--cluster", "dgx-a100-80g", "--batch", "16",
            "--config", "dp=8,zero=1"]
    states = {}
    for layout in ("runtime", "megatron"):
        assert main([*args, "--json", "--state-layout", layout]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["state_layout"] == layout
        row = data["memory_breakdown_gib"][0]
        states[layout] = row["params"] + row["grads"] + row["optimizer"]
    assert states["runtime"] / states["megatron"] == pytest.approx((8 + 1) / (4 + 1.5), rel=1e-9)
    assert main(args) == 0
    assert "fp32 parameters (the masters)" in capsys.readouterr().out
    import argparse

    from fxplan.cli.arguments import add_state_layout_argument
    from fxplan.cost_model.memory.breakdown import STATE_LAYOUTS

    parser = argparse.ArgumentParser()
    add_state_layout_argument(parser)
    flag = next(a for a in parser._actions if a.dest == "state_layout")
    assert tuple(flag.choices) == STATE_LAYOUTS and flag.default == STATE_LAYOUTS[0]
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--state-layout", "deepspeed"])
    assert exit_.value.code == 2
    assert "invalid choice: 'deepspeed'" in capsys.readouterr().err
