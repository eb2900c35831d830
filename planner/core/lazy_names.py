"""A package's public names imported on first access (PEP 562 module ``__getattr__``).

``__getattr__ = lazy_names(__name__, {"name": "module.that.defines.it", …}, globals())`` in a
package's ``__init__``: ``package.name`` imports its module the first time it is read and keeps
the value in the package's namespace, so later reads are plain attribute look-ups. Importing
the package itself, or one of its leaf modules, then costs nothing of what the public names
need (torch, OR-Tools, the graph rewrite).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping, MutableMapping

__all__ = ["lazy_names"]


def lazy_names(package: str, public: Mapping[str, str],
               namespace: MutableMapping[str, Any]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package`` for the names in ``public`` (name -> module)."""

    def __getattr__(name: str) -> Any:
        module = public.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    __getattr__.__doc__ = f"Import a public name of {package} on first access (PEP 562)."
    return __getattr__
