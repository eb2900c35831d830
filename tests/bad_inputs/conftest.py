"""Fixtures of the bad-input suite: a directory of broken files and one valid plan to mutate.

``bad_files`` holds, by name: a non-UTF-8 cluster YAML, a directory, a plan for gpt-tiny on
``local-cpu:devices=4`` (made once per session by ``fxplan plan``), user model files that exit
or raise, and so on; the CLI tables refer to them as ``{name}`` in their argv.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fxplan.cli.main import main

#: The plan every plan-file case mutates (a fast search: gpt-tiny, 4 CPU ranks, batch 8).
PLAN_ARGV = ["plan", "gpt-tiny", "--cluster", "local-cpu:devices=4", "--batch", "8",
             "--constrain", "pp=1,dp=4"]   # the one-stage dp=4 plan the edits below assume


@pytest.fixture(scope="session")
def valid_plan(tmp_path_factory: pytest.TempPathFactory) -> dict:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    assert main([*PLAN_ARGV, "-o", str(path), "--json"]) == 0
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def bad_files(tmp_path_factory: pytest.TempPathFactory, valid_plan: dict) -> dict[str, str]:
    return make_bad_files(tmp_path_factory.mktemp("bad"), valid_plan)


def make_bad_files(root: Path, valid_plan: dict) -> dict[str, str]:
    """Write the broken files under ``root``; ``{name with _ for .}: path``."""
    files: dict[str, str] = {"dir": str(root / "adir"), "tmp": str(root)}
    (root / "adir").mkdir()
    (root / "adir" / "adir.py").mkdir()
    texts = {
        "latin1.yaml": "name: caf\xe9\n".encode("latin-1"),
        "binary.json": b"\xff\xfe\x00\x01",
        "empty.yaml": b"",
        "list.yaml": b"- 1\n- 2\n",
        "plan.json": json.dumps(valid_plan).encode(),
        "notjson.json": b"{not json",
        "array.json": b"[1, 2]",
        "exit0.py": b"import sys\nsys.exit(0)\n",
        "exit3.py": b"def build():\n    import sys\n    sys.exit(3)\n",
        "raises.py": b"def build():\n    raise RuntimeError('boom in build')\n",
        "syntax.py": b"def build(:\n",
        "returns.py": b"def build():\n    return 42\n",
        "nolayers.py": (b"import torch\n\ndef build():\n    m = torch.nn.Linear(8, 8)\n"
                        b"    return m, (torch.randn(4, 8),)\n"),
        "run.toml": b"[training]\nsteps = 'ten'\n",
        "badsection.toml": b"[nope]\nx = 1\n",
        "notoml.toml": b"steps = = 3\n",
        "latin1.toml": "[data]\npath = 'caf\xe9'\n".encode("latin-1"),
        "tokens.bin": b"\x00\x01" * 64,
        "paddle_dup.json": json.dumps({"machines": [
            {"hostname": "a", "addr": "1", "port": "1", "devices": [
                {"global_id": 0, "local_id": 0, "type": "GPU", "model": "A100-SXM-80GB",
                 "memory": 80, "sp_gflops": 19500, "dp_gflops": 9700},
                {"global_id": 0, "local_id": 1, "type": "GPU", "model": "A100-SXM-80GB",
                 "memory": 80, "sp_gflops": 19500, "dp_gflops": 9700}],
             "links": [{"source_global_id": 0, "target_global_id": 0, "type": "NVL",
                        "bandwidth": 200}]}]}).encode(),
    }
    for name, data in texts.items():
        (root / name).write_bytes(data)
        files[name.replace(".", "_")] = str(root / name)
    shutil.copy(root / "plan.json", root / "plan_copy.json")
    return files
