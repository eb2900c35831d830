"""Models from a user file: ``path/to/model.py:build`` (``:build`` is the default).

``build()`` takes no arguments and returns ``(model, example_inputs)`` where the inputs are a
tensor, a tuple/list of tensors (matched to ``forward``'s parameters in order) or a dict keyed
by parameter name. It is called under ``torch.device(device)``, so tensors it creates without an
explicit device land on ``"meta"`` during capture and cost nothing. ``batch`` replaces the
first dimension of every example input; ``seq`` cannot be set. The file may define
``loss(outputs, batch)``, and a ``targets`` entry of the inputs names the targets; without them
the default loss and targets derived from the output apply (:mod:`fxplan.examples.user_loss`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import torch

from fxplan.examples.bundle import InputSpec, ModelBundle, ModelSpecError
from fxplan.examples.user_loss import (TARGETS, default_loss, file_loss, loss_for,
                                        training_targets)


#: Seconds a model file may take to import (``FXPLAN_IMPORT_TIMEOUT_S`` overrides): importing
#: defines the build function; a file still running after this long loops at import.
IMPORT_TIMEOUT_S = 300.0


class _ImportTimeout(BaseException):
    """Raised in the main thread by the alarm of :func:`_time_limit` (not an ``Exception``, so
    that the file's own ``except Exception`` cannot swallow it)."""


@contextlib.contextmanager
def _time_limit(seconds: float) -> Any:
    """Raise :class:`_ImportTimeout` after ``seconds`` (main thread only; elsewhere no limit)."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def alarm(signum: int, frame: Any) -> None:
        raise _ImportTimeout()
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _import_timeout() -> float:
    raw = os.environ.get("FXPLAN_IMPORT_TIMEOUT_S", "")
    try:
        return float(raw) if raw else IMPORT_TIMEOUT_S
    except ValueError:
        raise ModelSpecError(f"FXPLAN_IMPORT_TIMEOUT_S={raw!r}: expected seconds (a number)") from None


def load_function(path: str, function: str) -> Callable[[], Any]:
    """Import ``path`` as a module and return its ``function``."""
    return _load(path, function)[1]


def _load(path: str, function: str) -> tuple[Any, Callable[[], Any]]:
    """Import ``path`` as a module: ``(module, its function)``."""
    file = Path(path)
    if not file.is_file():
        raise ModelSpecError(f"model file {path!r} does not exist (spec form: "
                             f"path/to/model.py:function)")
    # A stable name (not the per-process salted ``hash``): the module name reaches the graph's
    # fingerprint, which must agree between processes (a plan saved by one, checked by another).
    digest = hashlib.sha256(str(file.resolve()).encode()).hexdigest()[:16]
    module_name = f"fxplan_user_model_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
    limit = _import_timeout()
    try:
        with _time_limit(limit):
            spec.loader.exec_module(module)
    except _ImportTimeout:
        sys.modules.pop(module_name, None)
        raise ModelSpecError(f"importing {path!r} did not finish in {limit:g} s: the file keeps "
                             "running at import (a loop, or work that belongs in the build "
                             "function); set FXPLAN_IMPORT_TIMEOUT_S to allow longer") from None
    except SystemExit as err:
        raise ModelSpecError(f"importing {path!r} failed: the file calls sys.exit({err.code!r}) "
                             "at import; a model file defines its build function and does not "
                             "exit") from None
    except Exception as err:
        raise ModelSpecError(f"importing {path!r} failed: {type(err).__name__}: {err}") from err
    fn = getattr(module, function, None)
    if not callable(fn):
        found = sorted(n for n, v in vars(module).items()
                       if inspect.isfunction(v) and v.__module__ == module_name)
        raise ModelSpecError(f"{path!r} has no function {function!r}; functions defined there: "
                             f"{', '.join(found) or 'none'}")
    return module, fn


def _input_specs(model: torch.nn.Module, inputs: Any, origin: str) -> dict[str, InputSpec]:
    """Name the example inputs after ``forward``'s parameters and keep their shapes/dtypes."""
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if isinstance(inputs, (tuple, list)):
        names = list(inspect.signature(model.forward).parameters)
        if len(inputs) > len(names):
            raise ModelSpecError(f"{origin} returned {len(inputs)} example inputs but forward "
                                 f"takes {len(names)} parameters ({', '.join(names)})")
        inputs = dict(zip(names, inputs))
    if not isinstance(inputs, dict) or not all(isinstance(v, (torch.Tensor, InputSpec))
                                                for v in inputs.values()):
        raise ModelSpecError(f"{origin} must return (model, inputs) with inputs a tensor, a "
                             f"tuple of tensors or a dict of tensors; got {type(inputs).__name__}")
    return {k: v if isinstance(v, InputSpec) else InputSpec.of(v) for k, v in inputs.items()}


def user_file_bundle(path: str, function: str = "build") -> ModelBundle:
    """A bundle whose model and example inputs come from ``function`` in ``path``, and whose
    loss is the file's ``loss(outputs, batch)`` or the default (:mod:`.user_loss`)."""
    module, fn = _load(path, function)
    origin = f"{path}:{function}()"
    own_loss = getattr(module, "loss", None)
    if not inspect.isfunction(own_loss):
        own_loss = None

    def call() -> tuple[torch.nn.Module, dict[str, InputSpec]]:
        try:
            result = fn()
        except ModelSpecError:
            raise
        except SystemExit as err:
            raise ModelSpecError(f"{origin} called sys.exit({err.code!r}); expected it to "
                                 "return (model, example_inputs)") from None
        except Exception as err:
            raise ModelSpecError(f"{origin} raised {type(err).__name__}: {err} (in {path}; "
                                 "expected it to return (model, example_inputs))") from err
        if not (isinstance(result, tuple) and len(result) == 2
                and isinstance(result[0], torch.nn.Module)):
            raise ModelSpecError(f"{origin} must return (model, example_inputs); got "
                                 f"{type(result).__name__}")
        return result[0], _input_specs(result[0], result[1], origin)

    cache: dict[str, Any] = {}

    def built() -> tuple[torch.nn.Module, dict[str, InputSpec]]:
        if "specs" not in cache:
            with torch.device("meta"):
                cache["model"], cache["specs"] = call()
        return cache["model"], cache["specs"]

    def inputs(batch: int, seq: int | None, with_targets: bool) -> dict[str, InputSpec]:
        model_meta, specs = built()
        own = {s.shape[1] for s in specs.values() if len(s.shape) > 1}
        if seq is not None and seq not in own:  # its own length (a plan's stored seq) is fine
            raise ModelSpecError(f"{origin} fixes its own input shapes; seq cannot be set "
                                 f"(its inputs' dim 1: {', '.join(map(str, sorted(own))) or 'none'})")
        sized = {k: InputSpec((batch, *s.shape[1:]) if s.shape else s.shape, s.dtype, s.high)
                 for k, s in specs.items()}
        given = sized.pop(TARGETS, None)
        key = ("targets", batch)
        if key not in cache:
            fed = own_loss is None and TARGETS in inspect.signature(model_meta.forward).parameters
            cache[key] = training_targets(model_meta, sized, given, origin,
                                          checked=own_loss is None, fed=fed)
        targets = cache[key]
        cache["dtype"] = targets.dtype
        token = [k for k, s in sized.items() if s.shape == targets.shape
                 and not s.dtype.is_floating_point and targets.high is not None]
        for name in token:   # a language model's token ids span its vocabulary
            sized[name] = InputSpec(sized[name].shape, sized[name].dtype, targets.high)
        return {**sized, TARGETS: targets} if with_targets else sized

    def loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The file's loss, else the default for the targets' dtype (known from their spec:
        under ``symbolic_trace`` ``targets`` is a proxy whose dtype cannot be branched on)."""
        if own is not None:
            return own(output, targets)
        dtype = targets.dtype if isinstance(targets, torch.Tensor) else cache.get("dtype")
        return default_loss(output, targets) if dtype is None else loss_for(dtype)(output, targets)

    own = file_loss(own_loss, f"{path}: loss") if own_loss is not None else None
    return ModelBundle(name=f"{path}:{function}", family="file", config=None,
                       _build=lambda: call()[0], _inputs=inputs, loss=loss,
                       loss_outside=own_loss is not None)
