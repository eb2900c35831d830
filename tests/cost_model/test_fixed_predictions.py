"""A fixed set of plans priced against the predictions recorded in
``tests/cost_model/data/fixed_predictions.json``: a change to how the cost model is organised
(where the CPU host costs live, how a stage is assembled) must leave every step time, every
term of its breakdown and every stage's peak memory as it was.

The plans cover the built-in GPU specs the search offers most (one kind, two nodes, a
heterogeneous park) and ``local-cpu`` with a core per rank and time-shared, under every host
term the CPU model prices (DDP, ZeRO-3's FSDP2 groups, DTensor under tp and sp, the pipeline's
host work, offload, the cache refill of time-shared tp waits). ``local-cpu`` is generated from
this machine; the test pins it to 2 cores and 24 GiB so the recorded numbers hold anywhere.

Record again only where a prediction is meant to change (say which, in the change):
``python tests/cost_model/test_fixed_predictions.py --write``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from fxplan.api import capture
from fxplan.cluster_specs import Cluster, local_cpu
from fxplan.core.config import ParallelConfig
from fxplan.cost_model import estimate

DATA = Path(__file__).parent / "data" / "fixed_predictions.json"
#: Relative agreement: far finer than the printed digits (summation order only).
REL = 1e-9
MODEL = "gpt:layers=4,hidden=128,heads=8,vocab=512,seq=64"
BATCH = 32

#: (cluster spec, parallel configuration)
CASES: tuple[tuple[str, str], ...] = (
    ("local-cpu:devices=1", "dp=1,mb=8"),
    ("local-cpu:devices=2", "dp=2"),
    ("local-cpu:devices=2", "dp=2,zero=1"),
    ("local-cpu:devices=2", "dp=2,zero=3"),
    ("local-cpu:devices=2", "tp=2"),
    ("local-cpu:devices=2", "tp=2,sp=on"),
    ("local-cpu:devices=2", "pp=2,mb=4,schedule=1f1b"),
    ("local-cpu:devices=2", "dp=2,recompute=full"),
    ("local-cpu:devices=2", "dp=2,zero=3,offload=optimizer"),
    ("local-cpu:devices=4", "dp=2,tp=2"),
    ("local-cpu:devices=4", "dp=2,tp=2,sp=on"),
    ("local-cpu:devices=4", "dp=4,zero=3"),
    ("local-cpu:devices=4", "pp=2,dp=2,mb=2,schedule=gpipe"),
    ("dgx-a100-80g:nodes=2", "dp=16"),
    ("dgx-a100-80g:nodes=2", "dp=4,tp=2,pp=2,mb=2,schedule=interleaved:2,zero=1,"
                             "recompute=selective,sp=on"),
    ("dgx-a100-80g:nodes=2", "dp=8,tp=2,zero=3"),
    ("dgx-h100", "tp=8"),
    ("dgx-h100", "dp=2,tp=4,sp=on,recompute=full"),
    ("hetero-v100-a100", "dp=8,pp=2,tp=2,mb=4"),
)


def _pin_local_cpu(monkeypatch_setattr: Any) -> None:
    monkeypatch_setattr(local_cpu, "cpu_cores", lambda: 2)
    monkeypatch_setattr(local_cpu, "memory_gib", lambda: 24.0)
    monkeypatch_setattr(local_cpu, "cpu_model", lambda: "pinned")


def _graph(cpu: bool) -> Any:
    return capture(MODEL, batch=1, dtype=torch.float32 if cpu else torch.bfloat16)


def predictions() -> dict[str, dict[str, Any]]:
    """Each case's step time, breakdown and per-stage peak memory."""
    graphs = {cpu: _graph(cpu) for cpu in (True, False)}
    out: dict[str, dict[str, Any]] = {}
    for spec, config in CASES:
        cluster = Cluster.load(spec)
        e = estimate(graphs[spec.startswith("local-cpu")], cluster, ParallelConfig.parse(config),
                     batch=BATCH)
        out[f"{spec} | {config}"] = {
            "step_time_s": e.step_time_s,
            "breakdown": dict(sorted(e.breakdown.items())),
            "peak_memory_gib": list(e.peak_memory_gib),
        }
    return out


@pytest.fixture(scope="module")
def priced() -> dict[str, dict[str, Any]]:
    with pytest.MonkeyPatch.context() as mp:
        _pin_local_cpu(mp.setattr)
        return predictions()


@pytest.mark.parametrize("key", [f"{s} | {c}" for s, c in CASES])
def test_prediction_unchanged(priced: dict[str, dict[str, Any]], key: str) -> None:
    want = json.loads(DATA.read_text())[key]
    got = priced[key]
    assert got["step_time_s"] == pytest.approx(want["step_time_s"], rel=REL)
    assert sorted(got["breakdown"]) == sorted(want["breakdown"])
    for term, seconds in want["breakdown"].items():
        assert got["breakdown"][term] == pytest.approx(seconds, rel=REL, abs=1e-15), term
    assert got["peak_memory_gib"] == pytest.approx(want["peak_memory_gib"], rel=REL)


def test_recorded_cases_are_the_cases() -> None:
    """No recorded plan is left unpriced and none priced goes unchecked."""
    assert sorted(json.loads(DATA.read_text())) == sorted(f"{s} | {c}" for s, c in CASES)


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:] != ["--write"]:
        raise SystemExit(__doc__)
    mp = pytest.MonkeyPatch()
    _pin_local_cpu(mp.setattr)
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps(predictions(), indent=1) + "\n")
    print(f"wrote {DATA}")
