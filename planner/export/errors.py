"""``ExportError``: an export target that does not exist, or exported text that cannot be read."""

from __future__ import annotations

from fxplan.core.errors import UserError

__all__ = ["ExportError"]


class ExportError(UserError, ValueError):
    """An unknown export target, or a Megatron/torchtitan/DeepSpeed text that does not parse."""
