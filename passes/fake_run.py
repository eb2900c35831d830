"""Run a traced graph on fake tensors, node by node, with autograd on.

Nothing is allocated: parameters, buffers and inputs become ``FakeTensor``s (shape, dtype,
strides, device; no data) on ``device``. For each node the run records the value's shape and
dtype, prices it (:func:`passes.analyses.ops.price`: op class, FLOPs, bytes) and charges the
tensors autograd saves to it (:mod:`passes.analyses.saved_activations`). A node whose op has
no FLOP rule is run under ``FlopCounterMode`` and priced by what it measures.

``device="cpu"`` by default: autograd on fake CUDA tensors aborts on CPU-only builds of torch.
Dropout is routed to the fused kernel GPUs run (:class:`FusedDropout`), and so is attention
with dropout (:class:`FusedAttentionDropout`), so saved bytes match a GPU.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from fxplan.passes.analyses.blocks import module_path
from fxplan.passes.analyses.ops import OpCall, Price, op_key, price, rule_for
from fxplan.passes.analyses.saved_activations import (FusedAttentionDropout, FusedDropout,
                                                      SavedTensorRecorder)
from fxplan.passes.errors import CaptureError, location_of, user_frame
from fxplan.passes.node_info import NodeInfo, cast_dtype

_EXECUTED = ("call_module", "call_function", "call_method")


def _empty_like(t: torch.Tensor, device: torch.device, dtype: torch.dtype | None,
                requires_grad: bool) -> torch.Tensor:
    """A fresh fake tensor with ``t``'s shape (and strides), cast to ``dtype`` if floating."""
    cast = cast_dtype(t.dtype, dtype)
    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=cast, device=device,
                               requires_grad=requires_grad and cast.is_floating_point)


def _value_meta(value: Any) -> tuple[Any, Any]:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), value.dtype
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor)
                                                          for v in value):
        return tuple(tuple(v.shape) for v in value), tuple(v.dtype for v in value)
    return None, None


class FakeRun(torch.fx.Interpreter):
    """Interpreter that prices every node and records what autograd saves."""

    def __init__(self, gm: torch.fx.GraphModule, recorder: SavedTensorRecorder) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.extra_traceback = False  # our CaptureError already names the node
        self.recorder = recorder
        self.infos: dict[str, NodeInfo] = {}
        self.unpriced: dict[str, int] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        module = self.fetch_attr(n.target) if n.op == "call_module" else None
        key = op_key(n, module)
        measure = n.op in _EXECUTED and rule_for(key) is None
        self.recorder.current = n.name
        try:
            with self._set_current_node(n):
                args, kwargs = self.fetch_args_kwargs_from_env(n)
                if measure:
                    with FlopCounterMode(display=False) as counter:
                        out = getattr(self, n.op)(n.target, args, kwargs)
                else:
                    out = getattr(self, n.op)(n.target, args, kwargs)
        except CaptureError:
            raise
        except Exception as err:
            raise _node_error(n, err) from err
        finally:
            self.recorder.current = None
        if measure:
            self.unpriced[key] = self.unpriced.get(key, 0) + 1
        if n.op in _EXECUTED:
            cost = price(OpCall(key, args, kwargs, out, module),
                         counter.get_total_flops() if measure else None)
        else:  # placeholder, get_attr, output: no op runs
            cost = Price("other", 0, 0, 0)
        shape, dtype = _value_meta(out)
        self.infos[n.name] = NodeInfo(shape=shape, dtype=dtype, flops=cost.flops,
                                      bytes_read=cost.bytes_read,
                                      bytes_written=cost.bytes_written, op_class=cost.op_class)
        return out


class _Runner(torch.nn.Module):
    """Holds the graph module so ``functional_call`` can swap in fake parameters."""

    def __init__(self, gm: torch.fx.GraphModule, run: FakeRun) -> None:
        super().__init__()
        self.gm = gm
        self.run = run

    def forward(self, *args: Any) -> Any:
        return self.run.run(*args)


def fake_run(gm: torch.fx.GraphModule, args: list[Any], *, device: str = "cpu",
             dtype: torch.dtype | None = None) -> FakeRun:
    """Run ``gm`` on fake versions of its state and of ``args`` (tensors or objects with
    ``shape`` and ``dtype``; other values pass through). Returns the finished run, whose
    ``infos`` hold shape, dtype, FLOPs, bytes, op class and saved bytes of every node."""
    dev = torch.device(device)
    mode = FakeTensorMode(allow_non_fake_inputs=True)  # tensor constants fx put in the graph
    with mode:
        state = {f"gm.{k}": _empty_like(p, dev, dtype, p.requires_grad)
                 for k, p in gm.named_parameters()}
        state.update({f"gm.{k}": _empty_like(b, dev, dtype, False)
                      for k, b in gm.named_buffers()})
        fake_args = [_fake_input(a, dev, dtype) for a in args]
    recorder = SavedTensorRecorder(state.values())
    run = FakeRun(gm, recorder)
    with mode, torch.enable_grad(), recorder.hooks(), FusedDropout(), FusedAttentionDropout():
        torch.func.functional_call(_Runner(gm, run), state, tuple(fake_args), strict=False)
    for name, nbytes in recorder.saved.items():
        run.infos[name].saved_bytes = nbytes
    for name, rows in recorder.shared.items():
        run.infos[name].saved_shared = rows
    return run


def _fake_input(value: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    """A tensor or an ``InputSpec``-like (``shape``, ``dtype``) → fake; others unchanged."""
    if isinstance(value, torch.Tensor):
        return _empty_like(value, device, dtype, False)
    if hasattr(value, "shape") and isinstance(getattr(value, "dtype", None), torch.dtype):
        return torch.empty(tuple(value.shape), dtype=cast_dtype(value.dtype, dtype),
                           device=device)
    return value


def _node_error(n: torch.fx.Node, err: Exception) -> CaptureError:
    """Name the node, its module and the user's source line; explain value-dependence."""
    path = module_path(n)
    location, where = location_of(user_frame(err.__traceback__))
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if isinstance(err, DataDependentOutputException):
        text = ("the code needs tensor values (a branch or .item() on data), which fake "
                "tensors do not have; compute both branches (torch.where) or leave the "
                "decision to a forward argument fixed with concrete_args")
    else:
        text = f"{type(err).__name__}: {text}"
    module = f" in module {path!r}" if path else ""
    return CaptureError(f"shape propagation failed at node {n.name!r}{module}{where}: {text}",
                        module_path=path or None, location=location)
