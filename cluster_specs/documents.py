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

__all__ = ["BUILTIN_DIR", "MAX_SPEC_BYTES", "read_document"]

_TOO_DEEP = ("nested deeper than the reader follows (about a thousand levels); a cluster spec "
             "is nested a few levels deep")

#: The built-in spec files (``cluster_specs/builtin/*.yaml``).
BUILTIN_DIR = Path(__file__).with_name("builtin")
#: The largest cluster file read: built-in specs are a few KiB and a spec describes device
#: groups and link levels, not devices one by one, so 16 MiB is thousands of times any real
#: one; a larger file (a runaway generator's output) is refused unread instead of being parsed
#: for minutes.
MAX_SPEC_BYTES = 16 * 2**20


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
    text = read_text(path, what="cluster file", max_bytes=MAX_SPEC_BYTES,
                     error=lambda message: ClusterSpecError(source, message=message))
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise ClusterSpecError(source, message=f"not valid JSON: {err}") from None
        except RecursionError:
            raise ClusterSpecError(source, message=_TOO_DEEP) from None
    try:
        return yaml.load(text, Loader=_StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise ClusterSpecError(source, message=_TOO_DEEP) from None
    except yaml.YAMLError as err:
        detail = " ".join(str(err).split())
        raise ClusterSpecError(source, message=f"not valid YAML: {detail}") from None
