"""Inputs at the limits of what a reader should take: JSON nested past Python's recursion limit,
files that exist but are no regular file (a FIFO, which blocks a read, and ``/dev/zero``, which
never ends), a cluster file far larger than any spec, and a run directory whose newest
checkpoint was altered after its commit. Each is one paragraph and exit 2 (or, for the
checkpoint, the previous one is resumed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fxplan.cli.main import main

DEEP = '{"format_version": ' + "[" * 100_000 + "]" * 100_000 + "}"


@pytest.mark.parametrize("verb", ["report", "diff", "launch"])
def test_deeply_nested_plan_json_is_one_paragraph(verb, tmp_path, capsys):
    plan = tmp_path / "deep.json"
    plan.write_text(DEEP)
    args = {"report": [str(plan)], "diff": [str(plan), str(plan)],
            "launch": [str(plan), "--data", "synthetic", "--print-command"]}[verb]
    assert main([verb, *args]) == 2
    err = capsys.readouterr().err
    assert "nested deeper than Python's JSON reader follows" in err and "Traceback" not in err
    assert err.strip().count("\n") == 0


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_plan_or_cluster_that_is_no_regular_file_is_named_as_what_it_is(kind, tmp_path):
    """In a subprocess: the old reader blocked on a FIFO and read /dev/zero without end."""
    path = "/dev/zero"
    if kind == "fifo":
        path = str(tmp_path / "plan.json")
        os.mkfifo(path)
    what = "a FIFO (named pipe)" if kind == "fifo" else "a character device"
    for args in (["report", path], ["plan", "gpt-tiny", "--cluster", path, "--batch", "4"]):
        done = subprocess.run([sys.executable, "-m", "fxplan.cli.main", *args],
                              capture_output=True, text=True, timeout=120)  # hang guard
        assert done.returncode == 2, done.stderr[-2000:]
        assert f"is {what}, not a regular file" in done.stderr and "Traceback" not in done.stderr


def test_a_cluster_file_beyond_the_size_limit_is_refused_unread(tmp_path):
    from fxplan.cluster_specs import Cluster, ClusterSpecError
    from fxplan.cluster_specs.documents import MAX_SPEC_BYTES

    big = tmp_path / "big.yaml"
    with open(big, "w") as handle:
        handle.truncate(MAX_SPEC_BYTES + 1)  # sparse: no disk written
    with pytest.raises(ClusterSpecError, match="MiB is refused unread"):
        Cluster.load(str(big))


def _commit(run_dir, step: int) -> None:
    from fxplan.runtime.checkpoint.manifest import commit_checkpoint

    staging = run_dir / "checkpoints" / f"step-{step}.tmp-x"
    staging.mkdir(parents=True)
    (staging / "train_state.json").write_text(json.dumps({"step": step}))
    (staging / "__0_0.distcp").write_bytes(bytes(64))
    commit_checkpoint(staging, run_dir / "checkpoints" / f"step-{step}", {"step": step})


def test_an_altered_newest_checkpoint_falls_back_to_the_one_before(tmp_path):
    """A cut shard in the newest committed checkpoint of a run directory: the resume goes on
    from the previous one and says which it refused; named itself, it is still refused."""
    from fxplan.runtime.checkpoint.manifest import CheckpointError, resolve_checkpoint

    for step in (2, 4):
        _commit(tmp_path, step)
    shard = tmp_path / "checkpoints" / "step-4" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:10])  # cut, as a full disk leaves a file
    refused: list = []
    found, manifest = resolve_checkpoint(tmp_path, refused)
    assert found.name == "step-2" and manifest["step"] == 2
    assert [(d.name, "differ from the sha256" in why) for d, why in refused] == [("step-4", True)]
    with pytest.raises(CheckpointError, match="differ from the sha256"):
        resolve_checkpoint(tmp_path / "checkpoints" / "step-4")
    shard_2 = tmp_path / "checkpoints" / "step-2" / "__0_0.distcp"
    shard_2.write_bytes(b"")
    with pytest.raises(CheckpointError, match="step-4"):  # none passes: the newest's refusal
        resolve_checkpoint(tmp_path)


def test_a_plan_whose_estimate_holds_nan_is_refused(tmp_path, capsys):
    """JSON's ``NaN`` in a prediction was accepted and reported as "nan ns"."""
    from fxplan import search

    data = search("gpt-tiny:seq=16", "local-cpu:devices=2", batch=4, progress=False).to_dict()
    data["estimate"]["step_time_s"] = float("nan")
    plan = tmp_path / "nan.json"
    plan.write_text(json.dumps(data))
    assert "NaN" in plan.read_text()
    assert main(["report", str(plan)]) == 2
    err = capsys.readouterr().err
    assert "estimate.step_time_s is nan" in err and "Traceback" not in err
