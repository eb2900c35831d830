"""The machine park: ``Cluster``, its device groups and link levels, and how to load them.

    from fxplan.cluster_specs import Cluster
    cluster = Cluster.load("dgx-a100-80g:nodes=4")   # built-in name, YAML path, or name:key=value

See ``docs/cluster_specs.md`` for the YAML schema (v1) and ``cluster_specs/cluster.py`` for
the group queries and their formulas. This package imports no other fxplan package.
"""

from fxplan.cluster_specs.cluster import Cluster, GroupLinks
from fxplan.cluster_specs.devices import DTYPES, DeviceGroup
from fxplan.cluster_specs.errors import ClusterSpecError
from fxplan.cluster_specs.host_costs import HostCosts
from fxplan.cluster_specs.links import LinkLevel
from fxplan.cluster_specs.loader import available_specs
from fxplan.cluster_specs.precision import (check_precision, group_precision, group_precisions,
                                           training_dtype, training_precision)
from fxplan.cluster_specs.schema import OP_CLASSES, SCHEMA_VERSION

__all__ = [
    "Cluster",
    "ClusterSpecError",
    "DTYPES",
    "DeviceGroup",
    "HostCosts",
    "GroupLinks",
    "LinkLevel",
    "OP_CLASSES",
    "SCHEMA_VERSION",
    "available_specs",
    "check_precision",
    "group_precision",
    "group_precisions",
    "load",
    "training_dtype",
    "training_precision",
]

#: ``fxplan.cluster_specs.load(spec)`` is :meth:`Cluster.load`.
load = Cluster.load
