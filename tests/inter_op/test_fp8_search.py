"""FP8 in the search: never without being allowed, taken when allowed and faster, refused as a
constraint on devices without an FP8 peak; ``fxplan plan --allow-fp8``."""

from __future__ import annotations

import json

import pytest

from fxplan.api import capture_for_search
from fxplan.cli.main import main
from fxplan.cluster_specs import Cluster
from fxplan.inter_op import ConstraintError, search

WIDE = "gpt:layers=2,hidden=4096,heads=32,vocab=51200,seq=2048"


@pytest.fixture(scope="module")
def wide():  # type: ignore[no-untyped-def]
    return capture_for_search(WIDE)


def test_fp8_only_when_allowed(wide) -> None:  # type: ignore[no-untyped-def]
    cluster = Cluster.load("dgx-h100")
    plain = search(wide, cluster, batch=16, time_budget_s=60, progress=False)
    assert not plain.config.fp8
    allowed = search(wide, cluster, batch=16, time_budget_s=60, progress=False,
                     constraints={"fp8": [False, True]})
    assert allowed.config.fp8   # faster on H100 for 4096-wide linears
    assert allowed.estimate["step_time_s"] < plain.estimate["step_time_s"]


def test_fp8_constraint_on_a100_is_refused(wide) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConstraintError, match="lists no fp8 peak"):
        search(wide, Cluster.load("dgx-a100-80g"), batch=16, constraints={"fp8": True})


def test_cli_allow_fp8(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["plan", WIDE, "--cluster", "dgx-h100", "--batch", "16", "--allow-fp8",
                 "--json", "--time-budget", "60"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fp8"] is True and data["summary"].endswith("fp8=on")
