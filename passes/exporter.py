"""The export path of capture: ``torch.export`` (non-strict) on fake tensors → an fx graph.

``torch.fx.symbolic_trace`` is fast but stops at Python control flow on traced values,
``*args/**kwargs`` forwards and buffer slicing, and it keeps ``torch.nn`` modules as opaque
leaves. Hugging Face models and ``nn.TransformerEncoder`` need what PyTorch itself uses for
real models: :func:`torch.export.export` with ``strict=False``, which runs the Python
forward on fake tensors and records the ATen ops it dispatches. The op set is export's
default ATen IR (``aten.linear``, ``aten.scaled_dot_product_attention``,
``aten.layer_norm``, ``aten.embedding``, ``aten.view``, …: composite ops that carry the
structure the planner needs, not yet lowered to ``aten.mm``/``aten.addmm``).

What this module guarantees, so that the rest of capture treats both paths alike:

- the model's state is swapped for fake CPU tensors of the same shapes, dtypes and strides
  for the export only (:func:`torch.nn.utils.stateless._reparametrize_module`): a model built
  on ``meta`` exports (``meta`` alone fails on code that makes CPU tensors, such as
  ``nn.MultiheadAttention``'s masks), a real model is not touched, nothing is allocated;
- parameters and buffers are ``get_attr`` nodes named by their ``state_dict`` names
  (``ExportedProgram.module()`` un-lifts export's parameter placeholders), each moved to just
  before its first user so a layer's nodes are contiguous, and held as ``meta`` tensors;
- export's runtime checks (the ``_guards_fn`` input-shape guard, ``_assert_tensor_metadata``,
  ``_assert_scalar``) are removed: capture casts dtypes and reruns at other shapes;
- placeholders are the keyword inputs in the order given; every node keeps export's
  ``nn_module_stack``, from which capture reads module paths and layers.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any, Mapping

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.utils.stateless import _reparametrize_module

from fxplan.passes.errors import CaptureError, location_of, user_frame
from fxplan.passes.unroll import UNROLLED, NotUnrollable, export_unrolled

__all__ = ["export_graph"]

log = logging.getLogger(__name__)

#: torch's own deprecation, raised when a program's tree specs are copied (every export of a
#: Hugging Face model printed it once): nothing a user of fxplan can act on.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                        category=FutureWarning)

#: Nodes export inserts to check its own assumptions; capture removes them.
_CHECKS = ("_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size",
           "_assert_async")


def _fake_state(model: torch.nn.Module, mode: FakeTensorMode,
                device: torch.device) -> dict[str, torch.Tensor]:
    """Fake twins of every parameter and buffer, non-persistent buffers included
    (``Parameter`` stays ``Parameter``; tied names share one twin)."""
    state: dict[str, torch.Tensor] = {}
    made: dict[int, torch.Tensor] = {}  # tied names share one fake tensor, as they share one
    with mode:
        for name, value in [*model.named_parameters(remove_duplicate=False),
                            *model.named_buffers(remove_duplicate=False)]:
            if id(value) in made:
                state[name] = made[id(value)]
                continue
            fake = torch.empty_strided(tuple(value.shape), tuple(value.stride()),
                                       dtype=value.dtype, device=device)
            if isinstance(value, torch.nn.Parameter):
                fake = torch.nn.Parameter(fake, requires_grad=value.requires_grad)
            state[name] = made[id(value)] = fake
    return state


def _fake_input(value: Any, mode: FakeTensorMode, device: torch.device) -> Any:
    """A tensor or ``InputSpec``-like (``shape``, ``dtype``) → a fake tensor; others as is."""
    with mode:
        if isinstance(value, torch.Tensor):
            return torch.empty_strided(tuple(value.shape), tuple(value.stride()),
                                       dtype=value.dtype, device=device)
        if hasattr(value, "shape") and isinstance(getattr(value, "dtype", None), torch.dtype):
            return torch.empty(tuple(value.shape), dtype=value.dtype, device=device)
    return value


def export_graph(model: torch.nn.Module, inputs: Mapping[str, Any], *,
                 device: str = "cpu", unroll: bool = True, core: bool = False
                 ) -> torch.fx.GraphModule:
    """Export ``model`` called as ``model(**inputs)`` and return the cleaned graph module.

    ``inputs``: keyword inputs (tensors of any device, or shape/dtype specs); non-tensor
    values are passed as they are and specialised. ``unroll``: a model with many identical
    layers is exported on its first three and the rest rebuilt
    (:func:`fxplan.passes.unroll.export_unrolled`; the whole model is exported when that is
    not exact, with a log line saying why). ``core``: the exported program is lowered to
    the core ATen op set (``ExportedProgram.run_decompositions()`` with its default table:
    ``aten.linear`` → ``aten.t`` + ``aten.addmm``/``aten.mm``, ``aten.layer_norm`` →
    ``aten.native_layer_norm``, views → ``aten.view``…). Raises :class:`CaptureError` naming the
    user's source line when export fails.
    """
    if unroll:
        try:
            return export_unrolled(model, lambda cut: _export_whole(cut, inputs, device, core))
        except NotUnrollable as why:
            log.info("%s is exported whole: %s", type(model).__name__, why)
            if why.shallow_tried:
                gm = _export_whole(model, inputs, device, core)
                gm.meta[UNROLLED] = f"all layers traced (not repeated: {why})"
                return gm
    return _export_whole(model, inputs, device, core)


def _export_whole(model: torch.nn.Module, inputs: Mapping[str, Any],
                  device: str, core: bool = False) -> torch.fx.GraphModule:
    dev = torch.device(device)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    state = _fake_state(model, mode, dev)
    kwargs = {k: _fake_input(v, mode, dev) for k, v in inputs.items()}
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # model code must never reach the network
    try:
        with _reparametrize_module(model, state, tie_weights=True):
            program = torch.export.export(model, (), kwargs, strict=False)
            if core:
                program = program.run_decompositions()
        gm = program.module()
    except Exception as err:
        location, where = location_of(user_frame(err.__traceback__))
        text = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise CaptureError(f"torch.export could not capture {type(model).__name__}{where}: "
                           f"{type(err).__name__}: {text}", location=location) from err
    _clean(gm)
    return gm


def _clean(gm: torch.fx.GraphModule) -> None:
    """Drop export's checks, put ``get_attr`` nodes before their first user, state on meta."""
    for sub in gm.modules():  # the root and the subgraphs of higher-order ops
        if isinstance(sub, torch.fx.GraphModule):
            _drop_checks(sub)
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        if node.op == "get_attr" and node.users:
            min(node.users, key=order.__getitem__).prepend(node)
    graph.lint()
    _state_to_meta(gm)
    gm.recompile()


def _drop_checks(gm: torch.fx.GraphModule) -> None:
    """Remove export's runtime checks (they assert the dtypes and shapes exported with)."""
    for node in list(gm.graph.nodes):
        name = getattr(node.target, "__name__", str(node.target)).split(".")[0]
        guard = node.op == "call_module" and str(node.target) == "_guards_fn"
        if (guard or (node.op == "call_function" and name in _CHECKS)) and not node.users:
            gm.graph.erase_node(node)
    if hasattr(gm, "_guards_fn"):
        delattr(gm, "_guards_fn")
    gm.recompile()


def _state_to_meta(gm: torch.fx.GraphModule) -> None:
    """Replace the exported (fake) parameters and buffers by ``meta`` tensors alike."""
    for name, value in [*gm.named_parameters(remove_duplicate=False),
                        *gm.named_buffers(remove_duplicate=False)]:
        owner_name, _, attr = name.rpartition(".")
        owner = gm.get_submodule(owner_name) if owner_name else gm
        meta = torch.empty_strided(tuple(value.shape), tuple(value.stride()),
                                   dtype=value.dtype, device="meta")
        if isinstance(value, torch.nn.Parameter):
            owner._parameters[attr] = torch.nn.Parameter(meta, value.requires_grad)
        elif attr in owner._buffers:
            owner._buffers[attr] = meta
