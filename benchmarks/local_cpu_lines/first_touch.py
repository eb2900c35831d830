"""Fresh pages faulted in per training step: what a re-faulted page costs and the share of the saved
activations faulted in again (line 9., ``--first-touch``). The formulas are in
``local_cpu_calibration.py``'s docstring."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from local_cpu_lines.ranks import spawn_json
from local_cpu_lines.rates import op_chain_s

__all__ = ["first_touch", "PAGE_BYTES"]


PAGE_BYTES = 4096


def _mallopt(**params: int) -> None:
    """Set glibc malloc parameters by name (``trim``, ``top_pad``, ``mmap``), bytes, or raise
    (:func:`fxplan.runtime.train.heap.set_malloc`)."""
    from fxplan.runtime.train.heap import set_malloc

    failed = set_malloc(**params)
    if failed:
        raise RuntimeError(failed)


def _saved_bytes(batch: int, seq: int = 64) -> float:
    """The cost model's saved activation bytes of one gpt-tiny microbatch of ``batch``
    (``NodeInfo.saved_bytes`` of the captured graph, whose batch is 1)."""
    from fxplan.api import capture_for_search

    graph = capture_for_search("gpt-tiny", seq=seq, dtype="float32")
    return batch * float(sum(n.meta["fxplan"].saved_bytes for n in graph.gm.graph.nodes
                             if "fxplan" in n.meta))


def _plain_train_step(batch: int) -> Callable[[], None]:
    """gpt-tiny's training step as the trainer runs it on one rank, without the runtime:
    forward, cross-entropy, backward, clipping, AdamW, ``zero_grad`` (gradients to None)."""
    import torch.nn.functional as F

    from fxplan.examples.model_spec import resolve_model

    torch.manual_seed(0)
    model = resolve_model("gpt-tiny").build("cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randint(0, 512, (batch, 64)), torch.randint(0, 512, (batch, 64))

    def step() -> None:
        out = model(x)
        F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1)).backward()
        del out
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    return step


def _faulted_steps(step: Callable[[], None], steps: int) -> tuple[list[float], list[int]]:
    """Thread CPU seconds and minor page faults of each of ``steps`` calls of ``step``."""
    import resource

    times, faults = [], []
    for _ in range(steps):
        f = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        c = time.thread_time()
        step()
        times.append(time.thread_time() - c)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f)
    return times, faults


def _first_touch_worker(rank: int, world: int, port: int, batch: int, steps: int,
                        in_situ: bool, out: str) -> None:
    """A fresh process: gpt-tiny's step at ``batch``; ``in_situ``: alternating blocks with
    the heap trimmed after every free and with it kept (``mallopt``), else the heap as a
    launched rank has it (:func:`fxplan.runtime.train.heap.keep_heap`, module docstring, 9.)."""
    torch.set_num_threads(1)
    if not in_situ:
        from fxplan.runtime.train.heap import keep_heap

        note = keep_heap()
        if note:
            raise RuntimeError(note)
    step = _plain_train_step(batch)
    for _ in range(3):
        step()
    result: dict[str, Any] = {"eager_op_us": op_chain_s(lambda t: t, 3, backward=False)[0] * 1e6}
    if in_situ:
        samples: dict[str, tuple[list[float], list[int]]] = {"trim": ([], []), "keep": ([], [])}
        # every tensor on the heap (none mmapped), then: give back all of the free top at
        # every free / never give back
        _mallopt(mmap=32 * 2**20, top_pad=0)
        for r in range(steps):
            for mode, trim in (("trim", 0), ("keep", 2**30)):
                _mallopt(trim=trim)
                step()                      # the first step after the switch settles it
                t, f = _faulted_steps(step, 3)
                samples[mode][0].extend(t)
                samples[mode][1].extend(f)
        for mode, (t, f) in samples.items():
            result[mode] = {"cpu_ms": statistics.median(t) * 1e3, "faults": statistics.median(f)}
    else:
        t, f = _faulted_steps(step, steps)
        result.update(cpu_ms=statistics.median(t) * 1e3, faults=f)
    Path(out).write_text(json.dumps(result))


def first_touch(batches: tuple[int, ...] = (4, 8, 16), runs: int = 3, steps: int = 20,
                in_situ_batch: int = 16) -> dict[str, Any]:
    """9. What the first touch of fresh pages costs a training step (module docstring).

    ``page_us``: in one fresh process, gpt-tiny's step at ``in_situ_batch`` alternately with
    the heap trimmed at every free (``M_TRIM_THRESHOLD`` 0: the step's pages are given back
    and faulted again on the next step) and kept (``M_TRIM_THRESHOLD`` 1 GiB: no faults),
    every tensor on the heap (``M_MMAP_THRESHOLD`` 32 MiB):
    ``(t_trim − t_keep) / (faults_trim − faults_keep)``, the seconds a re-faulted 4 KiB page
    costs the step (the fault, the kernel zeroing it, the missed cache), at the spec's eager
    op (``· EAGER_OP_US / e``, each run's own probe). ``fraction``: with the heap as a
    launched rank keeps it (:func:`fxplan.runtime.train.heap.keep_heap`), the mean over ``runs`` fresh processes × ``steps`` steps of the faults
    per step, in bytes, over the saved activation bytes of the microbatch
    (:func:`_saved_bytes`), per batch size; the pooled fraction weighs each batch size by its
    bytes."""
    from fxplan.cluster_specs.local_cpu import EAGER_OP_US

    page = []
    for _ in range(runs):
        r = spawn_json(_first_touch_worker, 1, in_situ_batch, 6, True)
        page.append((r["trim"]["cpu_ms"] - r["keep"]["cpu_ms"]) * 1e3
                    / max(1.0, r["trim"]["faults"] - r["keep"]["faults"])
                    * EAGER_OP_US / r["eager_op_us"])
        page_raw = r
    natural: dict[str, Any] = {}
    faulted = saved = 0.0
    for b in batches:
        faults = [f for _ in range(runs)
                  for f in spawn_json(_first_touch_worker, 1, b, steps, False)["faults"]]
        mean = statistics.fmean(faults) * PAGE_BYTES
        natural[str(b)] = {"faults_per_step": statistics.fmean(faults),
                           "min": min(faults), "max": max(faults),
                           "saved_mib": _saved_bytes(b) / 2**20,
                           "fraction": mean / _saved_bytes(b)}
        faulted += mean
        saved += _saved_bytes(b)
    return {"page_us": statistics.median(page), "page_us_runs": page, "last_in_situ": page_raw,
            "natural": natural, "fraction": faulted / saved}
