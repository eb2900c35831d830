"""Fixtures shared by the trainer tests of this folder."""

from __future__ import annotations

import pytest

from rt_trainer_cases import make_token_file


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):  # type: ignore[no-untyped-def]
    """The learnable token stream (:func:`rt_trainer_cases.make_token_file`), one per module."""
    return make_token_file(str(tmp_path_factory.mktemp("tokens") / "tokens.bin"))
