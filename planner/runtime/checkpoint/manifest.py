"""Complete checkpoints: the manifest, atomic commit, and the check before anything is unpickled.

A training checkpoint is a directory ``RUN_DIR/checkpoints/step-N/`` holding DCP's files
(``.metadata`` — a *pickle* — and ``__R_0.distcp`` …), ``train_state.json`` and one
``rng/rank-R.json`` per rank, and, written last, ``fxplan-manifest.json``::

    {"format": "fxplan-checkpoint", "version": 1, "step": N, "world_size": …, "plan": …,
     "files": {"relative/path": "sha256 hex", …}}

**Atomic.** Every rank writes into ``step-N.tmp-<id>/``; after a barrier, rank 0 hashes every
file, writes the manifest (temp file + ``os.replace``), renames the directory to ``step-N/``
(one ``rename`` on one filesystem) and replaces the ``latest`` pointer (temp + ``os.replace``).
A crash at any moment leaves either no ``step-N/`` or a complete one; earlier ones are untouched.

**Refusal before unpickling.** :func:`verify_checkpoint` accepts a directory only when its
manifest is fxplan's, lists exactly the files present, and every file's sha256 matches.
``torch.distributed.checkpoint.load`` unpickles ``.metadata``, so this check runs before any
load — in ``fxplan launch`` before a process starts and again in every worker. It catches an
incomplete, corrupted or foreign directory. It is *not* a signature: whoever can write the
directory can write a matching manifest, so a checkpoint stays trusted input (docs/runtime.md,
"Checkpoints and the trust boundary").

This module imports no torch: the command line uses it before starting anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from fxplan.core.errors import UserError
from fxplan.core.files import read_text
from fxplan.core.json_object import parse_json_object

__all__ = ["CheckpointError", "MANIFEST", "FORMAT", "VERSION", "commit_checkpoint",
           "verify_checkpoint", "resolve_checkpoint", "read_json_file", "staging_dir",
           "newest_committed_step", "check_model"]

MANIFEST = "fxplan-manifest.json"
FORMAT = "fxplan-checkpoint"
VERSION = 1
LATEST = "latest"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_CHUNK = 1 << 20


class CheckpointError(UserError):
    """A checkpoint directory that is missing, incomplete, altered or not fxplan's."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(directory: Path) -> list[str]:
    """Every regular file below ``directory`` but the manifest, as sorted relative paths."""
    found = []
    for root, _, names in os.walk(directory):
        for name in names:
            relative = (Path(root) / name).relative_to(directory).as_posix()
            if relative != MANIFEST:
                found.append(relative)
    return sorted(found)


def _write_replace(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file in the same directory, fsync, replace)."""
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with temp.open("w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)


def staging_dir(final: Path, token: str) -> Path:
    """Where the ranks write the checkpoint ``final`` before it is committed: a sibling
    ``<name>.tmp-<token>`` (same filesystem, so the commit is one rename)."""
    return final.with_name(f"{final.name}.tmp-{token}")


def commit_checkpoint(staging: Path, final: Path, info: dict[str, Any], *,
                      latest: bool = True) -> Path:
    """Rank 0, after every rank finished writing into ``staging``: hash every file, write the
    manifest, rename ``staging`` to ``final`` and (``latest``) point ``final.parent/latest`` at
    it. ``final`` must not exist (a step is committed once)."""
    if final.exists():
        raise CheckpointError(f"checkpoint {final} already exists: a committed checkpoint is "
                              "never overwritten (use another --run-dir or --save directory)")
    files = {name: _sha256(staging / name) for name in _files(staging)}
    manifest = {"format": FORMAT, "version": VERSION, **info, "files": files}
    _write_replace(staging / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.rename(staging, final)
    if latest:
        _write_replace(final.parent / LATEST, final.name + "\n")
    return final


def verify_checkpoint(directory: str | Path) -> dict[str, Any]:
    """The manifest of a complete, unaltered fxplan checkpoint; else :class:`CheckpointError`.
    Reads and hashes files only — unpickles nothing."""
    directory = Path(directory)
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(
            f"--resume {directory}: no {MANIFEST}, so this is not a complete fxplan checkpoint "
            "(an interrupted save, a directory written by something else, or a DCP checkpoint "
            "from an older fxplan). Refused before reading it: loading a checkpoint unpickles "
            "its .metadata, which can run code. Resume from a step-N directory written by "
            "`fxplan launch --checkpoint-every` or `--save`.")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise CheckpointError(f"--resume {directory}: {MANIFEST} is not readable JSON "
                              f"({err}); refused") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"--resume {directory}: {MANIFEST} is not an fxplan checkpoint "
                              f"manifest (format {FORMAT!r} expected); refused")
    if manifest.get("version") != VERSION:
        raise CheckpointError(f"--resume {directory}: checkpoint format version "
                              f"{manifest.get('version')!r}; this fxplan reads version {VERSION}")
    listed = manifest.get("files")
    if not isinstance(listed, dict) or not listed:
        raise CheckpointError(f"--resume {directory}: {MANIFEST} lists no files; refused")
    present = _files(directory)
    missing = sorted(set(listed) - set(present))
    extra = sorted(set(present) - set(listed))
    if missing or extra:
        raise CheckpointError(
            f"--resume {directory}: the files do not match its manifest (missing: "
            f"{', '.join(missing) or 'none'}; not listed: {', '.join(extra) or 'none'}); "
            "refused before unpickling anything")
    altered = [name for name in present if _sha256(directory / name) != listed[name]]
    if altered:
        raise CheckpointError(
            f"--resume {directory}: {len(altered)} file(s) differ from the sha256 recorded at "
            f"save time ({', '.join(altered[:5])}); the checkpoint was altered or corrupted, "
            "refused before unpickling anything")
    return manifest


def _step_dirs(checkpoints: Path) -> list[tuple[int, Path]]:
    """Committed ``step-N`` directories (with a manifest), highest step first."""
    found = []
    for entry in checkpoints.iterdir() if checkpoints.is_dir() else ():
        match = _STEP_DIR.match(entry.name)
        if match and entry.is_dir() and (entry / MANIFEST).is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found, reverse=True)


def newest_committed_step(run_dir: str | Path) -> int | None:
    """The highest ``N`` of a committed ``run_dir/checkpoints/step-N`` (one with a manifest;
    not verified here), or ``None``: what a restarted attempt will resume from."""
    steps = _step_dirs(Path(run_dir) / "checkpoints")
    return steps[0][0] if steps else None


def resolve_checkpoint(path: str | Path, refused: list[tuple[Path, str]] | None = None
                       ) -> tuple[Path, dict[str, Any]]:
    """The checkpoint ``--resume PATH`` names and its verified manifest: ``PATH`` itself when
    it holds a manifest (a ``step-N`` or ``--save`` directory), else the newest committed
    ``step-N`` of ``PATH/checkpoints/`` (a run directory) or of ``PATH`` (a checkpoints
    directory) that passes the check. A newer ``step-N`` that fails it (cut or altered after
    its commit: a full disk, a copy interrupted) is skipped for the one before it and appended
    to ``refused`` as ``(directory, why)``; when none passes, the newest one's refusal is
    raised. A ``step-N`` named itself is never skipped."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"--resume {path}: no such checkpoint directory (expected a run "
                              "directory, its checkpoints/ directory or one step-N directory, "
                              "written by `fxplan launch --checkpoint-every K` or `--save DIR`)")
    if (path / MANIFEST).is_file():
        return path, verify_checkpoint(path)
    for checkpoints in (path / "checkpoints", path):
        steps = _step_dirs(checkpoints)
        first_error: CheckpointError | None = None
        for _, directory in steps:
            try:
                return directory, verify_checkpoint(directory)
            except CheckpointError as err:
                first_error = first_error or err
                if refused is not None:
                    refused.append((directory, str(err)))
        if first_error is not None:
            raise first_error
    verify_checkpoint(path)  # raises: no manifest here and no committed step below
    raise AssertionError("unreachable")  # pragma: no cover


def check_model(directory: Path, manifest: dict[str, Any], spec: str, fingerprint: str) -> None:
    """Refuse the checkpoint ``directory`` (its verified ``manifest``) for the model ``spec``
    whose state-dict fingerprint is ``fingerprint``, when the manifest records another
    (:func:`fxplan.runtime.checkpoint.training.model_fingerprint`); a checkpoint written before
    fingerprints were recorded is not checked."""
    saved = manifest.get("model_fingerprint")
    if not isinstance(saved, str) or saved == fingerprint:
        return
    raise CheckpointError(
        f"--resume {directory}: the checkpoint holds the parameters of model "
        f"{manifest.get('model', '?')!r} (state-dict layout {saved[:12]}), and this launch runs "
        f"{spec!r} (layout {fingerprint[:12]}): their parameters differ in names or shapes, so "
        "no rank could load it. Resume with the model the checkpoint was saved for (its plan, "
        "or --model SPEC), or start this model without --resume")


def read_json_file(directory: Path, name: str) -> dict[str, Any]:
    """A JSON file of a verified checkpoint (``train_state.json``, ``rng/rank-R.json``)."""
    path = directory / name
    what = f"checkpoint {directory}: {name}"
    return parse_json_object(read_text(path, what=what, error=CheckpointError), what=what,
                             error=CheckpointError)
