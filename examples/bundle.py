"""What a resolved model spec hands to capture: :class:`ModelBundle` and :class:`InputSpec`.

A bundle knows how to build its model on any device (``"meta"`` by default, so that a 1T
parameter model costs nothing) and how to describe example inputs as shapes and dtypes, so
that capture can make fake tensors for them without allocating.
"""

from __future__ import annotations

from fxplan.core.errors import UserError

from dataclasses import dataclass, field
from typing import Any, Callable

import torch


class ModelSpecError(UserError, ValueError):
    """A model spec, model config or input request that cannot be honoured; the message says
    what was wrong and what is allowed (re-exported by :mod:`examples.model_spec`)."""


@dataclass(frozen=True)
class InputSpec:
    """Shape and dtype of one example input; capture turns it into a fake tensor. ``high``:
    for integer inputs whose values index something (token ids, class ids), the exclusive
    upper bound of their values when it is known (synthetic data draws from ``[0, high)``)."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    high: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if any(d < 0 for d in self.shape):
            raise ValueError(f"InputSpec shape {self.shape} has a negative dimension")

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "InputSpec":
        """The spec of an existing tensor (any device, meta included)."""
        return cls(tuple(tensor.shape), tensor.dtype)

    def __str__(self) -> str:
        dims = "×".join(str(d) for d in self.shape) or "scalar"
        return f"{dims} {str(self.dtype).removeprefix('torch.')}"


#: ``build()`` makes the model on the current default device; ``inputs(batch, seq, with_targets)``
#: returns the example inputs, keyed by ``forward`` parameter name.
BuildFn = Callable[[], torch.nn.Module]
InputsFn = Callable[[int, "int | None", bool], "dict[str, InputSpec]"]


@dataclass(frozen=True)
class ModelBundle:
    """A model ready for capture: its name, family, config, builder and example inputs.

    ``config`` is the model's config dataclass (``None`` for a user file; a
    ``transformers`` config for ``hf:``). ``capture_method`` is how capture should obtain
    the graph by default: ``"auto"`` (``symbolic_trace``, falling back to ``torch.export``)
    or ``"export"`` (Hugging Face models). ``loss``: the training loss ``(output, targets) ->
    scalar`` when the bundle fixes one (a user file: :mod:`fxplan.examples.user_loss`): capture
    traces the forward followed by ``loss`` on the ``targets`` input, unless the forward takes
    ``targets`` itself and ``loss_outside`` is false (the forward's own loss is then priced).
    """

    name: str
    family: str
    config: Any
    _build: BuildFn = field(repr=False, compare=False)
    _inputs: InputsFn = field(repr=False, compare=False)
    capture_method: str = "auto"
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = field(
        default=None, repr=False, compare=False)
    loss_outside: bool = False

    def build(self, device: str | torch.device = "meta") -> torch.nn.Module:
        """Construct the model with its parameters on ``device`` (``"meta"``: no memory)."""
        with torch.device(device):
            return self._build()

    def example_inputs(self, batch: int, seq: int | None = None, *,
                       with_targets: bool = True) -> dict[str, InputSpec]:
        """Shapes and dtypes of the forward inputs for ``batch`` samples.

        ``seq`` overrides the sequence length of sequence models (at most the configured
        one); ``with_targets=True`` adds the labels so that the forward ends in the loss.
        """
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ModelSpecError(f"{self.name}: batch must be a positive integer, got {batch!r}")
        try:
            return self._inputs(batch, seq, with_targets)
        except ModelSpecError:
            raise
        except ValueError as err:
            raise ModelSpecError(f"{self.name}: {err}") from err
