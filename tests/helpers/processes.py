"""Processes seen through ``/proc``: a process's descendants, and whether a pid still runs."""

from __future__ import annotations

import os


def descendants(pid: int) -> set[int]:
    """``pid`` and every process below it (children, their children, …), read from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, grew = {pid}, True
    while grew:
        new = {child for child, parent in parents.items() if parent in found} - found
        found |= new
        grew = bool(new)
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (exists and is no zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
