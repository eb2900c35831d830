"""What the search chooses, the runtime runs: small models with dropout, a tied LM head, one
block and odd shapes are searched under constraints and each chosen plan is launched for a
step on 2 CPU ranks; and a placement the search chose for a larger GPT under ``tp=2, sp=on`` —
a row-parallel ``fc2`` left partial (``P``) on tp, its dropout planned ``S(1)`` — runs on the
graph rewrite (before: every rank failed in dropout's in-place ``bernoulli_`` on a
``Partial(sum)`` input, and the restarts were spent on it)."""

from __future__ import annotations

import json

import pytest

from launch_here import launch_here

#: (model, constraints, --path): every GPT here ties its LM head to the token embedding.
CASES = [
    ("gpt-tiny:layers=1,seq=16,dropout=0.1", {}, "auto"),            # one block
    ("gpt-tiny:seq=16,dropout=0.1", {"tp": 2, "sequence_parallel": True}, "graph"),
    ("gpt:layers=2,hidden=48,heads=3,vocab=509,seq=15,dropout=0.1",
     {"dp": 2, "zero_stage": 3}, "auto"),
    ("gpt-tiny:seq=16,dropout=0.1", {"pp": 2}, "auto"),
]


@pytest.mark.parametrize("model,constraints,path", CASES, ids=["one-block", "tp-sp-dropout",
                                                               "odd-shapes-zero3", "pipeline"])
@pytest.mark.multirank
def test_the_chosen_plan_trains_a_step(model, constraints, path, tmp_path, capfd):
    from fxplan import search

    plan = search(model, "local-cpu:devices=2", batch=4, progress=False,
                  constraints=constraints)
    assert sum(stage.num_layers for stage in plan.stages) >= 1, plan.summary
    saved = plan.save(tmp_path / "plan.json")
    done = launch_here(capfd, str(saved), "--data", "synthetic", "--steps", "1", "--path", path,
                       "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
            .splitlines()]
    assert [row["step"] for row in rows] == [1] and rows[0]["loss"] > 0


@pytest.mark.multirank
def test_a_partial_activation_before_dropout_runs_on_the_graph_rewrite(tmp_path, capfd):
    """The placement of ``h_N_mlp_fc2`` the search chose for ``gpt:layers=4,hidden=512,…`` on
    4 ranks (``P`` on tp; its consumer, dropout, ``S(1)``) given to gpt-tiny's ``tp=2, sp=on``
    plan: the rewrite reduce-scatters into the dropout instead of handing it a partial sum."""
    from fxplan import search

    plan = search("gpt-tiny:seq=16,dropout=0.1", "local-cpu:devices=2", batch=4,
                  progress=False, constraints={"tp": 2, "sequence_parallel": True})
    data = plan.to_dict()
    nodes = data["placements"]["nodes"]
    assert nodes["h_0_mlp_drop"] == "RS(1)", nodes  # the dropout's own placement: S(1) on tp
    for name in ("h_0_mlp_fc2", "h_1_mlp_fc2"):
        nodes[name] = "RP"
    edited = tmp_path / "plan.json"
    edited.write_text(json.dumps(data))
    done = launch_here(capfd, str(edited), "--data", "synthetic", "--steps", "2", "--path",
                       "graph", "--run-dir", str(tmp_path / "run"))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "bernoulli_" not in out and "Partial(sum)" not in out
