"""The data coordinates a ``--data FILE.py:FUNCTION`` hook gets (``fxplan.rank.data_source.data_source``):
``dp_rank``/``dp_size`` are the data replica's, so under context parallelism (``cp`` consecutive
dp ranks per CP group, Megatron's layout) the ranks of a group get the same coordinates and
read the same samples (:func:`fxplan.runtime.train.data.replica_coordinates`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fxplan.runtime.train.data import replica_coordinates
from fxplan.runtime.apply.sharded_module import ShardedModule
from fxplan.rank.data_source import data_source

HOOK = '''
import torch

def build(seq, global_batch, start, stop, seed, dp_rank, dp_size):
    """Sample i of the replica's slice: tokens all equal to dp_rank·1000 + dp_size·100 + i."""
    rows = global_batch // dp_size
    assert rows == stop - start
    tokens = torch.stack([torch.full((seq,), dp_rank * 1000 + dp_size * 100 + i) for i in range(rows)])
    while True:
        yield tokens, tokens
'''


def _slice(dp: int, cp: int, batch: int, d: int) -> tuple[int, int]:
    """``ShardedModule.replica_slice`` of dp rank ``d`` (its own code, on a stand-in)."""
    stand_in = SimpleNamespace(plan=SimpleNamespace(dp=dp, batch=batch),
                               context=SimpleNamespace(cp=cp) if cp > 1 else None,
                               coordinate={"dp": d})
    stand_in._replicas = lambda: ShardedModule._replicas(stand_in)
    return ShardedModule.replica_slice(stand_in)


@pytest.mark.parametrize("dp, cp, expected", [
    (4, 1, [(0, 4), (1, 4), (2, 4), (3, 4)]),
    (4, 2, [(0, 2), (0, 2), (1, 2), (1, 2)]),        # 2 CP groups of 2 consecutive dp ranks
    (8, 4, [(0, 2)] * 4 + [(1, 2)] * 4),
    (4, 4, [(0, 1)] * 4),
])
def test_coordinates_are_the_cp_group_and_dp_over_cp(dp, cp, expected):
    batch = 8
    coordinates = [replica_coordinates(batch, *_slice(dp, cp, batch, d)) for d in range(dp)]
    assert coordinates == expected


@pytest.mark.parametrize("start, stop", [(0, 0), (1, 3), (0, 3), (6, 10)])
def test_coordinates_refuse_an_uneven_slice(start, stop):
    with pytest.raises(ValueError, match="equal consecutive slices"):
        replica_coordinates(8, start, stop)


def test_hook_ranks_of_one_cp_group_read_the_same_samples(tmp_path):
    """dp=4, cp=2: the hook sees (0, 2) on dp ranks 0 and 1, (1, 2) on 2 and 3, and yields the
    same samples within a group (it used to see each rank's d of 4: every rank different)."""
    hook = tmp_path / "data.py"
    hook.write_text(HOOK)
    plan = SimpleNamespace(seq=4, batch=8, dp=4)
    bundle = SimpleNamespace(config=SimpleNamespace(vocab=50000),
                             example_inputs=lambda b, s: {"tokens": torch.zeros(b, s,
                                                                                dtype=torch.long)})
    args = SimpleNamespace(data=f"{hook}:build", seed=0)
    firsts = []
    for d in range(4):
        start, stop = _slice(plan.dp, 2, plan.batch, d)
        (tokens,), _ = data_source(args, bundle, plan, start, stop).batch(0, start, stop)
        assert tokens.shape == (4, 4)
        firsts.append(int(tokens[0, 0]))
    assert firsts == [200, 200, 1200, 1200]
