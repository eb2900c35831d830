"""The runtime: a Plan applied on the current process group (see ``docs/runtime.md``).

``apply_plan(model, plan, inputs)`` returns this process's :class:`ShardedModule`
(``train_step``, ``optimizer``, ``state_dict``/``save``/``load``, ``.plan``); the worker that
``fxplan launch`` starts under torchrun is :mod:`fxplan.worker`.

The public names are imported on first access (PEP 562): the launcher and the torchrun agent
import ``fxplan.runtime.launch`` only, and importing the package must not pull in the graph
rewrite, dynamo and the cost model on their way to starting the workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fxplan.core.lazy_names import lazy_names

#: public name -> module that defines it
_PUBLIC: dict[str, str] = {
    "apply_plan": "fxplan.runtime.apply.graph",
    "staged_program": "fxplan.runtime.apply.graph",
    "meta_parameters": "fxplan.runtime.apply.build",
    "ShardedModule": "fxplan.runtime.apply.sharded_module",
}

__all__ = ["apply_plan", "staged_program", "meta_parameters", "ShardedModule"]

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.runtime.apply.build import meta_parameters
    from fxplan.runtime.apply.graph import apply_plan, staged_program
    from fxplan.runtime.apply.sharded_module import ShardedModule


__getattr__ = lazy_names(__name__, _PUBLIC, globals())
