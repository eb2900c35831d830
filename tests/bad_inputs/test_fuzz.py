"""Random mutations of valid inputs (Hypothesis, derandomized so CI is deterministic): cluster
YAML, plan JSON and config/model/cluster spec strings either load or raise a ``UserError``:
never another exception, never a hang (bounded examples; every parse is linear in the input)."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fxplan.cluster_specs import Cluster
from fxplan.core.config import ParallelConfig
from fxplan.core.errors import UserError
from fxplan.core.plan import Plan

FUZZ = settings(derandomize=True, max_examples=50, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))

BASE_YAML = (Cluster.load("dgx-a100-80g").to_dict())
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10 ** 30, 10 ** 30),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                    st.lists(st.integers(-3, 9), max_size=3))


def _paths(node, prefix=()):
    """Every key path of a nested dict/list document."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, (*prefix, i))


def _mutate(document, data) -> object:
    doc = copy.deepcopy(document)
    paths = [p for p in _paths(doc) if p]
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            action = data.draw(st.sampled_from(["set", "delete", "add"]))
            if action == "delete" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif action == "add" and isinstance(parent, dict):
                parent[data.draw(st.text(max_size=6))] = data.draw(SCALARS)
            else:
                parent[path[-1]] = data.draw(SCALARS)
        except (KeyError, IndexError, TypeError):
            continue
    return doc


def _user_error_or_ok(call) -> None:
    try:
        call()
    except UserError:
        pass


@FUZZ
@given(st.data())
def test_mutated_cluster_yaml(tmp_path_factory, data):
    doc = _mutate(BASE_YAML, data)
    path = tmp_path_factory.mktemp("fuzz") / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    _user_error_or_ok(lambda: Cluster.load(str(path)))


@pytest.fixture(scope="module")
def plan_document(valid_plan):
    return valid_plan


@FUZZ
@given(data=st.data())
def test_mutated_plan_json(plan_document, data):
    doc = _mutate(plan_document, data)
    _user_error_or_ok(lambda: Plan.from_json(json.dumps(doc, default=str)))


TOKENS = st.sampled_from(["dp", "tp", "pp", "mb", "m", "schedule", "zero", "recompute", "sp",
                          "stages", "nodes", "devices", "layers", "hidden", "heads", "=", ",",
                          ":", "/", "|", ".", "-1", "0", "2", "1e300", "nan", "on", "1f1b",
                          "interleaved:2", "a100.memory_gib", "ln_eps", "gpt", "gpt-tiny",
                          "local-cpu", "dgx-a100-80g", "99999999999999999999", " ", "é"])


@FUZZ
@given(st.lists(TOKENS, max_size=12).map("".join))
def test_random_spec_strings(text):
    _user_error_or_ok(lambda: ParallelConfig.parse(text))
    _user_error_or_ok(lambda: Cluster.load(text))
    from fxplan.examples.model_spec import resolve_model

    def resolve():  # resolving a spec builds nothing; only the config is checked
        resolve_model(text)
    _user_error_or_ok(resolve)
