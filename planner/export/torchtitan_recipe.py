"""Current torchtitan's configuration: a Python function returning ``Trainer.Config``,
selected on the command line with ``--module MODULE --config FUNCTION``.

:func:`render` writes the function from :class:`Settings` (what
:func:`fxplan.export.torchtitan.settings` derives from a plan, for any torchtitan version): it
starts
from torchtitan's own configuration of the model (``llama3_8b()`` …, with its data, optimizer
and schedule) or from a bare ``Trainer.Config()`` when torchtitan has no such model, and sets
the plan's fields one by one (``config.parallelism.tensor_parallel_degree = 4``), so that what
the plan does not decide keeps torchtitan's value. :func:`sections` reads such a function back
with :mod:`ast` (nothing is imported or run) into the ``{section: {key: value}}`` form of a
release TOML, which :func:`fxplan.export.torchtitan.from_sections` reads.
"""

from __future__ import annotations

import ast
from typing import Any

from fxplan.export.errors import ExportError
from fxplan.export.framework_tables import load_table
from fxplan.export.torchtitan_settings import Settings

__all__ = ["FUNCTION", "MODULE", "is_recipe", "render", "sections"]


#: The config function's name, and the module name the command line assumes for the file.
FUNCTION = "fxplan_plan"
MODULE = "fxplan_plan"
#: Activation checkpointing: fxplan's policy → the config class torchtitan applies.
_AC = {"full": "FullAC", "selective": "SelectiveAC"}
_MARK = "# fxplan torchtitan recipe"


def is_recipe(text: str) -> bool:
    """Whether ``text`` is a config function written by :func:`render`."""
    return text.lstrip().startswith(_MARK)


def render(s: Settings) -> str:
    """The Python module text: imports, one config function, the command that runs it."""
    table = load_table("torchtitan")["versions"]["current"]
    imports: dict[str, set[str]] = {"torchtitan.trainer": {"Trainer"}}
    body: list[str] = []
    if s.model is not None:
        name, flavor = s.model
        base = table["base_configs"].get(name, {}).get(flavor)
        if base is not None:
            imports.setdefault(f"torchtitan.models.{name}.config_registry", set()).add(base)
            body.append(f"config = {base}()")
        else:
            body.append("config = Trainer.Config()")
        converters = ""
        if s.fp8:
            imports.setdefault(table["imports"]["Float8LinearConverter"], set()).add(
                "Float8LinearConverter")
            converters = ", converters=[Float8LinearConverter.Config()]"
        if base is None or converters:
            imports.setdefault(f"torchtitan.models.{name}", set()).add("model_registry")
            body.append(f"config.model_spec = model_registry({flavor!r}{converters})")
    else:
        body += ["config = Trainer.Config()",
                 "config.model_spec = None  # torchtitan has no such model: set its ModelSpec"]
        if s.fp8:
            imports.setdefault(table["imports"]["Float8LinearConverter"], set()).add(
                "Float8LinearConverter")
            body.append("fp8 = [Float8LinearConverter.Config()]  # converters for that "
                        "ModelSpec's model_registry(..., converters=fp8)")
    for section, values in (("training", s.training), ("parallelism", s.parallelism)):
        body += [f"config.{section}.{key} = {value!r}" for key, value in values.items()]
    if s.recompute in _AC:
        cls = _AC[s.recompute]
        imports.setdefault(table["imports"][cls], set()).add(cls)
        body.append(f"config.activation_checkpoint = {cls}.Config()")
    else:
        body.append("config.activation_checkpoint = None")
    world = _world(s)
    lines = [f"{_MARK} for torchtitan current ({table['commit'][:12]}, {table['date']})",
             f"# save as {MODULE}.py on the Python path and run on {world} GPUs:",
             f"#   torchrun --nproc_per_node={world} -m torchtitan.train "
             f"--module {MODULE} --config {FUNCTION}"]
    lines += [f"from {module} import {', '.join(sorted(names))}"
              for module, names in sorted(imports.items())]
    lines += ["", "", f"def {FUNCTION}() -> Trainer.Config:"]
    lines += ["    " + line for line in body] + ["    return config", ""]
    return "\n".join(lines)


def _world(s: Settings) -> int:
    p = s.parallelism
    return (p.get("data_parallel_replicate_degree", 1) * p.get("data_parallel_shard_degree", 1)
            * p.get("tensor_parallel_degree", 1) * p.get("pipeline_parallel_degree", 1)
            * p.get("context_parallel_degree", 1))


def sections(text: str) -> dict[str, Any]:
    """``{"training": {...}, "parallelism": {...}, "activation_checkpoint": {"mode": …},
    "model": {"converters": [...]}}`` from a function :func:`render` wrote."""
    try:
        tree = ast.parse(text)
    except SyntaxError as err:
        raise ExportError(f"torchtitan config function: not Python: {err}") from err
    out: dict[str, Any] = {"training": {}, "parallelism": {}, "model": {"converters": []},
                           "activation_checkpoint": {"mode": "selective"}}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            _assignment(node.targets[0], node.value, out)
        elif isinstance(node, ast.Name) and node.id == "Float8LinearConverter" \
                and isinstance(node.ctx, ast.Load):
            out["model"]["converters"] = ["Float8LinearConverter"]
    return out


def _assignment(target: ast.expr, value: ast.expr, out: dict[str, Any]) -> None:
    path = _attribute_path(target)
    if path[:1] != ["config"]:
        return
    if path == ["config", "activation_checkpoint"]:
        cls = _attribute_path(value.func)[0] if isinstance(value, ast.Call) else None
        modes = {v: k for k, v in _AC.items()}
        out["activation_checkpoint"]["mode"] = modes.get(cls or "", "none")
    elif len(path) == 3 and path[1] in ("training", "parallelism"):
        try:
            out[path[1]][path[2]] = ast.literal_eval(value)
        except ValueError:
            raise ExportError(f"torchtitan config function: {'.'.join(path)} is not a "
                              "literal") from None


def _attribute_path(node: ast.expr) -> list[str]:
    """``config.parallelism.tensor_parallel_degree`` → its names, outermost first."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.append(node.id)
    return names[::-1]
