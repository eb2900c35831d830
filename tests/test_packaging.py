"""A wheel of fxplan installs one import name, ``fxplan``, and nothing generic.

The repository's folders (``planner/``, ``cost_model/``, ``cluster_specs/``, ``passes/``,
``examples/``) are mapped under ``fxplan`` by ``pyproject.toml``'s ``package-dir``. The test
builds a real (non-editable) wheel, installs it into a throw-away virtual environment and
imports it from a directory that has packages of its own named ``examples`` and ``planner``
— the situation that broke when fxplan claimed those names.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"planner": "fxplan", "cluster_specs": "fxplan.cluster_specs",
           "cost_model": "fxplan.cost_model", "passes": "fxplan.passes",
           "examples": "fxplan.examples"}


def _packages_on_disk() -> set[str]:
    found = set()
    for folder, package in FOLDERS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(REPO / folder).parts
            found.add(".".join((package, *parts)))
    return found


def test_pyproject_lists_every_package() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(config["packages"]) == _packages_on_disk()
    assert config["package-dir"] == {package: folder for folder, package in FOLDERS.items()
                                     if package.count(".") <= 1}


PROBE = r"""
import json, pathlib, subprocess, sys
import examples, planner                      # the user's own packages of those names
import fxplan
from fxplan import capture, plan, search, Plan, UserError
import fxplan.cost_model, fxplan.cluster_specs, fxplan.passes.capture, fxplan.examples.model_spec
graph = capture("gpt-tiny:layers=2", batch=1)
devices = fxplan.cluster_specs.Cluster.load("dgx-a100-80g:nodes=2").num_devices
data = sorted(p.name for p in (pathlib.Path(fxplan.cost_model.__file__).parent / "data").iterdir())
worker = subprocess.run([sys.executable, "-m", "fxplan.worker", "--help"], capture_output=True,
                        text=True)
print(json.dumps({
    "fxplan": fxplan.__file__, "user_examples": examples.WHOSE, "user_planner": planner.WHOSE,
    "model_spec": fxplan.examples.model_spec.__file__, "layers": len(graph.blocks[0].layers),
    "worker": worker.returncode, "version": fxplan.__version__, "devices": devices,
    "data": data,
}))
"""


@pytest.mark.slow
def test_wheel_installs_only_fxplan_and_imports_beside_user_packages(tmp_path: Path) -> None:
    # Build from a copy of the sources: setuptools' in-tree build/ folder would otherwise keep
    # files deleted since the last build and put them into the wheel.
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache"))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(wheels), str(source)], check=True, capture_output=True)
    (wheel,) = wheels.glob("fxplan-*.whl")

    # The environment gets no pip of its own (ensurepip takes longer than the rest of the
    # test): this environment's pip installs into it, run by its interpreter (``--python``).
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path"
                                "('purelib'))"], check=True, capture_output=True,
                               text=True).stdout.strip())
    before = set(os.listdir(site))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True)
    added = set(os.listdir(site)) - before
    assert {name for name in added if not name.endswith(".dist-info")} == {"fxplan"}, added
    # fxplan's dependencies (torch, OR-Tools, …) come from the test's own environment, appended
    # after the throw-away site-packages (a path line; that directory's .pth files are not run,
    # so this environment's editable install of fxplan stays inactive).
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")

    work = tmp_path / "project"
    for name in ("examples", "planner"):
        (work / name).mkdir(parents=True)
        (work / name / "__init__.py").write_text(f"WHOSE = 'user {name}'\n")
    done = subprocess.run([str(python), "-c", PROBE], cwd=work, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr
    import json

    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(result["fxplan"]).is_relative_to(site)
    assert Path(result["model_spec"]).is_relative_to(site)
    assert result["user_examples"] == "user examples" and result["user_planner"] == "user planner"
    assert result["layers"] == 2 and result["worker"] == 0 and result["devices"] == 16
    assert {"efficiency.json", "collectives.json"} <= set(result["data"])
