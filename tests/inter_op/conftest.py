"""Fixtures of the inter-op tests: GPT 1.7B captured for the search, on 4 DGX A100 80GB nodes."""

from __future__ import annotations

import pytest

from fxplan.cluster_specs import Cluster
from fxplan.api import capture_for_search

CLUSTER = "dgx-a100-80g:nodes=4"


@pytest.fixture(scope="module")
def gpt17():  # type: ignore[no-untyped-def]
    return capture_for_search("gpt-1.7b"), Cluster.load(CLUSTER)
