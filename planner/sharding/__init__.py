"""Sharding rules and strategies: which placements each op can run with on a device mesh.

See ``docs/sharding.md``. Entry point: :func:`node_strategies`; new ops: ``@register_rule``.
"""

from fxplan.sharding.api import NodeStrategies, describe, describe_module, is_tensor_node, node_strategies
from fxplan.sharding.context import OpContext, Operand, op_identity
from fxplan.sharding.einsum import einsum_options
from fxplan.sharding.registry import find_rule, register_rule, replicate_fallback
from fxplan.sharding.strategy import AxisOption, Comm, OpStrategy

__all__ = ["NodeStrategies", "node_strategies", "is_tensor_node", "describe", "describe_module", "OpContext", "Operand",
           "op_identity", "einsum_options", "find_rule", "register_rule", "replicate_fallback",
           "AxisOption", "Comm", "OpStrategy"]
