"""The probe's shortcut through repeated blocks: a block that is a copy of one already run,
called on inputs of the same metadata, is not run again; what its run would record is
replayed from the earlier one.

:func:`fxplan.runtime.apply.probe.probe_module` runs the model on fake tensors, where an op's
result depends on its inputs' metadata only (shape, strides, dtype, device). A block's forward
is a function of the block (its class, its submodules' classes, their attributes, the shapes
of their parameters and buffers — under tensor parallelism the local shapes the probe gives
them) and of its arguments. Two blocks with the same *structure* called on arguments with the
same *signature* (tensors by metadata, other values by value or by identity) therefore run the
same ops, start their submodules in the same order, record the same calls (up to the block's
name) and return outputs of the same metadata. The first such block runs (the *reference*);
each later one is replaced for the probe by its replay: its submodules' call records and
attention shapes copied from the reference's under its own name, an output of the reference's
metadata made in the fake mode. A transformer's ``L`` identical layers cost one layer's probe,
and the probe's answer is the one the full run gives.

A block serves as reference only when its run was *self-contained*: every module it started
for the first time lies inside it, its outputs are tensors or plain values, and it changed no
attribute of a module outside it (a block that hands something to the rest of the model
through shared state is run every time). Blocks with per-layer attributes (a layer index, a
config object of their own) have another structure each and all run, as before.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterator, Mapping, Sequence

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = ["BlockReplay", "ReplayMemo", "block_structure", "call_signature", "replaced_forwards"]

#: ``nn.Module`` bookkeeping in ``__dict__`` read through its own tables (the hook tables,
#: ``_…hooks…``, count by length).
_TABLES = ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set")
#: Plain values, compared by value (anything else by identity: a shared config is the same
#: object in every block, a per-block one differs).
_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)
#: How many self-contained runs of one block structure may become references (each costs a
#: scan of the model's attributes); a structure whose later blocks never match stops there.
_MAX_REFERENCES = 2


def _value(value: Any) -> Hashable:
    """A hashable stand-in for an attribute or argument value (module docstring)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", type(value).__name__, tuple(value.shape), tuple(value.stride()),
                value.storage_offset(), value.dtype, str(value.device), value.requires_grad)
    if isinstance(value, _PLAIN):
        return (type(value).__name__, value)
    if isinstance(value, (tuple, list, frozenset)) and len(value) <= 64:
        return (type(value).__name__, tuple(_value(v) for v in value))
    return ("object", id(value))


def block_structure(block: nn.Module, prefix: str,
                    shapes: Mapping[str, tuple[int, ...]]) -> Hashable:
    """What a block's forward depends on besides its arguments: for each of its modules, its
    class, its attributes (in their order) and hook counts, and its parameters' and buffers'
    shapes (``shapes`` overrides them by full name, as the probe does), dtypes and devices."""
    out = []
    for rel, module in block.named_modules(remove_duplicate=False):
        attrs = tuple((key, len(value) if "hooks" in key and isinstance(value, dict)
                       else _value(getattr(value, "replaced", value)))
                      for key, value in module.__dict__.items() if key not in _TABLES)
        where = f"{prefix}.{rel}." if rel else f"{prefix}."
        state = tuple(
            (name, None) if t is None else
            (name, shapes.get(where + name, t.shape) if shapes else t.shape, t.dtype, t.device)
            for table in (module._parameters, module._buffers) for name, t in table.items())
        out.append((rel, type(module), attrs, len(module._parameters), state))
    return tuple(out)


def call_signature(args: tuple, kwargs: Mapping[str, Any]) -> Hashable:
    """The arguments of a call as the fake run sees them: their structure, tensors by
    metadata, other values by value, an object by identity and its attributes' (and their
    lengths: a cache or a list a block appends to reads as another argument once changed)."""
    leaves, spec = tree_flatten((args, dict(kwargs)))
    return (str(spec), tuple(_value(v) if isinstance(v, (torch.Tensor, *_PLAIN))
                             else (_value(v), _shallow(v)) for v in leaves))


def _shallow(value: Any) -> Hashable:
    """Which object each attribute of ``value`` holds, and the length of a list, dict or set."""
    return tuple((key, id(item), len(item) if isinstance(item, (list, dict, set)) else -1)
                 for key, item in getattr(value, "__dict__", {}).items())


def _outside_state(model: nn.Module, inside: set[int]) -> list[tuple[int, str, int, int]]:
    """The attributes of ``model``'s modules not in ``inside`` (ids): which object each name
    holds and the length of a list, dict or set (what a block could change for the rest)."""
    return [(id(m), key, id(value), len(value) if isinstance(value, (list, dict, set)) else -1)
            for m in model.modules() if id(m) not in inside
            for key, value in m.__dict__.items()]


@contextlib.contextmanager
def replaced_forwards(replacements: Sequence[tuple[nn.Module, Callable[..., Any]]]
                      ) -> Iterator[None]:
    """Each module's ``forward`` replaced by its function while the context lasts; a
    ``forward`` attribute the module had of its own is put back after."""
    patched = [(module, module.__dict__.get("forward")) for module, _ in replacements]
    for module, forward in replacements:
        module.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        for module, before in patched:
            del module.forward
            if before is not None:
                module.forward = before  # type: ignore[method-assign]


@dataclass
class ReplayMemo:
    """The references of the probes of one model, shared by them: the model probed whole,
    with its tensor-parallel local shapes and cut into pipeline stages runs the same blocks on
    the same arguments, so each kind of block runs once for all of them. Valid while the
    model's modules are alive and unchanged (the structures hold object identities): one
    decision of the runtime, not longer."""

    references: dict[tuple[Hashable, Hashable], "_Reference"] = field(default_factory=dict)
    recorded: dict[Hashable, int] = field(default_factory=dict)   # references per structure


@dataclass
class _Reference:
    """What a self-contained block run recorded, names relative to the block."""

    started: list[str]                    # submodules started for the first time, in order
    calls: list[tuple[str, Any]]          # their first-call records, in the order made
    attention: list[Any]                  # the attention shapes recorded during the run
    output: tuple[Any, list[Any]]         # (tree spec, leaves: metadata or plain values)


class BlockReplay:
    """Installs the shortcut on a probe's blocks (module docstring).

    ``started``, ``calls`` and ``attention`` are the probe's own tables (module start order,
    first-call records, attention shapes); ``copy_call(call, order)`` is the probe's record of
    the same call at another start position; ``memo``: references of earlier probes of the
    same model to use and add to (``None``: this probe's own)."""

    def __init__(self, model: nn.Module, blocks: Mapping[str, nn.Module],
                 shapes: Mapping[str, tuple[int, ...]], started: dict[str, int],
                 calls: dict[str, Any], attention: list[Any],
                 copy_call: Callable[[Any, int], Any], memo: ReplayMemo | None = None) -> None:
        self.model, self.started, self.calls, self.attention = model, started, calls, attention
        self.copy_call = copy_call
        owners: dict[int, int] = {}
        for name, block in blocks.items():
            for m in block.modules():
                owners[id(m)] = owners.get(id(m), 0) + 1
        # a module shared by two blocks runs in both under one name: no shortcut for those
        self.blocks = {name: block for name, block in blocks.items()
                       if all(owners[id(m)] == 1 for m in block.modules())}
        self.shapes = shapes
        memo = memo if memo is not None else ReplayMemo()
        self.references, self.recorded = memo.references, memo.recorded

    def installed(self) -> contextlib.AbstractContextManager:
        """Each block's forward goes through :meth:`_call` for the probe's run."""
        return replaced_forwards([(block, self._forward(name, block, block.forward))
                                  for name, block in self.blocks.items()])

    def _forward(self, name: str, block: nn.Module, forward: Callable[..., Any]
                 ) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(name, block, forward, args, kwargs)
        # what the block's ``forward`` attribute held before (its structure reads that)
        call.replaced = block.__dict__.get("forward")  # type: ignore[attr-defined]
        return call

    def _call(self, name: str, block: nn.Module, forward: Callable[..., Any], args: tuple,
              kwargs: dict) -> Any:
        # the block as it is now (a block run before may have changed another's attributes)
        structure = block_structure(block, name, self.shapes)
        key = (structure, call_signature(args, kwargs))
        reference = self.references.get(key)
        if reference is not None:
            return self._replay(name, reference)
        if self.recorded.get(structure, 0) >= _MAX_REFERENCES:
            return forward(*args, **kwargs)
        inside = {id(m) for m in block.modules()}
        before = _outside_state(self.model, inside)
        started, calls, attention = len(self.started), len(self.calls), len(self.attention)
        out = forward(*args, **kwargs)
        reference = self._reference(name, out, started, calls, attention)
        if reference is not None and _outside_state(self.model, inside) == before:
            self.references[key] = reference
            self.recorded[structure] = self.recorded.get(structure, 0) + 1
        return out

    def _reference(self, name: str, out: Any, started: int, calls: int, attention: int
                   ) -> _Reference | None:
        """The run just made as a reference, or ``None`` when it was not self-contained."""
        inner = name + "."
        new_started = list(self.started)[started:]
        new_calls = list(self.calls.items())[calls:]
        if not all(n.startswith(inner) for n in new_started) or \
                not all(n.startswith(inner) for n, _ in new_calls):
            return None
        leaves, spec = tree_flatten(out)
        kept: list[Any] = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                if type(leaf).__name__ not in ("Tensor", "FakeTensor"):
                    return None     # a tensor subclass: run every time
                kept.append(("tensor", tuple(leaf.shape), tuple(leaf.stride()), leaf.dtype,
                             leaf.device))
            elif isinstance(leaf, _PLAIN):
                kept.append(("plain", leaf))
            else:
                return None
        cut = len(inner)
        return _Reference([n[cut:] for n in new_started],
                          [(n[cut:], call) for n, call in new_calls],
                          list(self.attention[attention:]), (spec, kept))

    def _replay(self, name: str, reference: _Reference) -> Any:
        """What running block ``name`` would record and return (module docstring)."""
        for rel in reference.started:
            self.started.setdefault(f"{name}.{rel}", len(self.started))
        for rel, call in reference.calls:
            full = f"{name}.{rel}"
            if full not in self.calls:
                self.calls[full] = self.copy_call(call, self.started[full])
        self.attention.extend(reference.attention)
        spec, kept = reference.output
        leaves = []
        for kind, *rest in kept:
            if kind == "tensor":   # made in the probe's fake mode: a fake tensor
                shape, stride, dtype, device = rest
                leaves.append(torch.empty_strided(shape, stride, dtype=dtype, device=device))
            else:
                leaves.append(rest[0])
        return tree_unflatten(leaves, spec)
