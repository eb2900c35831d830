"""Time building and querying a 3072-GPU cluster (384 DGX A100 80GB nodes).

    .venv/bin/python benchmarks/cluster_queries.py

Prints the wall time to load the spec and build its graph (networkx imported beforehand), of
the first two group queries (all ranks; one rank per node), and per repeated, cached query.
Measured on the 2-core development machine: ≈ 0.1 s to build, ≈ 7 ms for the first queries,
≈ 10 µs per cached query. ``tests/cluster_specs/test_queries.py`` checks what keeps these
small without a clock: one build, one computation per distinct group.
"""

from __future__ import annotations

import time

import networkx  # noqa: F401  (imported before timing, as a planner run has it already)

from fxplan.cluster_specs import Cluster


def main() -> None:
    start = time.perf_counter()
    cluster = Cluster.load("dgx-a100-80g:nodes=384")
    nodes = cluster.graph.number_of_nodes()
    built = time.perf_counter() - start
    start = time.perf_counter()
    cluster.group_bandwidth_gb_per_s(range(cluster.num_devices))
    cluster.group_bandwidth_gb_per_s(range(0, cluster.num_devices, 8))
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(1000):
        cluster.group_links(range(0, cluster.num_devices, 8))
    repeated = (time.perf_counter() - start) / 1000
    print(f"{cluster.num_devices} devices, {nodes} graph nodes")
    print(f"load + build graph   {built * 1e3:9.1f} ms")
    print(f"first two queries    {first * 1e3:9.1f} ms")
    print(f"cached query         {repeated * 1e6:9.1f} µs")


if __name__ == "__main__":
    main()
