"""``runtime.train.host_optimizer`` in one process: the host step is the wrapped optimizer's step
bit for bit, its state dict is the wrapped class's (a round trip, and to and from a plain
optimizer), the masters follow a parameter written outside the step, and ``make_optimizer``
builds it for ``offload=optimizer`` only."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from fxplan.runtime.styles.data_parallel import make_optimizer
from fxplan.runtime.train.host_optimizer import HostOffloadOptimizer, host_offloaded
from tests.core.test_plan import make_plan

ADAMW = dict(lr=1e-2, betas=(0.9, 0.95))


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _groups(model: torch.nn.Module) -> list[dict]:
    """The runtime's two groups: decay on matrices, none on vectors."""
    params = list(model.parameters())
    return [dict(params=[p for p in params if p.ndim >= 2], weight_decay=0.1),
            dict(params=[p for p in params if p.ndim < 2], weight_decay=0.0)]


def _steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int,
           first: int = 0) -> None:
    """``steps`` steps on a fixed batch, the learning rate changed every step as the trainer
    does."""
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(3))
    for t in range(first, first + steps):
        model(x).square().mean().backward()
        for group in optimizer.param_groups:
            group["lr"] = 1e-2 / (1 + t)
        optimizer.step()
        optimizer.zero_grad()


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("inner, kwargs", [(torch.optim.AdamW, ADAMW),
                                           (torch.optim.SGD, dict(lr=0.1, momentum=0.9))])
def test_the_host_step_is_the_wrapped_step_bit_for_bit(inner, kwargs) -> None:
    plain, host = _model(), _model()
    reference = inner(_groups(plain), **kwargs)
    offloaded = host_offloaded(inner)(_groups(host), **kwargs)
    assert isinstance(offloaded, HostOffloadOptimizer)
    assert type(offloaded).__name__ == f"Host{inner.__name__}"
    _steps(plain, reference, 4)
    _steps(host, offloaded, 4)
    assert _same(plain, host)
    # the host step is torch's single-tensor loop, over masters of their own (copies made)
    assert all(g["foreach"] is False for g in offloaded.host.param_groups)
    for p, master in offloaded.masters.items():
        assert master.data_ptr() != p.data_ptr() and master.dtype == torch.float32
        assert torch.equal(master, p)


def test_state_dict_round_trip_and_to_and_from_a_plain_optimizer() -> None:
    """Two steps, the state dict into a fresh optimizer (host → host, host → plain, plain →
    host), two more: every pair equals four uninterrupted plain steps bit for bit."""
    whole = _model()
    plain = torch.optim.AdamW(_groups(whole), **ADAMW)
    _steps(whole, plain, 4)
    HostAdamW = host_offloaded(torch.optim.AdamW)
    for save_class, load_class in [(HostAdamW, HostAdamW), (HostAdamW, torch.optim.AdamW),
                                   (torch.optim.AdamW, HostAdamW)]:
        first = _model()
        before = save_class(_groups(first), **ADAMW)
        _steps(first, before, 2)
        state = copy.deepcopy(before.state_dict())
        second = copy.deepcopy(first)
        after = load_class(_groups(second), **ADAMW)
        after.load_state_dict(state)
        assert after.state_dict()["param_groups"] == state["param_groups"]
        _steps(second, after, 2, first=2)
        assert _same(second, whole), (save_class, load_class)


def test_saved_state_is_the_host_state() -> None:
    """``state`` shows the inner optimizer's host tensors themselves (what DCP saves and
    overwrites in place), keyed by the device parameters."""
    model = _model()
    optimizer = host_offloaded(torch.optim.AdamW)(_groups(model), **ADAMW)
    _steps(model, optimizer, 1)
    for p, master in optimizer.masters.items():
        assert set(optimizer.state[p]) == {"step", "exp_avg", "exp_avg_sq"}
        for key, value in optimizer.state[p].items():
            assert value is optimizer.host.state[master][key]


def test_masters_follow_a_parameter_written_outside_the_step() -> None:
    """A model loaded (written in place) after the optimizer was built steps from the loaded
    values, as a plain optimizer does."""
    plain, host = _model(), _model()
    reference = torch.optim.AdamW(_groups(plain), **ADAMW)
    offloaded = host_offloaded(torch.optim.AdamW)(_groups(host), **ADAMW)
    _steps(plain, reference, 1)
    _steps(host, offloaded, 1)
    loaded = _model(seed=5).state_dict()
    plain.load_state_dict(loaded)
    host.load_state_dict(loaded)
    _steps(plain, reference, 2, first=1)
    _steps(host, offloaded, 2, first=1)
    assert _same(plain, host)


def _plan(**config):   # pp=2 dp=2 tp=1, zero=1 by default
    plan = make_plan()
    return dataclasses.replace(plan, config=plan.config.replace(**config))


@pytest.mark.parametrize("offload, host", [("none", False), ("optimizer", True),
                                           ("optimizer+params", False)])
def test_make_optimizer_steps_on_the_host_for_offload_optimizer_only(offload, host) -> None:
    zero = 3 if offload == "optimizer+params" else 0
    optimizer = make_optimizer(_model().parameters(), _plan(zero_stage=zero, offload=offload),
                               None, torch.optim.AdamW, **ADAMW)
    assert isinstance(optimizer, HostOffloadOptimizer) == host
