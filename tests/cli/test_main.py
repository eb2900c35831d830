"""``fxplan --version`` and ``--debug`` anywhere on the line (but not after ``--``)."""

from __future__ import annotations

import platform
import subprocess
import sys
from importlib import metadata

import pytest

import fxplan
from fxplan.cli.main import VERBS, main, parse_args
from fxplan.core.errors import UserError


def test_version_names_fxplan_torch_and_python(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    line = capsys.readouterr().out.strip()
    assert line == (f"fxplan {fxplan.__version__} (torch {metadata.version('torch')}, "
                    f"Python {platform.python_version()})")


def test_version_does_not_import_torch():
    code = ("import sys; from fxplan.cli.main import main\n"
            "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("argv", [
    ["--debug", "clusters", "--show", "dgx-a100-80g"],
    ["clusters", "--debug", "--show", "dgx-a100-80g"],
    ["clusters", "--show", "dgx-a100-80g", "--debug"],
])
def test_debug_is_accepted_anywhere(argv):
    assert parse_args(argv).debug is True


def test_debug_defaults_off():
    assert parse_args(["clusters"]).debug is False


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_takes_debug(verb):
    parser = parse_args.__globals__["build_parser"]()
    sub = next(a for a in parser._actions if a.dest == "verb")
    assert "--debug" in sub.choices[verb]._option_string_actions


def test_debug_after_double_dash_belongs_to_torchrun():
    args = parse_args(["launch", "plan.json", "--data", "synthetic", "--", "--debug",
                       "--nnodes", "1"])
    assert args.debug is False and args.torchrun_args == ["--debug", "--nnodes", "1"]
    args = parse_args(["launch", "plan.json", "--debug", "--data", "synthetic", "--", "--debug"])
    assert args.debug is True and args.torchrun_args == ["--debug"]


@pytest.mark.parametrize("argv", [
    ["--debug", "clusters", "--show", "dgx-z900"],
    ["clusters", "--debug", "--show", "dgx-z900"],
    ["clusters", "--show", "dgx-z900", "--debug"],
])
def test_debug_anywhere_raises_the_user_error(argv):
    with pytest.raises(UserError, match="dgx-z900"):
        main(argv)


def test_without_debug_the_error_is_one_paragraph(capsys):
    assert main(["clusters", "--show", "dgx-z900"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fxplan clusters: error:") and "Traceback" not in err


def test_traceback_shown_with_debug_after_the_verb():
    cmd = [sys.executable, "-m", "fxplan.cli.main", "clusters", "--show", "dgx-z900"]
    hidden = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    shown = subprocess.run([*cmd, "--debug"], capture_output=True, text=True, timeout=120)
    assert hidden.returncode == 2 and "Traceback" not in hidden.stderr
    assert shown.returncode != 0 and "Traceback (most recent call last)" in shown.stderr
    assert "ClusterSpecError" in shown.stderr
