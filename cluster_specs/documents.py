"""Reading cluster documents: the built-in spec folder and a strict YAML/JSON reader.

YAML is read with a ``SafeLoader`` (no Python objects are built from tags) that also refuses a
key given twice in one mapping; JSON and YAML syntax errors become
:class:`~fxplan.cluster_specs.errors.ClusterSpecError` with the position.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from fxplan.cluster_specs.errors import ClusterSpecError
from fxplan.core.files import read_text

__all__ = ["BUILTIN_DIR", "read_document"]

#: The built-in spec files (``cluster_specs/builtin/*.yaml``).
BUILTIN_DIR = Path(__file__).with_name("builtin")


class _StrictSafeLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                mark = key_node.start_mark
                raise yaml.constructor.ConstructorError(
                    None, None, f"found the key {key!r} twice in one mapping", mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_document(path: Path, source: str) -> Any:
    """Parse a YAML or JSON file; syntax errors become ``ClusterSpecError`` with the position."""
    text = read_text(path, what="cluster file",
                     error=lambda message: ClusterSpecError(source, message=message))
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise ClusterSpecError(source, message=f"not valid JSON: {err}") from None
    try:
        return yaml.load(text, Loader=_StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        detail = " ".join(str(err).split())
        raise ClusterSpecError(source, message=f"not valid YAML: {detail}") from None
