"""The op-class vocabulary is written in four places that cannot import one another
(cluster_specs may not import passes): capture's classes, the cluster schema's efficiency keys,
the efficiency data file and the backward rules must name the same classes."""

from __future__ import annotations

import json
from pathlib import Path

from fxplan import cost_model
from fxplan.cluster_specs import OP_CLASSES as SCHEMA_KEYS
from fxplan.cost_model.compute.op_time import BACKWARD
from fxplan.passes.node_info import OP_CLASSES

#: Schema keys that name families of classes rather than a class (``memory_bound`` covers every
#: memory-bound class; ``memory`` is its short form).
FAMILY_KEYS = {"memory", "memory_bound"}


def test_every_place_names_the_same_op_classes():
    data = json.loads((Path(cost_model.__file__).parent / "data" / "efficiency.json").read_text())
    assert set(data["op_class_family"]) == set(OP_CLASSES)
    assert set(BACKWARD) == set(OP_CLASSES)
    assert set(SCHEMA_KEYS) - FAMILY_KEYS == set(OP_CLASSES)
