"""``fxplan launch --resume`` refuses, before any process starts and before anything is
unpickled, a directory that is not a complete fxplan checkpoint: a crafted ``.metadata``
(a pickle whose loading would create a marker file) without a manifest, or with a manifest
whose hashes do not match; an empty or missing directory. Exit 2, one paragraph, no traceback.
The workers check again (``locate_checkpoint``, here on the rank pool)."""

from __future__ import annotations

import json
import pickle
import subprocess
from pathlib import Path

import pytest

from launch_here import launch_here

from fxplan.runtime.checkpoint.manifest import (CheckpointError, commit_checkpoint, resolve_checkpoint,
                                          verify_checkpoint)


class _Payload:
    """Unpickling this opens (creates) ``marker``: what a hostile ``.metadata`` could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _crafted(directory: Path, marker: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    (directory / "__0_0.distcp").write_bytes(b"\0" * 16)
    return directory


def _launch(capfd, *args: str) -> subprocess.CompletedProcess:
    # the plan is never read: the checkpoint is checked first. The launch verb runs in this
    # process (launch_here): were anything unpickled, the marker would appear all the same.
    return launch_here(capfd, "plan.json", "--data", "synthetic", "--steps", "20", *args,
                       "--print-command", timeout=120)


def _refused(done: subprocess.CompletedProcess, words: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert words in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert done.stderr.strip().count("\n") == 0, done.stderr  # one paragraph


def test_the_crafted_pickle_would_run_if_loaded(tmp_path):
    """The payload is real: DCP's reader unpickling it creates the marker."""
    from torch.distributed.checkpoint import FileSystemReader

    marker = tmp_path / "ran"
    ckpt = _crafted(tmp_path / "ckpt", marker)
    try:
        FileSystemReader(str(ckpt)).read_metadata()
    except Exception:  # noqa: BLE001 - what it unpickled is no Metadata; the marker is made
        pass
    assert marker.exists()


def test_crafted_metadata_without_a_manifest_is_refused_unread(tmp_path, capfd):
    marker = tmp_path / "ran"
    ckpt = _crafted(tmp_path / "ckpt", marker)
    for path in (ckpt, tmp_path):  # a step dir, or a run/checkpoints dir holding it
        _refused(_launch(capfd, "--resume", str(path)), "not a complete fxplan checkpoint")
    assert not marker.exists()


def test_a_manifest_whose_hash_does_not_match_is_refused_unread(tmp_path, capfd):
    marker = tmp_path / "ran"
    staging = tmp_path / "checkpoints" / "step-10.tmp-x"
    staging.mkdir(parents=True)
    (staging / ".metadata").write_bytes(pickle.dumps({"harmless": 1}))
    (staging / "train_state.json").write_text(json.dumps({"step": 10}))
    final = commit_checkpoint(staging, tmp_path / "checkpoints" / "step-10", {"step": 10})
    assert verify_checkpoint(final)["step"] == 10
    (final / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))  # swapped after save
    for path in (final, tmp_path, tmp_path / "checkpoints"):
        _refused(_launch(capfd, "--resume", str(path)),
                 "differ from the sha256 recorded at save time")
    extra = tmp_path / "checkpoints" / "step-10" / "extra.pkl"
    extra.write_bytes(b"x")
    with pytest.raises(CheckpointError, match="not listed: extra.pkl"):
        resolve_checkpoint(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["empty", "missing"])
def test_resume_of_an_empty_or_missing_directory_is_one_paragraph(tmp_path, kind, capfd):
    path = tmp_path / "ckpt"
    if kind == "empty":
        path.mkdir()
    done = _launch(capfd, "--resume", str(path))
    _refused(done, "no such checkpoint directory" if kind == "missing" else "no fxplan-manifest")


def test_workers_refuse_too(rank_pool, tmp_path):
    marker = tmp_path / "ran"
    ckpt = _crafted(tmp_path / "ckpt", marker)
    answers = rank_pool.run("rt_resume_cases:refused_by_workers", path=str(ckpt))
    assert all("not a complete fxplan checkpoint" in a for a in answers), answers
    assert not marker.exists()
