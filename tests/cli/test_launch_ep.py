"""``fxplan launch`` of an expert-parallel plan: accepted and started like any plan (the
runtime's numerics against one process are in tests/runtime/test_expert_parallel.py, on the
rank pool, so no extra torchrun here); ep with tp > 1 and sequence parallelism, and a model
whose expert weights are in no layer the runtime can split, are refused before any process
starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fxplan.cli.main import main

MODEL = "moe-tiny:dropout=0,seq=16"


#: Batched expert weights [4, ·, ·] in layers without the router steps (tests/cli/models).
DENSE_EXPERTS = str(Path(__file__).parent / "models" / "dense_experts.py") + ":build"


def _plan(tmp_path, name: str, constrain: str, devices: int,  # type: ignore[no-untyped-def]
          model: str = MODEL) -> str:
    out = tmp_path / f"{name}.json"
    assert main(["plan", model, "--cluster", f"local-cpu:devices={devices}", "--batch", "4",
                 "--seq", "16", "--constrain", constrain, "--json", "-o", str(out)]) == 0
    return str(out)


def test_ep_plan_launches(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    plan = _plan(tmp_path, "ep2", "dp=2,ep=2", 2)
    with open(plan) as handle:
        data = json.load(handle)
    assert data["degrees"]["ep"] == 2 and "ep=2" in data["summary"]
    capsys.readouterr()
    assert main(["launch", plan, "--data", "synthetic", "--print-command"]) == 0
    out = capsys.readouterr().out
    assert "torchrun" in out and "--nproc-per-node" in out and plan in out, out


def test_ep_with_tensor_parallelism_launches_and_sp_is_refused(  # type: ignore[no-untyped-def]
        tmp_path, capsys) -> None:
    """tp > 1 beside ep > 1 runs (runtime.expert_tp) with sequence parallelism off: the search
    offers no other, and a plan edited to sp=on is refused before any process starts."""
    plan = _plan(tmp_path, "ep2tp2", "dp=2,ep=2,tp=2", 4)
    with open(plan) as handle:
        data = json.load(handle)
    assert data["degrees"]["ep"] == 2 and data["degrees"]["tp"] == 2 and "sp=off" in data["config"]
    capsys.readouterr()
    assert main(["launch", plan, "--data", "synthetic", "--print-command"]) == 0
    assert "torchrun" in capsys.readouterr().out
    for holder in (data, data["estimate"]):   # the plan and its estimate, edited alike
        holder["config"] = holder["config"].replace("sp=off", "sp=on")
    edited = tmp_path / "ep2tp2-sp.json"
    edited.write_text(json.dumps(data))
    assert main(["launch", str(edited), "--data", "synthetic", "--print-command"]) == 2
    err = capsys.readouterr().err
    assert "ep=2 with tp=2 and sequence parallelism" in err and "--constrain sp=off" in err
    assert "Traceback" not in err


def test_unsplittable_experts_are_refused_before_launch(  # type: ignore[no-untyped-def]
        tmp_path, capsys, monkeypatch) -> None:
    # the search asks the runtime first: no ep=2 plan is offered for this model
    assert main(["plan", DENSE_EXPERTS, "--cluster", "local-cpu:devices=2", "--batch", "4",
                 "--seq", "16", "--constrain", "dp=2,ep=2"]) == 2
    assert "ep=2: the model's expert weights are not in a layer" in capsys.readouterr().err
    # a plan file written without that check (an older fxplan, a hand edit) is refused by the
    # launch before any process starts
    import fxplan

    searched = fxplan.search(DENSE_EXPERTS, "local-cpu:devices=2", batch=4, seq=16,
                             constraints={"dp": 2, "ep": 2}, runnable=None, progress=False)
    plan = str(searched.save(tmp_path / "dense-ep2.json"))
    with open(plan) as handle:
        assert json.load(handle)["degrees"]["ep"] == 2   # priced as a mixture of experts

    def no_torchrun(*args, **kwargs):  # type: ignore[no-untyped-def]
        pytest.fail("a process was started for a plan the runtime refuses")

    monkeypatch.setattr("subprocess.Popen", no_torchrun)
    monkeypatch.setattr("subprocess.run", no_torchrun)
    capsys.readouterr()
    assert main(["launch", plan, "--data", "synthetic", "--run-dir",
                 str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "ep=2: the model's expert weights are not in a layer" in err, err
    assert "--constrain ep=1" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()
