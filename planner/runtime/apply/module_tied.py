"""A weight tied under several names, on the module-level path.

One Parameter ``W`` reachable as ``model.embed_tokens.weight`` and ``lm_head.weight`` goes by its
first name (:func:`tied_aliases`), as in the plan and the checkpoint. Under tp it takes one
layout for all its users (:func:`tied_layout`) and, after ``parallelize_module`` gave each user
its own DTensor, every alias is pointed back at the first one's (:func:`retie`), so autograd
sums both uses as in one process. Under pp the stages whose cut keeps a user hold a copy
(:func:`tied_users`), whose gradients :class:`~fxplan.runtime.apply.tied.TiedGradSync` sums.
The decision and the build that use these: :mod:`fxplan.runtime.apply.module`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Mapping

from torch import nn

from fxplan.runtime.styles.tp_styles import NotExpressible, tp_token

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan
    from fxplan.runtime.apply.probe import ModuleProbe

__all__ = ["retie", "tied_aliases", "tied_layout", "tied_users"]


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """Each name of a parameter reachable under several names → its first name (the one
    ``named_parameters()`` keeps, the plan's and the checkpoint's)."""
    names: dict[int, list[str]] = defaultdict(list)
    for fqn, param in model.named_parameters(remove_duplicate=False):
        names[id(param)].append(fqn)
    return {alias: group[0] for group in names.values() if len(group) > 1 for alias in group}


def tied_layout(plan: "Plan", aliases: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Which name's planned placement each name of a tied weight takes (all of a weight's
    names the same one), and a fallback line per weight whose uses were planned apart.

    Only the names the plan places count (an alias absent from it follows the others). They
    agree on the tp axis → the first name. Otherwise the one sharded layout among them
    (replicated uses then run sharded too: one Parameter has one layout); two different
    sharded layouts → :class:`NotExpressible`."""
    groups: dict[str, list[str]] = defaultdict(list)
    for alias, first in aliases.items():
        groups[first].append(alias)
    read_as: dict[str, str] = {}
    notes: list[str] = []
    for first, names in groups.items():
        tokens = {n: tp_token(plan, n, 2) for n in names if n in plan.placements.params}
        sharded = sorted({t for t in tokens.values() if t != "R"})
        chosen = next(iter(tokens), first)
        if len(set(tokens.values())) > 1:
            if len(sharded) > 1:
                raise NotExpressible(f"tied weight {first!r} is planned {tokens} over tp: one "
                                     "Parameter cannot take two sharded layouts")
            chosen = next(n for n in tokens if tokens[n] == sharded[0])
            notes.append(f"[module-apply] tied weight {first!r} is planned "
                         + ", ".join(f"{t} for {n!r}" for n, t in tokens.items())
                         + f" over tp; one Parameter has one layout: every use runs "
                         f"{sharded[0]}")
        read_as.update({n: chosen for n in names})
    return read_as, notes


def tied_users(plan: "Plan", probe: "ModuleProbe", aliases: Mapping[str, str]
               ) -> dict[str, list[int]]:
    """First name of each tied weight → the stages whose cut keeps a user of it: a user in
    the pre part lives on stage 0, in the post part on the last stage; one in a block is
    refused (a stage copy per block would need its own group)."""
    last = len(plan.stages) - 1
    users: dict[str, set[int]] = defaultdict(set)
    for alias, first in aliases.items():
        owner = alias.rpartition(".")[0]
        if any(owner == m or owner.startswith(f"{m}.") for m in probe.pre):
            users[first].add(0)
        elif any(owner == m or owner.startswith(f"{m}.") for m in probe.post):
            users[first].add(last)
        else:
            raise NotExpressible(f"tied weight {alias!r} is used by {owner!r}, neither the "
                                 "embedding nor the head: a pipeline cut cannot keep it tied")
    return {k: sorted(v) for k, v in users.items()}


def retie(module: nn.Module, aliases: Mapping[str, str]) -> None:
    """Point every alias of a tied weight in ``module`` at the parameter of the first of its
    names present here (``parallelize_module`` gave each user its own DTensor)."""
    kept: dict[str, nn.Parameter] = {}
    for name in aliases:  # in named_parameters order: the first name comes first
        owner, _, leaf = name.rpartition(".")
        try:
            holder = module.get_submodule(owner) if owner else module
        except AttributeError:
            continue
        param = holder._parameters.get(leaf)
        if param is None:
            continue
        shared = kept.setdefault(aliases[name], param)
        if shared is not param:
            if getattr(shared, "placements", None) != getattr(param, "placements", None):
                raise RuntimeError(f"tied weight {name!r} is laid out {param.placements} by "
                                     f"its style, its first name {aliases[name]!r} "
                                     f"{shared.placements}")
            holder._parameters[leaf] = shared
