"""Errors the command line reports as a one-paragraph message instead of a traceback."""

from __future__ import annotations

import importlib


class UserError(Exception):
    """Something the user can fix: the message says what was wrong and what was expected."""


#: ``(module, class name)`` of each package's user-facing error type. A package adds its own
#: here; the CLI imports them lazily so that a verb never pays for packages it does not use.
_USER_ERRORS: tuple[tuple[str, str], ...] = (
    ("cluster_specs.errors", "ClusterSpecError"),
    ("examples.model_spec", "ModelSpecError"),
    ("passes.capture", "CaptureError"),
    ("cost_model.config", "CostModelError"),
)


def user_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [UserError, FileNotFoundError]
    for module_name, class_name in _USER_ERRORS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        types.append(getattr(module, class_name))
    return tuple(types)
