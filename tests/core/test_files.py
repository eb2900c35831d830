"""Reading a user's file: each way it fails is one sentence naming the file. Permission is
simulated (the suite may run as root, for whom file modes do not refuse a read)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fxplan.core.errors import UserError
from fxplan.core.files import read_text


def test_unreadable_file_names_the_file_and_the_permission(tmp_path, monkeypatch):
    path = tmp_path / "cluster.yaml"
    path.write_text("name: x\n")

    def refuse(self: Path, *args, **kwargs) -> str:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", refuse)
    with pytest.raises(UserError) as err:
        read_text(path, what="cluster spec")
    assert str(err.value) == f"cluster spec {path} cannot be read (permission denied)"


@pytest.mark.parametrize("make, problem", [
    (lambda p: p.mkdir(), "is a directory; expected a file"),
    (lambda p: None, "does not exist"),
    (lambda p: p.write_bytes(b"name: \xff\xfe\n"), "is not UTF-8 text"),
])
def test_other_file_problems_are_one_sentence(tmp_path, make, problem):
    path = tmp_path / "plan.json"
    make(path)
    with pytest.raises(UserError, match=problem):
        read_text(path, what="plan file")
