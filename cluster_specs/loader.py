"""``Cluster.load(spec)``: a built-in name, a file, or either with ``:key=value`` overrides.

Resolution of a spec string ``s``:

1. ``s`` is an existing file → read it (YAML; a ``.json`` file, or any document with a
   ``machines`` key, is a PaddlePaddle cluster description and is imported);
2. otherwise ``s`` splits at its first ``:`` into ``base`` and overrides; ``base`` is a built-in
   name (``cluster_specs/builtin/*.yaml``, or a generated one such as ``local-cpu``) or a file;
3. anything else is an error that lists the built-in names.

Files are read with a ``yaml.SafeLoader`` that also refuses duplicate keys.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from fxplan.cluster_specs.documents import BUILTIN_DIR, read_document
from fxplan.cluster_specs.errors import ClusterSpecError
from fxplan.cluster_specs.local_cpu import GENERATOR_PARAMS, local_cpu_spec
from fxplan.cluster_specs.overrides import apply_overrides, parse_overrides
from fxplan.cluster_specs.schema import validate

#: Built-ins generated at load time: name → (generator, the override keys it takes with the
#: parser of each key's value).
GENERATED: dict[str, tuple[Callable[..., dict[str, Any]],
                           Mapping[str, Callable[[str, Any, str], Any]]]] = {
    "local-cpu": (local_cpu_spec, GENERATOR_PARAMS),
}


def available_specs() -> list[str]:
    """Names of the built-in specs (files and generated), sorted."""
    return sorted({path.stem for path in BUILTIN_DIR.glob("*.yaml")} | set(GENERATED))


def _document_to_spec(document: Any, source: str) -> dict[str, Any]:
    """Our schema, or a PaddlePaddle cluster JSON (recognised by its ``machines`` key)."""
    if isinstance(document, dict) and "machines" in document and "device_groups" not in document:
        from fxplan.cluster_specs.paddle_import import paddle_to_spec

        return paddle_to_spec(document, source)
    return validate(document, source)


def _base_spec(base: str, generator_args: dict[str, Any], source: str) -> dict[str, Any]:
    if base in GENERATED:
        generate, _ = GENERATED[base]
        return validate(generate(**generator_args), f"{source} (generated)")
    builtin = BUILTIN_DIR / f"{base}.yaml"
    if builtin.is_file():
        return validate(read_document(builtin, str(builtin)), str(builtin))
    path = Path(base)
    if path.exists():  # a FIFO or a device is refused by read_document as what it is
        return _document_to_spec(read_document(path, base), base)
    names = available_specs()
    close = [n for n in names if n.startswith(base)] or difflib.get_close_matches(base, names, n=2)
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    looks_like_path = os.sep in base or base.endswith((".yaml", ".yml", ".json"))
    what = "no such file" if looks_like_path else "not a built-in spec name and not a file"
    raise ClusterSpecError(
        source, message=f"found {base!r}: {what}. Expected a path to a cluster file or one of the "
        f"built-in specs: {', '.join(names)}.{hint}",
    )


def load_spec(spec: str | os.PathLike[str]) -> tuple[dict[str, Any], str]:
    """The canonical spec dict for a spec string or path, and its source label."""
    if not isinstance(spec, (str, os.PathLike)):
        raise ClusterSpecError(repr(spec), message=f"found a {type(spec).__name__}, expected a "
                               "cluster spec: a built-in name, a file path, name:key=value,... "
                               "or a Cluster (Cluster.from_dict reads a dict)")
    text = os.fspath(spec)
    if not text.strip():
        raise ClusterSpecError(repr(text), message="found an empty cluster spec, expected a "
                               f"built-in name ({', '.join(available_specs())}), a file path or "
                               "name:key=value,...")
    if Path(text).is_dir():
        raise ClusterSpecError(text, message="is a directory; expected a cluster file (YAML or "
                               "Paddle JSON) or a built-in name")
    if Path(text).exists():  # a regular file; anything else is refused as what it is
        return _document_to_spec(read_document(Path(text), text), text), text
    base, colon, override_text = text.partition(":")
    items = parse_overrides(override_text, text) if colon else []
    params = GENERATED[base][1] if base in GENERATED else {}
    generator_args = {k: params[k](k, v, text) for k, v in items if k in params}
    items = [(k, v) for k, v in items if k not in params]
    canonical = _base_spec(base, generator_args, text)
    if colon:
        canonical = apply_overrides(canonical, items, text)
        canonical["name"] = f"{canonical['name']}:{override_text}"
        canonical = validate(canonical, text)
    return canonical, text

