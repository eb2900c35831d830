"""Parameters: the model's table (tied names found by identity) and each node's own."""

from __future__ import annotations

import torch
import torch.fx

from fxplan.passes.node_info import ParamInfo, cast_dtype


def param_table(model: torch.nn.Module, dtype: torch.dtype | None = None
                ) -> dict[str, ParamInfo]:
    """Every parameter name of ``model``, aliases included.

    Two names that hold the same ``Parameter`` object are tied (GPT's LM head and token
    embedding): the first registered name is canonical, the later ones get ``tied_to``.
    ``dtype`` (if given) replaces the dtype of floating parameters, as capture runs them.
    """
    table: dict[str, ParamInfo] = {}
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        cast = cast_dtype(p.dtype, dtype)
        size = torch.empty((), dtype=cast).element_size()
        table[name] = ParamInfo(name, tuple(p.shape), cast, p.numel() * size,
                                tied_to=first.get(id(p)))
        first.setdefault(id(p), name)
    return table


def node_params(gm: torch.fx.GraphModule, node: torch.fx.Node,
                table: dict[str, ParamInfo]) -> list[str]:
    """Parameter names ``node`` owns: all of a ``call_module``'s, a ``get_attr``'s target."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        return [f"{node.target}.{n}" for n, _ in module.named_parameters(remove_duplicate=False)]
    if node.op == "get_attr" and node.target in table:
        return [str(node.target)]
    return []


def is_parameter(gm: torch.nn.Module, target: str) -> bool:
    """Whether ``target`` (a ``get_attr`` target) names a ``Parameter`` of ``gm``."""
    owner, _, attr = target.rpartition(".")
    try:
        return attr in gm.get_submodule(owner)._parameters
    except AttributeError:
        return False


def unique_numel(names: list[str], table: dict[str, ParamInfo]) -> int:
    """Elements of the distinct parameters behind ``names`` (a tied pair counts once)."""
    canonical = {table[n].tied_to or n for n in names if n in table}
    return sum(table[n].numel for n in canonical)
