"""``fxplan replan plan.json --cluster NEW``: in-process, no torchrun."""

from __future__ import annotations

import json

import pytest

from fxplan.cli.main import main

MODEL = "gpt-tiny:dropout=0,seq=16"


@pytest.fixture(scope="module")
def plan4(tmp_path_factory):
    from fxplan import search

    plan = search(MODEL, "local-cpu:devices=4", batch=8, seq=16, progress=False)
    return plan.save(tmp_path_factory.mktemp("replan") / "plan4.json")


def test_replan_for_fewer_devices_keeps_the_global_batch(plan4, tmp_path, capsys):
    from fxplan import search
    from fxplan.core.plan import load_plan

    out_file = tmp_path / "plan2.json"
    assert main(["replan", str(plan4), "--cluster", "local-cpu:devices=2", "-o", str(out_file),
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    old, new = result["old"], result["new"]
    assert (old["world_size"], new["world_size"]) == (4, 2)
    assert old["batch"] == new["batch"] == 8
    assert new["dp"] * new["microbatch"] * new["num_microbatches"] == 8
    assert new["pp"] * new["dp"] * new["tp"] == 2
    assert result["replan_time_s"] > 0 and new["predicted_step_time_s"] > 0
    print(f"replan 4→2: {result['replan_time_s'] * 1e3:.0f} ms {result['timings_s']}")
    assert any(line.startswith("global batch 8 kept") for line in result["changes"])
    written = load_plan(out_file)
    assert written.world_size == 2 and written.cluster == "local-cpu:devices=2"
    # the one search path: what `fxplan plan` finds for the new cluster
    assert written.summary == search(MODEL, "local-cpu:devices=2", batch=8, seq=16,
                                     progress=False).summary


def test_devices_resize_the_plans_cluster(plan4, capsys):
    assert main(["replan", str(plan4), "--devices", "8"]) == 0
    out = capsys.readouterr().out
    assert "cluster: local-cpu:devices=4 (4 devices) → local-cpu:devices=8 (8 devices)" in out
    assert "global batch 8 kept" in out and "predicted step time:" in out
    assert "replanned in" in out


@pytest.mark.parametrize("args, expected", [
    (["--devices", "3"], "no valid mesh factorisation pp·dp·tp = 3"),
    (["--cluster", "nope:devices=2"], "not a built-in spec name"),
])
def test_impossible_replans_are_refused(plan4, capsys, args, expected):
    assert main(["replan", str(plan4), *args]) == 2
    assert expected in capsys.readouterr().err


def test_with_devices_replaces_the_size_overrides():
    from fxplan.cluster_specs.overrides import with_devices

    assert with_devices("local-cpu:devices=4", 2) == "local-cpu:devices=2"
    assert with_devices("dgx-a100-80g:nodes=4,a100.memory_gib=40", 24) == \
        "dgx-a100-80g:a100.memory_gib=40,devices=24"
    assert with_devices("dgx-h100", 8) == "dgx-h100:devices=8"
