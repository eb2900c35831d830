"""``fxplan models``: the model specs fxplan knows, grouped, with their sizes.

    fxplan models            tables: presets, Hugging Face presets, families, user files
    fxplan models --json     the same as JSON

Sizes come from the configs (:mod:`fxplan.examples.param_counts`); nothing is built or
captured, so the listing is quick whatever the models' sizes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

#: How a user's own model is named, for the listing.
USER_FILE = {
    "spec": "path/to/model.py:build",
    "description": "build() takes no arguments and returns (model, example_inputs); "
    "':build' is the default function name",
}
#: The other ``hf:`` forms, for the listing.
HF_FORMS = ("hf:<model_type>[:key=value,...] (transformers defaults, e.g. hf:mistral)",
            "hf:path/to/config.json")


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "models", help="list the model presets, families and other model spec forms",
        description="List the model specs MODEL can be: presets (with their parameter counts), "
        "Hugging Face presets (hf:NAME), families with their keys and defaults "
        "(family:key=value,...), and a user file (path/to/model.py:build).")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(func=run)
    return parser


def _shape(family: str, config: Any) -> str:
    """The few numbers that say what a preset is."""
    if family in ("gpt", "llama"):
        text = f"{config.layers} layers, hidden {config.hidden}, {config.heads} heads"
        if family == "llama" and config.kv_heads != config.heads:
            text += f" ({config.kv_heads} KV)"
        return f"{text}, seq {config.seq:,}, vocab {config.vocab:,}"
    if family == "mlp":
        return f"{config.layers} blocks, hidden {config.hidden}, in {config.in_features}"
    if family == "convnet":
        return (f"{config.stages} stages × {config.blocks_per_stage} blocks, width "
                f"{config.width}, {config.image_size}×{config.image_size} images")
    return ""


def collect() -> dict[str, Any]:
    """Everything the listing shows, as plain data (the ``--json`` output)."""
    from fxplan.examples.families import FAMILIES
    from fxplan.examples.hf_presets import HF_PRESETS
    from fxplan.examples.param_counts import family_params, hf_params
    from fxplan.examples.presets import PRESETS

    presets = []
    for name, preset in PRESETS.items():
        config = FAMILIES[preset.family].config_cls(**preset.values)
        presets.append({"name": name, "family": preset.family,
                        "params": family_params(preset.family, config),
                        "shape": _shape(preset.family, config),
                        "description": preset.description})
    hf = [{"name": f"hf:{name}", "model_type": p.model_type, "params": hf_params(p),
           "description": p.description} for name, p in HF_PRESETS.items()]
    families = []
    for name, family in FAMILIES.items():
        defaults = family.config_cls()
        families.append({
            "name": name, "description": family.description,
            "params": family_params(name, defaults),
            "keys": {f.name: getattr(defaults, f.name)
                     for f in dataclasses.fields(family.config_cls)},
        })
    return {"presets": presets, "hf_presets": hf, "hf_forms": list(HF_FORMS),
            "families": families, "user_file": USER_FILE}


def _params_text(params: int | None) -> str:
    from fxplan.core.units import count

    return "–" if params is None else count(params)


def _print(listing: dict[str, Any]) -> None:
    from rich.table import Table

    from fxplan.report.console import console

    out = console()
    table = Table(title="presets (MODEL, or MODEL:key=value,... to change a key)",
                  title_justify="left")
    for column in ("name", "family", "parameters", "shape", "description"):
        table.add_column(column, no_wrap=column == "name", justify="right" if column == "parameters" else "left")
    for row in listing["presets"]:
        table.add_row(row["name"], row["family"], _params_text(row["params"]), row["shape"],
                      row["description"])
    out.print(table)

    table = Table(title="Hugging Face presets (configs only, no weights; needs transformers)",
                  title_justify="left", caption="also: " + "; ".join(listing["hf_forms"]),
                  caption_justify="left")
    for column in ("name", "model type", "parameters", "description"):
        table.add_column(column, no_wrap=column == "name", justify="right" if column == "parameters" else "left")
    for row in listing["hf_presets"]:
        table.add_row(row["name"], row["model_type"], _params_text(row["params"]), row["description"])
    out.print(table)

    table = Table(title="families (family:key=value,..., from these defaults)", title_justify="left")
    for column in ("family", "parameters at defaults", "keys = defaults", "description"):
        table.add_column(column, no_wrap=column == "family")
    for row in listing["families"]:
        keys = ", ".join(f"{k}={v}" for k, v in row["keys"].items())
        table.add_row(row["name"], _params_text(row["params"]), keys, row["description"])
    out.print(table)
    out.print(f"your own model: [bold]{listing['user_file']['spec']}[/bold] — "
              f"{listing['user_file']['description']}")


def run(args: argparse.Namespace) -> int:
    listing = collect()
    if args.json:
        print(json.dumps(listing, indent=2))
    else:
        _print(listing)
    return 0
