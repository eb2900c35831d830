"""``fxplan explain PLAN --vs …``: the alternative priced by ``estimate`` on the re-captured
model, term by term, and the sentence saying what decided."""

from __future__ import annotations

import json
import re

import pytest

import fxplan
from fxplan.api import capture_for_search
from fxplan.cli.main import main
from fxplan.cluster_specs import Cluster, training_dtype
from fxplan.core.config import ParallelConfig
from fxplan.cost_model import estimate
from fxplan.cost_model.memory.breakdown import GIB

MODEL, CLUSTER, BATCH = "gpt-1.7b", "dgx-a100-40g", 64


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("explain") / "plan.json"
    fxplan.search(MODEL, CLUSTER, batch=BATCH, progress=False).save(path)
    return path


def _explain(capsys, *argv: str) -> dict:  # type: ignore[no-untyped-def]
    assert main(["explain", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _estimate(config: str):  # type: ignore[no-untyped-def]
    cluster = Cluster.load(CLUSTER)
    graph = capture_for_search(MODEL, dtype=training_dtype(cluster))
    return estimate(graph, cluster, ParallelConfig.parse(config), batch=BATCH)


def test_alternative_is_priced_by_estimate_and_terms_add_up(capsys, plan_file) -> None:  # type: ignore[no-untyped-def]
    data = _explain(capsys, str(plan_file), "--vs", "tp=2")
    alt = data["alternative"]
    assert alt["valid"] and alt["config"].startswith("dp=4,tp=2,")
    # tp changes, so the plan's placements do not carry over: the default layout is priced
    assert alt["layout"] == "default Megatron layout"
    assert alt["step_time_s"] == pytest.approx(_estimate(alt["config"]).step_time_s, rel=1e-9)
    delta = data["delta"]
    # the breakdown sums to the step time on each side, so the term deltas sum to ΔT
    assert sum(delta["breakdown"].values()) == pytest.approx(delta["step_time_s"], rel=1e-6)
    assert delta["step_time_s"] == pytest.approx(alt["step_time_s"]
                                                 - data["plan"]["step_time_s"], rel=1e-9)
    if delta["step_time_s"] > 0:
        worst = max(delta["breakdown"], key=delta["breakdown"].get)
        assert data["verdict"].startswith("the alternative is ") and "slower" in data["verdict"]
        from fxplan.report.explain import TERMS

        assert f"mostly {TERMS[worst]}" in data["verdict"]


def test_an_alternative_that_does_not_fit_names_the_rank_and_its_need(capsys, plan_file) -> None:  # type: ignore[no-untyped-def]
    data = _explain(capsys, str(plan_file), "--vs", "tp=1,pp=1,zero=0,recompute=none,mb=8")
    est = _estimate(data["alternative"]["config"])
    assert not est.fits and not data["alternative"]["fits"]
    worst = max(est.memory, key=lambda m: m.total + m.headroom - m.capacity)
    assert data["verdict"].startswith("the alternative does not fit: pipeline rank 0 needs "
                                      f"{worst.total / GIB:.3g} GiB + "
                                      f"{worst.headroom / GIB:.3g} GiB headroom of 40 GiB")


def test_an_invalid_alternative_quotes_the_cost_model(capsys, plan_file) -> None:  # type: ignore[no-untyped-def]
    data = _explain(capsys, str(plan_file), "--vs", "pp=8,schedule=interleaved:4")
    assert not data["alternative"]["valid"]
    assert data["verdict"].startswith("the alternative is not a valid configuration: ")
    assert "24" in data["verdict"]          # 24 layers do not split into pp·v = 32 stages


def test_the_plan_against_itself_prices_the_same(capsys, plan_file) -> None:  # type: ignore[no-untyped-def]
    data = _explain(capsys, str(plan_file), "--vs", str(plan_file))
    assert data["delta"]["step_time_s"] == 0
    assert data["verdict"] == "the alternative prices the same step time under the cost model"
    assert data["plan"]["step_time_s"] == pytest.approx(data["plan"]["recorded_step_time_s"],
                                                        rel=1e-9)


def test_text_output_has_formatted_numbers(capsys, plan_file) -> None:  # type: ignore[no-untyped-def]
    assert main(["explain", str(plan_file), "--vs", "tp=2"]) == 0
    out = capsys.readouterr().out
    assert "decided by" in out and "compute" in out
    assert not re.search(r"\d\.\d+e[-+]\d", out), out      # no raw floats such as 1.421e-14
    assert re.search(r"\d (ms|s) ", out)


def test_bad_alternatives_are_user_errors(capsys, plan_file, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert main(["explain", str(plan_file), "--vs", "tp=3"]) == 2
    assert "does not divide the plan's 8 devices" in capsys.readouterr().err
    assert main(["explain", str(plan_file), "--vs", "tp=2|4"]) == 2
    assert "one value per key" in capsys.readouterr().err
    other = tmp_path / "other.json"
    fxplan.search("gpt-tiny", CLUSTER, batch=BATCH, progress=False).save(other)
    assert main(["explain", str(plan_file), "--vs", str(other)]) == 2
    assert "fxplan diff" in capsys.readouterr().err


def test_a_context_parallel_alternative_splits_the_batch_over_dp_over_cp(capsys, plan_file) -> None:  # type: ignore[no-untyped-def]
    """``--vs cp=2``: the same dp with each sequence over 2 of its ranks, so twice the
    microbatches of the plan's size; priced by ``estimate`` like any alternative."""
    base = json.loads(plan_file.read_text())
    data = _explain(capsys, str(plan_file), "--vs", "cp=2")
    alt = ParallelConfig.parse(data["alternative"]["config"])
    plan = ParallelConfig.parse(base["config"])
    assert alt.cp == 2 and alt.dp == plan.dp
    assert alt.resolve(BATCH).num_microbatches * alt.microbatch_size == BATCH // (alt.dp // 2)
    assert data["alternative"]["step_time_s"] == pytest.approx(
        _estimate(data["alternative"]["config"]).step_time_s, rel=1e-9)
