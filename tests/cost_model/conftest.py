"""Fixtures shared by the cost-model tests."""

from __future__ import annotations

import pytest

from fxplan.api import capture


@pytest.fixture(scope="session")
def gpt_512():  # type: ignore[no-untyped-def]
    """A 2-layer GPT of hidden 512 at sequence 256 (batch 1): GEMMs and tensor-parallel
    collectives both large enough that overlapping one with the other shows."""
    return capture("gpt:layers=2,hidden=512,heads=8,vocab=1024,seq=256", batch=1)
