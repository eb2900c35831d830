"""``fxplan launch`` of an expert-parallel plan: refused before any process starts (the runtime
has no expert parallelism yet), with what to do instead."""

from __future__ import annotations

import json

from fxplan.cli.main import main

MODEL = "moe-tiny:dropout=0,seq=16"
CLUSTER = "local-cpu:devices=2"


def _plan(tmp_path, name: str, constrain: str) -> str:  # type: ignore[no-untyped-def]
    out = tmp_path / f"{name}.json"
    assert main(["plan", MODEL, "--cluster", CLUSTER, "--batch", "4", "--seq", "16",
                 "--constrain", constrain, "--json", "-o", str(out)]) == 0
    return str(out)


def test_ep_plan_is_refused_before_launch(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    plan = _plan(tmp_path, "ep2", "dp=2,ep=2")
    with open(plan) as handle:
        data = json.load(handle)
    assert data["degrees"]["ep"] == 2 and "ep=2" in data["summary"]
    capsys.readouterr()
    assert main(["launch", plan, "--data", "synthetic", "--print-command"]) == 2
    err = capsys.readouterr().err
    assert "expert parallelism is not implemented in fxplan's runtime yet" in err
    assert "--constrain ep=1" in err and "Traceback" not in err
