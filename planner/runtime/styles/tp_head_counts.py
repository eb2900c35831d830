"""Head-parallel attention whose forward reshapes by head counts stored on the module.

An attention written as

    q = self.q_proj(x).view(b, t, self.n_head, self.head_dim)          (k, v alike)
    y = attention(q, k, v).transpose(1, 2).reshape(b, t, self.n_embd)
    return self.o_proj(y)

runs head-parallel once its column-parallel ``q_proj``/``k_proj``/``v_proj`` (each rank the
rows of its ``a/t`` heads: a contiguous ``Shard(0)`` of a separate projection is one head group)
and its row-parallel ``o_proj`` are in place *and* the counts it reshapes by are the local ones:
on every tp rank of ``t`` the module's head-count attributes become ``a/t`` (``kv/t`` for the
key/value heads of grouped-query attention) and its width attributes (``a·d``, the projection's
output size) ``a·d/t``; the head size ``d`` is unchanged. The forward, unchanged, then attends
over its ``a/t`` heads at every position, and ``o_proj``'s all-reduce sums the head groups — the
model's attention. The names read are those real code uses (:data:`HEADS`, :data:`KV_HEADS`,
:data:`WIDTHS`).

:func:`local_head_counts` finds them, for the modules with such an attribute whose direct
``nn.Linear`` children the plan splits column-parallel; the runtime sets them on every rank
(:func:`apply_head_counts`) and checks the forward with the local shapes on fake tensors before
anything runs (the attention's query and key must be the model's with ``heads ÷ tp`` and the same
positions: :func:`fxplan.runtime.apply.module_checks.check_local_attention`). Refused, with the reason:

* a fused q/k/v projection split by size (``c_attn`` of ``3·a·d`` outputs, nanoGPT's): a
  contiguous row shard gives rank 0 all of q and part of k, which local counts would hide;
  only the forms :mod:`~fxplan.runtime.styles.tp_fused_qkv` and
  :mod:`~fxplan.runtime.styles.tp_attention` know are split by head group;
* head counts that do not divide by ``t``, or no head size to tell widths from counts;
* a count fixed in the code (a constant, ``C // self.n_head`` from the input's full width):
  nothing on the module to set, so the forward still fails or attends wrongly, and the check
  says so.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Mapping

from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel
from torch.distributed.tensor.parallel.style import ParallelStyle

from fxplan.runtime.styles.tp_styles import NotExpressible

__all__ = ["HEADS", "KV_HEADS", "WIDTHS", "apply_head_counts", "local_head_counts",
           "set_head_counts"]

#: Attributes that hold an attention's query head count.
HEADS = ("num_heads", "n_head", "n_heads", "num_attention_heads", "heads")
#: Attributes that hold its key/value head count (grouped-query attention).
KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "n_kv_head", "kv_heads")
#: Attributes that hold a width ``heads · head_dim`` (or ``kv_heads · head_dim``).
WIDTHS = ("embed_dim", "n_embd", "hidden_size", "hidden", "inner_dim", "all_head_size",
          "d_model", "dim", "kv_dim")

#: ``{module name: {attribute: local value}}``.
HeadCounts = dict[str, dict[str, int]]


def _int(module: nn.Module, name: str) -> int | None:
    value = module.__dict__.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def local_head_counts(model: nn.Module, styles: Mapping[str, ParallelStyle], tp: int
                      ) -> HeadCounts:
    """The local head counts and widths of every attention the plan splits (module
    docstring); :class:`NotExpressible` naming the first that cannot be split by head group."""
    colwise = {n for n, s in styles.items() if isinstance(s, ColwiseParallel)}
    counts: HeadCounts = {}
    for name, module in model.named_modules():
        heads = {a: v for a in HEADS if (v := _int(module, a)) is not None}
        split = [(c, m) for c, m in module.named_children()
                 if isinstance(m, nn.Linear) and (f"{name}.{c}" if name else c) in colwise]
        if not heads or not split:
            continue
        counts[name] = _module_counts(name, module, heads, split, tp)
    return counts


def _module_counts(name: str, module: nn.Module, heads: dict[str, int],
                   split: list[tuple[str, nn.Linear]], tp: int) -> dict[str, int]:
    """One attention's local counts (:func:`local_head_counts`)."""
    a = max(heads.values())
    kv = {k: v for k in KV_HEADS if (v := _int(module, k)) is not None}
    widths = {w: v for w in WIDTHS if (v := _int(module, w)) is not None}
    d = _int(module, "head_dim") or _int(module, "head_size")
    if d is None:
        d = next((v // a for v in widths.values() if v % a == 0), None)
    where = f"{type(module).__name__} {name!r}"
    if d is None:
        raise NotExpressible(f"{where} holds its head count ({', '.join(heads)}) but no head "
                             "size (head_dim, or a width such as embed_dim) to tell its widths "
                             "by: its local head counts cannot be set")
    g = min(kv.values()) if kv else a
    for child, linear in split:
        if linear.out_features not in (a * d, g * d):
            raise NotExpressible(
                f"{where}: its projection {child!r} has {linear.out_features} outputs, not "
                f"{a}·{d} (its heads × head size): a fused q/k/v projection split by size, whose "
                "contiguous tp shard is not one head group per rank; write q, k and v as "
                "separate Linears, or use the fused form with qkv/proj/heads/hidden/head_dim")
    uneven = [f"{k}={v}" for k, v in {**heads, **kv}.items() if v % tp]
    if uneven:
        raise NotExpressible(f"{where}: {', '.join(uneven)} heads do not divide by tp={tp}")
    local = {k: v // tp for k, v in {**heads, **kv}.items()}
    local.update({w: v // tp for w, v in widths.items() if v in (a * d, g * d)})
    return local


def apply_head_counts(model: nn.Module, counts: HeadCounts) -> dict[tuple[str, str], int]:
    """Set ``counts`` on ``model``'s modules (those it holds: a pipeline stage holds some);
    the values they replaced, by ``(module, attribute)``."""
    named = dict(model.named_modules())
    before = {(n, a): named[n].__dict__[a] for n, attrs in counts.items() if n in named
              for a in attrs}
    for (n, a) in before:
        setattr(named[n], a, counts[n][a])
    return before


@contextlib.contextmanager
def set_head_counts(model: nn.Module, counts: HeadCounts) -> Iterator[None]:
    """``counts`` set on ``model``'s modules inside the block only (a check)."""
    named = dict(model.named_modules())
    before = apply_head_counts(model, counts)
    try:
        yield
    finally:
        for (n, a), value in before.items():
            setattr(named[n], a, value)
