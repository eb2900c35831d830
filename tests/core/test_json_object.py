"""``parse_json_object``: one JSON object from text, or the caller's error naming the source."""

from __future__ import annotations

import pytest

from fxplan.core.errors import UserError
from fxplan.core.json_object import parse_json_object


class OwnError(UserError):
    pass


def test_an_object_is_returned():
    assert parse_json_object('{"a": [1, 2]}', what="x") == {"a": [1, 2]}


@pytest.mark.parametrize("text, message", [
    ("{not json", r"^plan\.json: not a JSON plan file: Expecting property name"),
    ("[1, 2]", r"^plan\.json: expected a JSON object, found list$"),
    ("3", r"^plan\.json: expected a JSON object, found int$"),
])
def test_bad_text_raises_the_callers_error(text, message):
    with pytest.raises(OwnError, match=message):
        parse_json_object(text, what="plan.json", kind="plan file", error=OwnError)
