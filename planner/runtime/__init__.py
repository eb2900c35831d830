"""The runtime: a Plan applied on the current process group (see ``docs/runtime.md``).

``apply_plan(model, plan, inputs)`` returns this process's :class:`ShardedModule`
(``train_step``, ``optimizer``, ``state_dict``/``save``/``load``, ``.plan``); the worker that
``fxplan launch`` starts under torchrun is :mod:`fxplan.worker`.
"""

from fxplan.runtime.apply.graph import apply_plan, staged_program
from fxplan.runtime.apply.build import meta_parameters
from fxplan.runtime.apply.sharded_module import ShardedModule

__all__ = ["apply_plan", "staged_program", "meta_parameters", "ShardedModule"]
