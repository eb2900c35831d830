"""FSDP2's host work per ``fully_shard`` group (:mod:`fxplan.cost_model.host.fsdp_host`)."""

from __future__ import annotations

import dataclasses

import pytest

from fxplan.cluster_specs import Cluster
from fxplan.core.config import ParallelConfig
from fxplan.cost_model.host.fsdp_host import fsdp_groups, fsdp_host_s

FIELDS = ("fsdp_gather_us", "fsdp_gather_tensor_us", "fsdp_reduce_us", "fsdp_reduce_tensor_us",
          "fsdp_regather_us", "fsdp_regather_tensor_us")


def test_groups_are_the_root_then_one_per_layer_with_a_tied_weight_once() -> None:
    segments = [("pre", ["wte", "wpe"]), ("L0", ["a", "b", "c"]), ("L1", ["a", "b", "c"]),
                ("post", ["ln.w", "ln.b", "wte"])]
    assert fsdp_groups(segments) == (4, 3, 3)
    assert fsdp_groups([("L3", ["a"])]) == (0, 1)          # a middle pipeline chunk


def test_the_formula_per_group_and_tensor() -> None:
    host = dataclasses.replace(Cluster.load("local-cpu:devices=2").device_groups[0].host,
                               **dict(zip(FIELDS, (100.0, 10.0, 50.0, 5.0, 70.0, 7.0))))
    groups = (4, 12, 12)                                   # root, two layers
    z2 = fsdp_host_s(groups, host, zero3=False)
    assert z2.forward == pytest.approx((3 * 100 + 28 * 10) * 1e-6)
    assert z2.post == pytest.approx((3 * 50 + 28 * 5) * 1e-6)
    assert z2.backward == 0.0
    # ZeRO-3 re-gathers every group, the root's too (the runtime's reshard_after_forward=True)
    z3 = fsdp_host_s(groups, host, zero3=True)
    assert z3.backward == pytest.approx((3 * 70 + 28 * 7) * 1e-6)
    assert (z3.forward, z3.post) == (z2.forward, z2.post)
    # reduced in every backward: the reduce joins the backward; ZeRO-2 kept gathered: its
    # unshard runs once per step
    every = fsdp_host_s(groups, host, zero3=True, every=True)
    assert every.backward == pytest.approx(z3.backward + z2.post) and every.post == 0.0
    kept = fsdp_host_s(groups, host, zero3=False, every=True, gathered=True)
    assert kept.forward == 0.0 and kept.post == pytest.approx(z2.forward)
    assert kept.backward == pytest.approx(z2.post)


def test_local_cpu_measures_it_and_the_gpu_specs_hide_it() -> None:
    two = Cluster.load("local-cpu:devices=2").device_groups[0]
    four = Cluster.load("local-cpu:devices=4").device_groups[0]
    assert all(getattr(two.host, f) >= 0 for f in FIELDS) and two.host.fsdp_gather_us > 0
    # host work is slowed by time-sharing like every host cost (s = η·C/N on 4 ranks)
    assert four.host.fsdp_gather_us > two.host.fsdp_gather_us
    for name in ("dgx-a100-80g", "dgx-h100"):
        gpu = Cluster.load(name).device_groups[0]
        assert gpu.host is None
        assert fsdp_host_s((4, 12, 12), gpu.host, zero3=True) == fsdp_host_s((), None, zero3=False)


@pytest.fixture(scope="module")
def tiny():  # type: ignore[no-untyped-def]
    import torch

    from fxplan.api import capture

    return capture("gpt:layers=2,hidden=64,heads=4,vocab=256,seq=32", batch=1,
                   dtype=torch.float32)


def _breakdown(graph, text: str, cluster: str):  # type: ignore[no-untyped-def]
    from fxplan.cost_model import estimate

    return estimate(graph, Cluster.load(cluster), ParallelConfig.parse(text), batch=8).breakdown


@pytest.mark.parametrize("text", ["dp=2,mb=4,zero=2", "dp=2,mb=2,zero=3", "dp=2,mb=1,zero=2"])
def test_fsdp_rows_pay_it_per_group_and_microbatch(tiny, text: str) -> None:  # type: ignore[no-untyped-def]
    cpu = Cluster.load("local-cpu:devices=2").device_groups[0]
    off = "local-cpu:devices=2," + ",".join(f"cpu.{f}=0" for f in FIELDS)
    on, without = _breakdown(tiny, text, "local-cpu:devices=2"), _breakdown(tiny, text, off)
    config = ParallelConfig.parse(text)
    m = 8 // config.dp // config.microbatch_size          # microbatches per step
    # the tiny GPT: a root (token and position embeddings, final norm; head tied) and two
    # layers of 12 tensors; forward per microbatch, ZeRO-3's re-gather too, reduce once — or
    # per microbatch under ZeRO-3 with m > 1 (ParallelConfig.reduces_every_microbatch)
    # (ZeRO-2 then gathers once per step)
    every = config.reduces_every_microbatch and m > 1
    host = fsdp_host_s((4, 12, 12), cpu.host, zero3=config.zero_stage == 3, every=every,
                       gathered=every and config.zero_stage == 2)
    expected = m * (host.forward + host.backward) + host.post
    extra = sum(on.values()) - sum(without.values())
    assert extra == pytest.approx(expected, rel=1e-6)
    # DDP's rows do not run FSDP2
    ddp = "dp=2,mb=4"
    assert _breakdown(tiny, ddp, "local-cpu:devices=2") == _breakdown(tiny, ddp, off)
