"""Imports run one way: shared types → cluster specs, capture → cost model → search → rewrite →
runtime → API/CLI, with the model zoo (``examples``) used only at the top, where model specs
are resolved (``docs/architecture.md``, "Layers").

Every ``import`` and ``from … import`` in the package is read with :mod:`ast` — module level,
inside functions and under ``TYPE_CHECKING`` alike, since a lazy or type-only import that runs
up a layer is still a dependency that runs up — and mapped to the layer of the module it
names. A test fails on any import into a layer its own layer may not use, and on any cycle
among modules (strongly connected components of the import graph).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parents[1]

#: Repository folder → the dotted package it is installed as (pyproject.toml's package-dir).
FOLDERS: dict[str, str] = {
    "planner": "fxplan",
    "cluster_specs": "fxplan.cluster_specs",
    "cost_model": "fxplan.cost_model",
    "passes": "fxplan.passes",
    "examples": "fxplan.examples",
}

#: Components by module prefix (the longest prefix wins), bottom to top.
COMPONENTS: dict[str, str] = {
    "fxplan.core": "core",
    "fxplan.cluster_specs": "cluster_specs",
    "fxplan.passes": "capture",
    "fxplan.examples": "models",
    "fxplan.cost_model": "cost_model",
    "fxplan.sharding": "search",
    "fxplan.intra_op": "search",
    "fxplan.inter_op": "search",
    "fxplan.passes.rewrite": "rewrite",
    "fxplan.runtime": "runtime",
    "fxplan": "api",
    "fxplan.report": "presentation",
    "fxplan.cli": "cli",
}

#: The layers, bottom to top: a component may import the components of the layers below its
#: own. Cluster specs and capture are independent of each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",), ("cluster_specs", "capture"), ("cost_model",), ("search",), ("rewrite",),
    ("runtime",), ("api",), ("presentation",), ("cli",),
)
ALLOWED: dict[str, frozenset[str]] = {}
_below: set[str] = set()
for _layer in LAYERS:
    for _component in _layer:
        ALLOWED[_component] = frozenset(_below)
    _below |= set(_layer)
#: The model zoo (models, presets, the model-spec resolver) uses only the shared types, and
#: only the API/CLI layer uses it: model specs are strings, resolved at the edge.
ALLOWED["models"] = frozenset({"core"})
for _top in ("api", "presentation", "cli"):
    ALLOWED[_top] |= {"models"}

#: Cycles that are the design: none today (the sharding rule registry imports its rules by
#: name through importlib, which is not an import statement).
ALLOWED_CYCLES: list[set[str]] = []


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder, package in FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


MODULES = _modules()


def component(module: str) -> str:
    best = max((p for p in COMPONENTS if module == p or module.startswith(p + ".")), key=len)
    return COMPONENTS[best]


def _imports(module: str, path: Path) -> list[tuple[str, int]]:
    """``(imported fxplan module, line)`` for every import in ``path``; ``from X import y``
    names ``X.y`` when that is a module, else ``X``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            for alias in node.names:
                sub = f"{name}.{alias.name}"
                out.append((sub if sub in MODULES else name, node.lineno))
    return [(name, line) for name, line in out if name == "fxplan" or name.startswith("fxplan.")]


def import_graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    for module, path in MODULES.items():
        graph.add_node(module)
        for target, line in _imports(module, path):
            while target not in MODULES and "." in target:
                target = target.rpartition(".")[0]
            if target != module:
                graph.add_edge(module, target, line=line)
    return graph


GRAPH = import_graph()


def test_every_module_has_a_component() -> None:
    assert component("fxplan.passes.rewrite.base") == "rewrite"
    assert component("fxplan.passes.capture") == "capture"
    assert component("fxplan.inter_op.driver") == "search"
    assert component("fxplan.cli.main") == "cli"
    assert component("fxplan.report.html") == "presentation"
    assert component("fxplan.api") == "api"
    assert {component(m) for m in MODULES} == set(ALLOWED)


def test_no_import_runs_up_a_layer() -> None:
    upward = []
    for source, target, data in GRAPH.edges(data=True):
        a, b = component(source), component(target)
        if a != b and b not in ALLOWED[a]:
            upward.append(f"{MODULES[source].relative_to(REPO)}:{data['line']} "
                          f"({a}) imports {target} ({b})")
    assert not upward, "imports that run up a layer:\n" + "\n".join(sorted(upward))


def test_no_import_cycles() -> None:
    cycles = [c for c in nx.strongly_connected_components(GRAPH) if len(c) > 1]
    unexpected = [sorted(c) for c in cycles if c not in ALLOWED_CYCLES]
    assert not unexpected, f"import cycles: {unexpected}"


def test_the_checker_sees_lazy_and_type_only_imports(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text("from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    from fxplan.runtime import apply\n"
                      "def f():\n    import fxplan.cli.main as m\n"
                      "    from ..core.plan import Plan\n")
    names = {name for name, _ in _imports("fxplan.cost_model.probe", source)}
    assert names == {"fxplan.runtime.apply", "fxplan.cli.main", "fxplan.core.plan"}


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layers_are_ordered(layer: str) -> None:
    """No component may import one that may import it back (the table itself is a DAG)."""
    for other in ALLOWED[layer]:
        assert layer not in ALLOWED[other]


#: Presentation: what renders plans and predictions for people (terminal and HTML reports,
#: pruning reasons, explain, diff, trace, plots). The command line sits above it and calls it;
#: it takes its number formatting from the shared types (``fxplan.core.units``).
PRESENTATION: tuple[str, ...] = ("fxplan.report.terminal", "fxplan.report.html", "fxplan.report.pruning",
                                 "fxplan.report.explain", "fxplan.report.diff", "fxplan.report.trace",
                                 "fxplan.report.plots")


def test_presentation_does_not_import_the_cli() -> None:
    assert set(PRESENTATION) <= set(MODULES)
    upward = [f"{MODULES[source].relative_to(REPO)}:{data['line']} imports {target}"
              for source, target, data in GRAPH.edges(data=True)
              if source in PRESENTATION and (target == "fxplan.cli"
                                             or target.startswith("fxplan.cli."))]
    assert not upward, "presentation modules that import the CLI:\n" + "\n".join(sorted(upward))


def test_the_runtime_takes_its_shared_vocabulary_from_core() -> None:
    """Fallbacks, the pass error and a stage's shapes are the runtime's and the rewrite's
    shared words (``fxplan.core``): the runtime imports ``passes.rewrite`` only where it runs
    the rewrite (the graph path's passes and their placements)."""
    shared = {"fxplan.core.fallbacks", "fxplan.core.pass_error", "fxplan.core.stage_io"}
    assert shared <= set(MODULES)
    for source, path in MODULES.items():
        if component(source) != "runtime":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "fxplan.passes.rewrite"):
                names = {alias.name for alias in node.names}
                assert not names & {"record_fallback", "PassError", "StageIO"}, \
                    f"{path.relative_to(REPO)}:{node.lineno} imports {sorted(names)}"


def _by_name(path: Path) -> list[tuple[str, int]]:
    """``(module, line)`` of every ``importlib.import_module("fxplan…")`` with a literal name."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "import_module" and node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).startswith("fxplan")):
            out.append((str(node.args[0].value), node.lineno))
    return out


def test_imports_by_name_keep_the_layers_and_close_only_the_registry_cycle() -> None:
    """An import through ``importlib`` is an edge too: the sharding registry loads its rule
    modules by name (they import the registry's decorator back), which must stay inside the
    search layer and be the only cycle it closes."""
    dynamic = [(source, target, line) for source, path in MODULES.items()
               for target, line in _by_name(path)]
    assert ("fxplan.sharding.registry", "fxplan.sharding.rules") in {
        (s, t) for s, t, _ in dynamic}
    graph = GRAPH.copy()
    for source, target, line in dynamic:
        assert target in MODULES, f"{MODULES[source].relative_to(REPO)}:{line}: no module {target}"
        a, b = component(source), component(target)
        assert a == b or b in ALLOWED[a], \
            f"{MODULES[source].relative_to(REPO)}:{line} ({a}) loads {target} ({b}) by name"
        graph.add_edge(source, target)
    cycles = [c for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert len(cycles) == 1, cycles
    (cycle,) = cycles
    assert {"fxplan.sharding.registry", "fxplan.sharding.rules"} <= cycle
    assert all(m.startswith("fxplan.sharding") for m in cycle), sorted(cycle)
