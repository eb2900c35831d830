"""Rewrite passes: a Plan and a traced model become the distributed program.

Every pass follows one contract (:mod:`passes.rewrite.base`): ``pass_(gm, plan) ->
PassResult(module, changed)``, errors as :class:`PassError` naming the pass and node. In the order
the runtime runs them: :class:`OutlineLayers`, :class:`SplitStages`, :class:`DistributeParameters`,
:class:`InsertReshards`, :class:`Recompute`; :func:`emit_program` prints the result.
"""

from fxplan.passes.rewrite.base import PassError, PassManager, PassResult, RewritePass
from fxplan.passes.rewrite.distribute import DistributeParameters
from fxplan.passes.rewrite.emit import emit_program
from fxplan.passes.rewrite.layers import OutlineLayers
from fxplan.passes.rewrite.recompute import Recompute
from fxplan.passes.rewrite.reshard import InsertReshards
from fxplan.passes.rewrite.stages import SplitStages, StagedProgram

__all__ = ["PassError", "PassManager", "PassResult", "RewritePass", "DistributeParameters",
           "emit_program", "OutlineLayers", "Recompute", "InsertReshards", "SplitStages",
           "StagedProgram"]
