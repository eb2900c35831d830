"""A cluster spec as YAML text with a comment on chosen values.

PyYAML writes no comments, and a calibrated spec must say beside each measured number how and
when it was measured. :func:`dump` writes the spec's nested mappings and lists in block style
(lists of scalars in flow style), each scalar formatted by PyYAML itself, and appends
``# comment`` to the line of every path in ``comments`` — a path is the tuple of keys and list
indices from the top (``("levels", 0, "latency_us")``). The text loads back to the same data
(``yaml.safe_load(dump(spec)) == spec``).
"""

from __future__ import annotations

from typing import Any, Mapping

import yaml

__all__ = ["Path", "dump"]

Path = tuple["str | int", ...]


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=10**6).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _is_scalar(value: Any) -> bool:
    return not isinstance(value, (dict, list))


def _comment(line: str, path: Path, comments: Mapping[Path, str]) -> str:
    note = comments.get(path)
    return f"{line}  # {note}" if note else line


def _emit(value: Any, indent: int, path: Path, comments: Mapping[Path, str], out: list[str],
          first_prefix: str | None = None) -> None:
    pad = " " * indent
    if isinstance(value, dict):
        for i, (key, item) in enumerate(value.items()):
            lead = first_prefix if (i == 0 and first_prefix is not None) else pad
            head = f"{lead}{_scalar(key)}:"
            if _is_scalar(item) or (isinstance(item, list) and all(map(_is_scalar, item))) \
                    or item == {}:
                out.append(_comment(f"{head} {_scalar(item)}", (*path, key), comments))
            else:
                out.append(_comment(head, (*path, key), comments))
                _emit(item, indent + 2, (*path, key), comments, out)
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            if _is_scalar(item):
                out.append(_comment(f"{pad}- {_scalar(item)}", (*path, i), comments))
            else:
                _emit(item, indent + 2, (*path, i), comments, out, first_prefix=f"{pad}- ")
        return
    out.append(_comment(f"{pad}{_scalar(value)}", path, comments))


def dump(spec: Mapping[str, Any], comments: Mapping[Path, str] | None = None,
         header: str = "") -> str:
    """``spec`` as YAML with ``comments`` on their paths and ``header`` as leading comments."""
    out = [f"# {line}".rstrip() for line in header.splitlines()]
    _emit(dict(spec), 0, (), comments or {}, out)
    return "\n".join(out) + "\n"
