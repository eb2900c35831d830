"""Forward FLOPs of each op, as short registered rules (a multiply-add counts 2 FLOPs).

Matrix products (what Megatron's formulas count):

- ``matmul``/``bmm``/``mm``/``@``/``grouped_mm`` (experts of a mixture, Hugging Face's
  Mixtral/Qwen-MoE): ``2·numel(out)·K`` with ``K`` the contracted size.
- ``addmm``/``baddbmm``: the product plus ``numel(out)`` for the added term.
- ``linear``: ``2·M·N·K`` (+ ``M·N`` with a bias), ``M·N = numel(out)``, ``K`` = in features.
- ``scaled_dot_product_attention``: ``QKᵀ`` and ``P·V``, ``2·B·Lq·Lk·E + 2·B·Lq·Lk·Ev``
  (B: all batch and head dimensions of the query); the full square, causal or not, as
  Megatron counts it; softmax and scaling inside are left out.
- ``conv``: ``2·numel(out)·(C_in/groups)·Πkernel`` (+ ``numel(out)`` with a bias).

Everything else, by convention (memory-bound, priced by bytes in the cost model):
elementwise ops 1 FLOP per output element (``gelu``/``silu`` included), copies and casts 0,
dropout 1/element, ``layer_norm``/``group_norm`` 5/element, ``rms_norm``/``batch_norm``
4/element, ``softmax``/``log_softmax`` 5/element, reductions and pooling 1 per input
element (``topk``/``sort`` included), ``cross_entropy`` 5 per logit, views, embedding
lookups and the index copies of a mixture of experts' dispatch (``one_hot``,
``index_copy``, ``scatter``) 0; so are :mod:`examples.models.moe`'s traced helpers
(``expert_capacity``, an int; ``add_auxiliary_loss``, ``x`` passed on).
"""

from __future__ import annotations

import math

from fxplan.passes.analyses.ops import OpCall, nbytes, register, tensors

# --- matrix products ---------------------------------------------------------------------


@register("matmul", "bmm", "mm", "grouped_mm", "grouped_mm_fallback", op_class="matmul")
def matmul(call: OpCall) -> int:
    """``2·numel(out)·K``; ``K`` = last dim of the first operand (``grouped_mm``, and
    ``transformers``' ``grouped_mm_fallback`` where torch has no kernel for the dtype: tokens
    ``[T, K]`` against experts ``[E, K, N]``, each row by its group's matrix: ``2·T·N·K``)."""
    a = call.args[0]
    return 2 * call.out_numel * a.shape[-1]


@register("addmm", "baddbmm", "addbmm", op_class="matmul")
def add_matmul(call: OpCall) -> int:
    """``β·C + α·A@B``: ``2·numel(out)·K + numel(out)``."""
    a = call.arg(1, "batch1") if call.key != "addmm" else call.arg(1, "mat1")
    return 2 * call.out_numel * a.shape[-1] + call.out_numel


@register("linear", op_class="matmul")
def linear(call: OpCall) -> int:
    """``y = x·Wᵀ + b``: ``2·numel(y)·in_features`` (+ ``numel(y)`` with a bias)."""
    weight, bias = call.param("weight", 1), call.param("bias", 2)
    return 2 * call.out_numel * weight.shape[-1] + (call.out_numel if bias is not None else 0)


@register("scaled_dot_product_attention", "scaled_dot_product_flash_attention",
          "scaled_dot_product_flash_attention_for_cpu", "scaled_dot_product_efficient_attention",
          "scaled_dot_product_cudnn_attention", op_class="attention")
def sdpa(call: OpCall) -> int:
    """``2·(B·Lq)·Lk·(E + Ev)``: the ``QKᵀ`` and ``P·V`` products."""
    q, k, v = call.arg(0, "query"), call.arg(1, "key"), call.arg(2, "value")
    rows = q.numel() // q.shape[-1]  # B·heads·Lq
    return 2 * rows * k.shape[-2] * (q.shape[-1] + v.shape[-1])


@register("conv", "conv1d", "conv2d", "conv3d", op_class="conv")
def conv(call: OpCall) -> int:
    """``2·numel(out)·(C_in/groups)·Πkernel`` (+ ``numel(out)`` with a bias)."""
    weight, bias = call.param("weight", 1), call.param("bias", 2)
    per_output = math.prod(weight.shape[1:])
    return 2 * call.out_numel * per_output + (call.out_numel if bias is not None else 0)


# --- memory-bound ops --------------------------------------------------------------------


def _embedding_bytes(call: OpCall) -> int:
    """Only the gathered rows of the table are read, plus the indices — never the whole
    table, whether it is a module parameter (``nn.Embedding``) or an argument
    (``F.embedding(idx, weight)``)."""
    # F.embedding(input, weight) and aten.embedding(weight, indices): the integer operand
    index = next((t for t in tensors(call.args[:2]) if not t.is_floating_point()),
                 call.arg(0, "input"))
    return call.out_numel * call.outputs[0].element_size() + sum(map(nbytes, tensors(index)))


@register("embedding", op_class="embedding", bytes_read=_embedding_bytes)
def zero(call: OpCall) -> int:
    """No arithmetic."""
    return 0


def _per_output(factor: int):
    return lambda call: factor * call.out_numel


def _per_input(factor: int):
    return lambda call: factor * call.in_numel


register("add", "sub", "mul", "div", "neg", "pow", "rsqrt", "sqrt", "exp", "log", "abs",
         "tanh", "sigmoid", "relu", "gelu", "silu", "masked_fill", "where", "clamp", "maximum",
         "minimum", "reciprocal", "sin", "cos", "floor_divide", "remainder", "eq", "ne", "lt",
         "le", "gt", "ge", "bitwise_not", "logical_not", "logical_and", "logical_or", "triu",
         "tril", "rsub", "diff", "and", "or", "xor", "bitwise_and", "bitwise_or", "erf",
         op_class="elementwise")(_per_output(1))
register("contiguous", "clone", "cat", "concat", "stack", "to", "float", "half", "bfloat16",
         "double", "type", "type_as", "repeat", "repeat_interleave", "copy", "to_copy",
         "index", "gather", "index_select", "lift_fresh_copy", "pad", "constant_pad_nd",
         "one_hot", "index_copy", "index_add", "scatter", "scatter_add", "index_put",
         op_class="elementwise")(zero)
register("dropout", "dropout1d", "dropout2d", "native_dropout", op_class="dropout")(_per_output(1))
register("layer_norm", "group_norm", "native_layer_norm", "native_group_norm",
         op_class="norm")(_per_input(5))
register("rms_norm", "batch_norm", "fused_rms_norm", "native_batch_norm",
         op_class="norm")(_per_input(4))
register("softmax", "log_softmax", op_class="softmax")(_per_input(5))
register("sum", "mean", "amax", "amin", "max", "min", "var", "std", "norm", "argmax", "argmin",
         "logsumexp", "cumsum", "topk", "sort", "histc", op_class="reduction")(_per_input(1))
register("max_pool", "avg_pool", "adaptive_avg_pool", "adaptive_max_pool", "max_pool2d",
         "avg_pool2d", "adaptive_avg_pool2d", op_class="pool")(_per_input(1))
register("cross_entropy", "cross_entropy_loss", op_class="loss")(_per_input(5))
register("nll_loss", "nll_loss_forward", "nll_loss2d", "mse_loss", "l1_loss",
         op_class="loss")(_per_input(2))
register("view", "reshape", "transpose", "permute", "t", "flatten", "unflatten", "unsqueeze",
         "squeeze", "expand", "expand_as", "narrow", "split", "chunk", "unbind", "getitem",
         "select", "identity", "view_as", "movedim", "swapaxes", "slice", "alias",
         "unsafe_view", "detach", "split_with_sizes", "as_strided", op_class="view")(zero)
register("placeholder", "get_attr", "output", "size", "dim", "getattr", "assert_is_none",
         "assert", "arange", "zeros", "ones", "full", "empty", "zeros_like", "ones_like",
         "full_like", "empty_like", "tensor", "new_ones", "new_zeros", "new_empty",
         "new_full", "scalar_tensor", "empty_strided", "sym_size",
         "expert_capacity", op_class="other")(zero)
# the mixture of experts' hook giving the auxiliary loss its gradient passes x on unchanged
register("add_auxiliary_loss", op_class="view")(zero)
