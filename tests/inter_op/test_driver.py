"""The search driver (``inter_op.driver``): truthful unfit reasons, failed finalists quoted,
graphs with 1-D inputs or without layers, and docs that name the errors it raises."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

from fxplan import search
from fxplan.cluster_specs import Cluster
from fxplan.core.config_error import CostModelError
from fxplan.api import capture_for_search
from fxplan.inter_op import InfeasibleError
from fxplan.inter_op import pricing, search_state
from fxplan.inter_op.progress import PhaseTimer
from fxplan.inter_op.stage_memory import DeviceMemory
from fxplan.inter_op.progress import Budget
from fxplan.api import capture

SMALL = "gpt:layers=4,hidden=256,heads=8,vocab=4096,seq=256"


def test_unfit_reasons_do_not_say_none_fits_for_a_family_that_fits(gpt17) -> None:  # type: ignore[no-untyped-def]
    graph, cluster = gpt17
    plan = search(graph, cluster, batch=512, progress=False, constraints={"pp": 4})
    chosen = f"tp={plan.tp}, pp={plan.pp}, dp={plan.dp}:"
    mine = [r for r in plan.pruned if r.startswith(chosen) and "variants" in r]
    assert mine and all("none of" not in r and "did not fit" in r for r in mine)


def _unfit_state(capacity_scale: float):  # type: ignore[no-untyped-def]
    """A search whose first family had a fitting variant and whose second had none ranked;
    the device capacity scaled by ``capacity_scale`` after the families were found."""
    graph = capture_for_search(SMALL)
    state = search_state._Search(graph, Cluster.load("dgx-a100-80g"), 64, {}, 8, PhaseTimer(),
                           Budget(None), False)
    fams = list(state.families())[:2]
    state.mem = DeviceMemory(state.mem.capacity * capacity_scale, state.mem.reserved)
    config, lightest = state.lightest(fams[0])
    state.unfit = {fams[0]: (3, lightest, config), fams[1]: (5, lightest, config)}
    state.fitted = {fams[0]}
    state.unfit_reasons()
    return state, fams


def test_unfit_reasons_say_none_fits_only_without_a_fit() -> None:
    # a capacity below every variant: the second family's lightest does not fit either
    state, fams = _unfit_state(1e-4)
    assert any(r.startswith(f"{fams[0]}: 3 ") and "did not fit" in r for r in state.pruned)
    none = [r for r in state.pruned if r.startswith(f"{fams[1]}: none of 5 ")]
    assert none and none[0].family_wide and none[0].needed_gib > none[0].capacity_gib


def test_unfit_reasons_name_lighter_variants_that_fit_but_were_not_ranked() -> None:
    # the real capacity: the second family's lightest fits, so "none fits" would be false
    state, fams = _unfit_state(1.0)
    mine = [r for r in state.pruned if r.startswith(f"{fams[1]}:")]
    assert mine and "none of" not in mine[0] and "lighter variants fit" in mine[0]
    assert not mine[0].family_wide


def test_failed_finalists_are_quoted(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def refuse(graph, cluster, c, batch, cache, **_keywords):  # type: ignore[no-untyped-def]
        raise CostModelError("refused for the test")

    monkeypatch.setattr(pricing, "price_finalist", refuse)
    with pytest.raises(InfeasibleError, match="every finalist failed.*refused for the test"):
        search(capture_for_search(SMALL), "dgx-a100-80g", batch=8, progress=False)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Block() for _ in range(4))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x).sum()


def test_graph_with_a_1d_input_plans() -> None:
    graph = capture(_Mlp(), inputs=(torch.randn(8),))
    plan = search(graph, "dgx-a100-80g", batch=8, progress=False, seq=123)  # no seq dim: ignored
    assert plan.estimate["fits"]


def test_graph_without_layers_plans_without_pipelining_and_says_why() -> None:
    graph = capture(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)),
                    inputs=(torch.randn(8),))
    plan = search(graph, "dgx-a100-80g", batch=8, progress=False)
    assert plan.config.pp == 1 and plan.config.dp * plan.config.tp == 8
    assert any("no repeated layers found" in reason for reason in plan.pruned)


def test_docs_name_errors_that_exist() -> None:
    text = (Path(__file__).parents[2] / "docs" / "planner.md").read_text()
    assert "fxplan.search.InfeasibleError" not in text
    assert "fxplan.inter_op.InfeasibleError" in text and "fxplan.inter_op.ConstraintError" in text
