"""The loss a model from a user file is trained on, and the targets it is trained against.

**The loss.** A user file may define ``loss(outputs, batch)``: training minimises what it
returns (a scalar tensor). ``outputs`` is the tensor the forward returns
(:func:`fxplan.core.model_output.model_output`: the tensor itself, ``.logits``, or the first
item of a tuple); ``batch`` is a dict holding the batch's ``targets`` (the inputs are not in it:
on a pipeline the last stage, which computes the loss, does not hold them). Without it the
default loss (:func:`default_loss`) is the mean cross-entropy over the output's last dimension
for integer targets,

    L = −(1/N) Σ_i log softmax(z_i)[y_i],   z = outputs.reshape(−1, C),  y = targets.reshape(−1),

(next-token prediction for a language model's ``(b, t, V)`` logits, classification for a
classifier's ``(b, C)``), and the mean squared error for floating-point targets.

**The targets.** ``build()`` may name them: a ``targets`` entry of its example inputs (a tensor
or an ``InputSpec``) fixes their shape and dtype, the batch dimension replaced. Otherwise they are
derived from what the forward returns when run without targets (on ``meta``: nothing allocated):
integer class ids of the output's shape less its last dimension, ``0 ≤ y < C``. A model fed token
ids alone, ``(b, t)``, is a language model: its targets are token ids of the same shape (the next
tokens), so its output must be every position's logits ``(b, t, V)``; a ``forward(idx)`` that
returns only the last position's (an inference path) is refused here, at capture, not by every
rank at launch. With the default loss the shapes are checked the same way when ``build()``
names the targets.

**A forward that takes the targets.** When the forward has a ``targets`` parameter and the file
defines no ``loss``, the forward's own loss is the training loss (nanoGPT's
``forward(idx, targets=None)``, which returns ``(logits, loss)`` given targets and the last
position's logits without): capture passes the targets to it and prices the loss it computes,
and training feeds it the targets and minimises the loss it returns
(:mod:`fxplan.runtime.train.fed_targets`). Its targets are ``build()``'s, else the token ids'
shape for a model fed token ids alone, else class ids derived from its output; run with them
(on ``meta``) it must return a scalar loss (:func:`fxplan.core.model_output.returned_loss`), or
capture refuses it. In every other case capture traces the forward followed by the loss, so the
loss training minimises is in the graph the search prices either way.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

import torch
from torch.nn import functional as F

from fxplan.core.model_output import describe_output, model_output, returned_loss
from fxplan.examples.bundle import InputSpec, ModelSpecError

__all__ = ["LossShapeError", "default_loss", "loss_for", "file_loss", "training_targets",
           "TARGETS"]

#: The name of the targets among a batch's tensors (and of the forward parameter that takes them).
TARGETS = "targets"

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class LossShapeError(ModelSpecError):
    """The model's output does not fit the loss training computes on it."""


def cross_entropy(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the last dimension of ``output`` (integer ``targets``)."""
    return F.cross_entropy(output.reshape(-1, output.size(-1)), targets.reshape(-1))


def mean_squared_error(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean squared error (floating-point ``targets`` of the output's shape)."""
    return F.mse_loss(output, targets)


def loss_for(targets_dtype: torch.dtype) -> LossFn:
    """The default loss for targets of ``targets_dtype`` (chosen before tracing: under
    ``symbolic_trace`` the dtype of a proxy cannot be branched on)."""
    return mean_squared_error if targets_dtype.is_floating_point else cross_entropy


def default_loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The default loss (module docstring): cross-entropy for integer targets, else MSE."""
    return loss_for(targets.dtype)(output, targets)


def file_loss(function: Callable[..., Any], origin: str) -> LossFn:
    """A file's ``loss(outputs, batch)`` as the trainer calls a loss, ``(output, targets)``."""
    try:
        inspect.signature(function).bind(None, None)
    except TypeError:
        raise ModelSpecError(f"{origin}: loss{inspect.signature(function)} must take two "
                             "arguments, loss(outputs, batch)") from None

    def loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return function(output, {TARGETS: targets})
    loss.__qualname__ = loss.__name__ = getattr(function, "__name__", "loss")
    return loss


def training_targets(model: torch.nn.Module, inputs: Mapping[str, InputSpec],
                     given: InputSpec | None, origin: str, *, checked: bool,
                     fed: bool = False) -> InputSpec:
    """The targets of a batch of ``inputs`` (module docstring): ``given`` (its batch dimension
    already replaced), else derived from the output of ``model`` (on ``meta``) run on ``inputs``.
    ``checked``: the default loss is used, so the output must fit it. ``fed``: the forward
    takes the targets and is trained on the loss it returns (:func:`_fed_targets`)."""
    tokens = _token_input(inputs)
    if fed:
        return _fed_targets(model, inputs, given, tokens, origin)
    if given is not None and not checked:   # the file's loss: the shapes are its own affair
        try:
            return _classes(_meta_output(model, inputs, origin), given)
        except ModelSpecError:
            return given
    output = _meta_output(model, inputs, origin)
    if given is not None:
        _check(output, given, tokens, origin)
        return _classes(output, given)
    if output.ndim < 2 or not output.dtype.is_floating_point:
        raise LossShapeError(
            f"{origin}: forward returns {_shape(output)} {str(output.dtype).removeprefix('torch.')}"
            f"; the default loss needs floating-point scores of shape (…, classes) to derive "
            f"integer targets from. Name the targets in build()'s inputs (a 'targets' entry) "
            f"and, unless they are class ids of the output's shape less its last dimension, "
            f"define loss(outputs, batch) in the file.")
    derived = InputSpec(tuple(output.shape[:-1]), torch.int64, high=int(output.shape[-1]))
    if tokens is not None:
        _check(output, InputSpec(tokens.shape, tokens.dtype), tokens, origin)
        return InputSpec(tokens.shape, tokens.dtype, high=int(output.shape[-1]))
    return derived


def _fed_targets(model: torch.nn.Module, inputs: Mapping[str, InputSpec],
                 given: InputSpec | None, tokens: InputSpec | None, origin: str) -> InputSpec:
    """The targets of a forward that takes them and returns its own loss: ``given``, else a
    language model's next tokens (the token ids' shape), else class ids derived from the
    output without targets; the forward, run on ``meta`` with them, must return a scalar loss
    (:func:`fxplan.core.model_output.returned_loss`). Token and class ids are bounded by the
    class count of the output it returns beside the loss."""
    if given is None and tokens is not None:
        given = InputSpec(tokens.shape, tokens.dtype)
    if given is None:
        given = training_targets(model, inputs, None, origin, checked=False)
    out = _meta_run(model, {**inputs, TARGETS: given}, origin)
    try:
        returned_loss(out)
    except TypeError:
        raise LossShapeError(
            f"{origin}: forward takes targets, so it is trained on the loss it returns when "
            f"given them, but given targets {given.shape} it returns {describe_output(out)}, "
            f"no scalar loss. Return (outputs, loss) with the loss a "
            f"scalar tensor (as nanoGPT's forward(idx, targets)), or define loss(outputs, batch) "
            f"in the file.") from None
    return _classes(model_output(out), given)


def _classes(output: torch.Tensor, targets: InputSpec) -> InputSpec:
    """``targets`` bounded by the output's class count when they are its class ids (integer,
    of the output's shape less its last dimension)."""
    if targets.dtype.is_floating_point or output.ndim < 2 \
            or tuple(output.shape[:-1]) != targets.shape:
        return targets
    return InputSpec(targets.shape, targets.dtype, high=int(output.shape[-1]))


def _token_input(inputs: Mapping[str, InputSpec]) -> InputSpec | None:
    """The one integer ``(b, t)`` input of a model fed token ids alone, else ``None``."""
    specs = [s for k, s in inputs.items() if k != TARGETS]
    if len(specs) == 1 and len(specs[0].shape) == 2 and not specs[0].dtype.is_floating_point:
        return specs[0]
    return None


def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


def _check(output: torch.Tensor, targets: InputSpec, tokens: InputSpec | None,
           origin: str) -> None:
    """The default loss fits ``output`` and ``targets``: integer targets of the output's
    shape less its last dimension, floating ones of its shape."""
    if targets.dtype.is_floating_point:
        if tuple(output.shape) == targets.shape:
            return
        raise LossShapeError(
            f"{origin}: forward returns {_shape(output)} and the targets are "
            f"{targets.shape} floating-point: the default loss (mean squared error) needs the "
            f"two of one shape. Return outputs of the targets' shape, or define "
            f"loss(outputs, batch) in the file.")
    if output.ndim >= 2 and tuple(output.shape[:-1]) == targets.shape \
            and output.dtype.is_floating_point:
        return
    if tokens is not None and targets.shape == tokens.shape:
        raise LossShapeError(
            f"{origin}: forward returns {_shape(output)} for token ids of shape "
            f"{tokens.shape}: training computes the next-token loss over every position, "
            f"which needs logits of shape {(*tokens.shape, 'vocab')}. A forward that returns "
            f"only the last position's logits (an inference path) must return every "
            f"position's for training, or take the targets and return its own loss with them "
            f"(nanoGPT's forward(idx, targets=None) returning (logits, loss): fxplan then "
            f"trains on that loss); or define loss(outputs, batch) in the file.")
    raise LossShapeError(
        f"{origin}: forward returns {_shape(output)} and the targets are {targets.shape} "
        f"integer: the default loss (cross-entropy over the last dimension) needs "
        f"floating-point scores of the targets' shape plus a class dimension, "
        f"{(*targets.shape, 'classes')}. Return such scores, or define loss(outputs, batch) "
        f"in the file.")


def _meta_output(model: torch.nn.Module, inputs: Mapping[str, InputSpec],
                 origin: str) -> torch.Tensor:
    """The tensor ``model`` (built on ``meta``) returns for ``inputs`` without targets
    (:func:`_meta_run`)."""
    return model_output(_meta_run(model, {k: s for k, s in inputs.items() if k != TARGETS},
                                  origin))


def _meta_run(model: torch.nn.Module, inputs: Mapping[str, InputSpec], origin: str) -> Any:
    """What ``model`` (built on ``meta``) returns for ``inputs``: run on ``meta`` tensors,
    else (an op with no meta kernel, FlexAttention's device check) on fake CPU tensors
    (tensors of the output come back on ``meta``); neither allocates."""
    example = {k: torch.zeros(s.shape, dtype=s.dtype, device="meta") for k, s in inputs.items()}
    try:
        with torch.no_grad():
            return model(**example)
    except Exception as err:
        on_meta = err
    try:
        return _fake_run(model, inputs)
    except Exception:
        pass
    raise ModelSpecError(
        f"{origin}: running forward on meta tensors to find the shape of its output failed "
        f"({type(on_meta).__name__}: {str(on_meta).splitlines()[0] if str(on_meta) else ''}); "
        f"the targets of the loss are derived from that shape. Name them in build()'s inputs "
        f"(a 'targets' entry: a tensor or InputSpec of one batch's targets).") from on_meta


def _fake_run(model: torch.nn.Module, inputs: Mapping[str, InputSpec]) -> Any:
    """:func:`_meta_run` on fake CPU tensors: parameters and buffers swapped for fakes of
    their shapes for the one call; the output's tensors returned as ``meta`` tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.utils.stateless import _reparametrize_module
    from torch.utils._pytree import tree_map

    with FakeTensorMode(allow_non_fake_inputs=True):
        state = {name: torch.empty(t.shape, dtype=t.dtype, device="cpu")
                 for name, t in [*model.named_parameters(), *model.named_buffers()]}
        example = {k: torch.zeros(s.shape, dtype=s.dtype, device="cpu")
                   for k, s in inputs.items()}
        with _reparametrize_module(model, state), torch.no_grad():
            out = model(**example)
        return tree_map(lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta")
                        if isinstance(t, torch.Tensor) else t, out)
