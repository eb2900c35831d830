"""fx tracing for capture: leaf modules on request, untraceable code explained.

:class:`CaptureTracer` is a ``torch.fx.Tracer`` that also keeps as leaves (one opaque
``call_module`` node) the modules named in ``leaf_modules`` (a class, a class name, a
qualified module name or an ``fnmatch`` pattern such as ``"h.*.attn"``) and reports which.
When tracing fails, :func:`trace` raises :class:`~passes.errors.CaptureError` naming the
innermost module being traced, the user's source line and the remedies, instead of fx's
traceback.
"""

from __future__ import annotations

import fnmatch
import inspect
from typing import Any, Sequence

import torch
import torch.fx

from fxplan.passes.errors import REMEDIES, CaptureError, location_of, user_frame

#: Known fx failure messages → what they mean in the user's terms.
_REASONS = (
    ("cannot be used as inputs to control flow",
     "data- or shape-dependent control flow: a Python `if`/`while`/`bool()` on a traced tensor"),
    ("cannot be interpreted as an integer",
     "a traced value is used as a Python int (range(), int(), a size argument)"),
    ("slice indices must be integers",
     "a traced value slices a concrete tensor (a buffer[:n]); use tensor.narrow(dim, 0, n)"),
    ("object cannot be iterated", "a traced tensor is iterated over or unpacked"),
)


class CaptureTracer(torch.fx.Tracer):
    """``torch.fx.Tracer`` with user leaf modules; remembers the module a failure came from."""

    def __init__(self, leaf_modules: Sequence[Any] = ()) -> None:
        super().__init__()
        self.leaf_specs = list(leaf_modules)
        self.user_leaves: dict[str, str] = {}  # qualified name → class name
        self.matched_specs: set[int] = set()

    def _user_leaf(self, m: torch.nn.Module, qualname: str) -> bool:
        for i, spec in enumerate(self.leaf_specs):
            if isinstance(spec, type):
                hit = isinstance(m, spec)
            else:
                hit = type(m).__name__ == spec or qualname == spec or (
                    any(c in spec for c in "*?[") and fnmatch.fnmatchcase(qualname, spec))
            if hit:
                self.matched_specs.add(i)
                return True
        return False

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        """User leaves; ``torch.nn`` modules without submodules (``Linear``, ``LayerNorm``).
        Composite ``torch.nn`` modules (``TransformerEncoderLayer``, ``MultiheadAttention``)
        are traced into, so their linears, attention and norms are nodes the planner can
        shard; where that fails, capture falls back to ``torch.export``."""
        if module_qualified_name and self._user_leaf(m, module_qualified_name):
            self.user_leaves[module_qualified_name] = type(m).__name__
            return True
        if next(m.children(), None) is not None:
            return False
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m: torch.nn.Module, forward: Any, args: tuple, kwargs: dict) -> Any:
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception as err:
            if not hasattr(err, "_fxplan_module"):  # innermost module wins
                err._fxplan_module = (self.path_of_module(m), type(m).__name__)  # type: ignore
            raise


def trace(model: torch.nn.Module, *, concrete_args: dict[str, Any] | None = None,
          leaf_modules: Sequence[Any] = ()) -> tuple[torch.fx.GraphModule, dict[str, str]]:
    """Trace ``model``; returns the graph module and the user leaves kept (path → class)."""
    tracer = CaptureTracer(leaf_modules)
    try:
        graph = tracer.trace(model, concrete_args=concrete_args)
    except Exception as err:
        raise untraceable(model, err) from err
    unmatched = [s for i, s in enumerate(tracer.leaf_specs) if i not in tracer.matched_specs]
    if unmatched:
        names = [getattr(s, "__name__", s) for s in unmatched]
        raise CaptureError(f"leaf_modules {names} matched no module of {type(model).__name__}; "
                           f"give a class, a class name or a qualified module name such as "
                           f"{_example_path(model)!r}")
    gm = torch.fx.GraphModule(tracer.root, graph, type(model).__name__)
    return gm, tracer.user_leaves


def untraceable(model: torch.nn.Module, err: Exception) -> CaptureError:
    """A :class:`CaptureError` for a failed trace: module, source line, reason, remedies."""
    path, cls = getattr(err, "_fxplan_module", ("", type(model).__name__))
    location, where = location_of(user_frame(err.__traceback__))
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    reason = next((r for key, r in _REASONS if key in text), f"{type(err).__name__}: {text}")
    module = f"module {path!r} ({cls})" if path else f"the model's own forward ({cls})"
    leaf = cls if path else "<submodule>"
    return CaptureError(f"cannot trace {type(model).__name__}: {module}{where}: {reason}. "
                        f"To capture it, {REMEDIES.format(leaf=leaf)}.",
                        module_path=path, location=location)


def _example_path(model: torch.nn.Module) -> str:
    """A qualified submodule name to show in a message, preferably one inside a layer."""
    names = [n for n, _ in model.named_modules() if n]
    return next((n for n in names if n.count(".") >= 2), names[0] if names else "submodule")


def trace_model(model: torch.nn.Module, num_inputs: int) -> torch.fx.GraphModule:
    """Flat graph of ``model.forward`` over its first ``num_inputs`` parameters, for the
    rewrite passes: every later parameter that defaults to ``None`` is fixed to ``None``
    (``targets=None`` in the example GPT), so the program is ``inputs → outputs`` with no
    data-dependent branch left open. Node names are those capture gives, so a plan's node
    placements apply."""
    signature = inspect.signature(model.forward)
    concrete = {
        name: None
        for i, (name, param) in enumerate(signature.parameters.items())
        if i >= num_inputs and param.default is None
    }
    return torch.fx.symbolic_trace(model, concrete_args=concrete or None)
