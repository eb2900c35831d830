"""``fxplan estimate``: JSON, the tables, ``--plot``, and user errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

from fxplan.cli.main import main
from fxplan.cost_model.plotting import is_png


def test_json_and_plot(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    plot = tmp_path / "timeline.png"
    code = main(["estimate", "gpt-tiny", "--cluster", "dgx-a100-80g", "--batch", "16",
                 "--config", "dp=2,tp=2,pp=2,mb=1,schedule=1f1b,zero=1,recompute=full,sp=on",
                 "--json", "--plot", str(plot)])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["breakdown"]) == {"compute", "tp_comm", "zero_comm", "p2p", "bubble",
                                      "dp_comm", "optimizer"}
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
