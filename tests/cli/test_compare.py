"""``fxplan compare`` on small synthetic clusters, and ``--batch-tokens`` for plan and compare.

The comparison's arithmetic is checked by hand against ``fxplan plan`` at the sizes it chose:
same step time, ``steps = ⌈T/(B·s)⌉``, days, device-hours and cost from them, the deadline's
smallest size, the order and the Pareto front.
"""

from __future__ import annotations

import json
import math

import pytest
import yaml

from fxplan.cli.main import main

MODEL, SEQ, BATCH = "gpt-tiny", 64, 16
TOKENS = 10_000_000


def kind(tmp_path, name: str, per_node: int, tflops: float) -> str:
    """A GPU kind: ``per_node`` devices per node, ``tflops`` bf16 peak, a slow network."""
    spec = {
        "schema_version": 1, "name": name,
        "device_groups": [{
            "name": "g", "kind": "gpu", "model": "Synthetic", "nodes": 1,
            "devices_per_node": per_node, "memory_gib": 16, "memory_bandwidth_gb_per_s": 500,
            "peak_tflops": {"fp32": tflops / 8, "bf16": tflops}, "intra_node_level": "link",
            "kernel_launch_us": 0}],
        "levels": [
            {"name": "link", "kind": "nvswitch", "scope": "node", "bandwidth_gb_per_s": 100,
             "latency_us": 2.0, "efficiency": 0.8},
            {"name": "net", "kind": "ethernet", "scope": "cluster", "bandwidth_gb_per_s": 12.5,
             "nics_per_node": 1, "latency_us": 10.0, "efficiency": 0.9}]}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return str(path)


@pytest.fixture
def kinds(tmp_path):
    return kind(tmp_path, "slow", 2, 1.0), kind(tmp_path, "fast", 4, 3.0)


def run_json(capsys, *argv) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def plan_json(capsys, spec: str, batch: int = BATCH) -> dict:
    return run_json(capsys, "plan", MODEL, "--cluster", spec, "--batch", str(batch), "--json")


def test_sweep_arithmetic_against_plan(kinds, capsys, tmp_path):
    slow, fast = kinds
    png = tmp_path / "pareto.png"
    out = run_json(capsys, "compare", MODEL, "--tokens", "10M", "--clusters", f"{slow},{fast}",
                   "--devices", "2..8", "--batch", str(BATCH), "--price",
                   f"{slow}=1.0,{fast}=2.5", "--plot", str(png), "--json", "--jobs", "1")
    rows = out["rows"]
    assert out["ranked_by"] == "cost" and out["seq"] == SEQ and out["batch"] == BATCH
    # sizes: powers of two in 2..8 each kind takes (4 per node: 2 (part of a node), 4, 8)
    assert sorted((r["cluster"], r["devices"]) for r in rows) == sorted(
        [(slow, 2), (slow, 4), (slow, 8), (fast, 2), (fast, 4), (fast, 8)])
    steps = math.ceil(TOKENS / (BATCH * SEQ))
    for row in rows:
        plan = plan_json(capsys, row["spec"])
        assert row["summary"] == plan["summary"]
        assert row["step_time_s"] == pytest.approx(plan["step_time_s"], rel=1e-12)
        assert row["mfu"] == pytest.approx(plan["mfu"], rel=1e-12)
        assert row["peak_memory_gib"] == pytest.approx(plan["peak_memory_gib"], rel=1e-12)
        t = plan["step_time_s"]
        assert row["steps"] == steps
        assert row["days"] == pytest.approx(steps * t / 86400, rel=1e-12)
        assert row["device_hours"] == pytest.approx(row["devices"] * steps * t / 3600, rel=1e-12)
        price = 1.0 if row["cluster"] == slow else 2.5
        assert row["cost"] == pytest.approx(row["device_hours"] * price, rel=1e-12)
    # sorted by cost; the front: no other row at most as long and at most as dear
    assert [r["cost"] for r in rows] == sorted(r["cost"] for r in rows)
    for r in rows:
        beaten = any(o["days"] <= r["days"] and o["cost"] <= r["cost"]
                     and (o["days"] < r["days"] or o["cost"] < r["cost"]) for o in rows)
        assert r["pareto"] is (not beaten)
    assert any(r["pareto"] for r in rows)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_deadline_keeps_the_smallest_size_meeting_it(kinds, capsys):
    slow, _ = kinds
    sweep = run_json(capsys, "compare", MODEL, "--tokens", "10M", "--clusters", slow,
                     "--devices", "2..8", "--batch", str(BATCH), "--json")["rows"]
    days = {r["devices"]: r["days"] for r in sweep}
    assert days[4] < days[2]                               # 4 devices meet it, 2 do not
    deadline = days[4] * (1 + 1e-6)
    out = run_json(capsys, "compare", MODEL, "--tokens", "10M", "--clusters", slow,
                   "--devices", "2..8", "--batch", str(BATCH), "--deadline",
                   f"{24 * deadline:.9f}h", "--json")
    (row,) = out["rows"]
    assert (row["devices"], row["meets_deadline"]) == (4, True)
    assert row["days"] == pytest.approx(days[4], rel=1e-12)
    # none meets a deadline shorter than every size's days: the largest tried, marked late
    out = run_json(capsys, "compare", MODEL, "--tokens", "10M", "--clusters", slow,
                   "--devices", "2..8", "--batch", str(BATCH), "--deadline",
                   f"{24 * min(days.values()) / 2:.9f}h", "--json")
    (row,) = out["rows"]
    assert (row["devices"], row["meets_deadline"]) == (8, False)


def test_without_prices_it_ranks_by_device_hours(kinds, capsys):
    slow, fast = kinds
    assert main(["compare", MODEL, "--tokens", "10M", "--clusters", f"{slow},{fast}",
                 "--devices", "4", "--batch", str(BATCH), "--jobs", "1"]) == 0
    text = capsys.readouterr().out
    assert "no prices given: ranked by device-hours" in text
    out = run_json(capsys, "compare", MODEL, "--tokens", "10M", "--clusters", f"{slow},{fast}",
                   "--devices", "4", "--batch", str(BATCH), "--json", "--jobs", "1")
    assert out["ranked_by"] == "device-hours"
    assert all(r["cost"] is None for r in out["rows"])
    hours = [r["device_hours"] for r in out["rows"]]
    assert hours == sorted(hours)


def test_prices_file_and_html(kinds, capsys, tmp_path):
    slow, fast = kinds
    prices = tmp_path / "prices.yaml"
    prices.write_text(yaml.safe_dump({slow: 1.5, fast: 3.0}), encoding="utf-8")
    page = tmp_path / "compare.html"
    out = run_json(capsys, "compare", MODEL, "--tokens", "10M", "--clusters", f"{slow},{fast}",
                   "--devices", "4", "--batch", str(BATCH), "--prices", str(prices),
                   "--html", str(page), "--json", "--jobs", "1")
    assert {r["price_per_device_hour"] for r in out["rows"]} == {1.5, 3.0}
    text = page.read_text(encoding="utf-8")
    assert "data:image/png;base64," in text and "ranked by cost" in text


def test_batch_tokens_for_plan_and_compare(kinds, capsys):
    slow, _ = kinds
    # 1K tokens = 1024 / 64 = 16 sequences: the same plan as --batch 16
    by_tokens = run_json(capsys, "plan", MODEL, "--cluster", f"{slow}", "--batch-tokens", "1K",
                         "--json")
    by_samples = plan_json(capsys, slow)
    assert by_tokens["batch"] == BATCH and by_tokens["summary"] == by_samples["summary"]
    assert by_tokens["step_time_s"] == by_samples["step_time_s"]
    out = run_json(capsys, "compare", MODEL, "--tokens", "10M", "--clusters", slow,
                   "--devices", "2", "--batch-tokens", "1K", "--json")
    assert out["batch"] == BATCH


@pytest.mark.parametrize("argv,fragment", [
    (["--tokens", "2X"], "--tokens: found '2X', expected a positive number of tokens"),
    (["--tokens", "1M", "--deadline", "30"], "--deadline: found '30', expected a positive duration"),
    (["--tokens", "1M", "--devices", "8..4"], "--devices: found '8..4', expected LOW..HIGH"),
    (["--tokens", "1M", "--clusters", "dgx-h100,dgx-b200", "--price", "dgx-h100=2"],
     "no price for dgx-b200; expected a price for every compared cluster kind"),
    (["--tokens", "1M", "--clusters", "dgx-h100", "--price", "dgx-h100=-2"],
     "--price: dgx-h100: found '-2', expected a price > 0 per device-hour"),
    (["--tokens", "1M", "--clusters", "dgx-h100", "--price", "mi300x=2"],
     "prices given for mi300x, which are not among the clusters compared"),
])
def test_bad_inputs_one_paragraph(argv, fragment, capsys):
    assert main(["compare", MODEL, *argv]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


def test_plan_batch_arguments_refused(capsys):
    assert main(["plan", MODEL, "--cluster", "local-cpu:devices=2"]) == 2
    assert "neither --batch nor --batch-tokens" in capsys.readouterr().err
    assert main(["plan", MODEL, "--cluster", "local-cpu:devices=2", "--batch", "8",
                 "--batch-tokens", "1K"]) == 2
    assert "both --batch and --batch-tokens" in capsys.readouterr().err
    assert main(["plan", MODEL, "--cluster", "local-cpu:devices=2", "--batch-tokens", "4Q"]) == 2
    assert "--batch-tokens: found '4Q'" in capsys.readouterr().err


@pytest.mark.multirank
def test_worker_processes_give_the_rows_of_one_process(kinds, capsys):
    slow, fast = kinds
    argv = ["compare", MODEL, "--tokens", "10M", "--clusters", f"{slow},{fast}", "--devices",
            "2..8", "--batch", str(BATCH), "--json"]
    one = run_json(capsys, *argv, "--jobs", "1")
    two = run_json(capsys, *argv, "--jobs", "2")
    assert one["rows"] and one["rows"] == two["rows"]
    assert one["unplanned"] == two["unplanned"] and one["seq"] == two["seq"]
