"""Each benchmark's section of ``docs/benchmarks.md``, kept between its own markers.

Imported by the benchmark scripts inside their ``--write`` path only (run as
``python benchmarks/<name>.py``, this folder is on ``sys.path``; the tests load the scripts by
file path and never write)."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["replace_section"]


def replace_section(path: Path, start: str, end: str, body: str) -> None:
    """Write ``start⏎body⏎end`` into ``path``: in place of the text between the two markers
    where both are there, else at the end (a missing file starts as ``# Benchmarks``); every
    other section is kept as it is."""
    section = f"{start}\n{body}\n{end}"
    text = path.read_text() if path.is_file() else "# Benchmarks\n"
    if start in text and end in text:
        text = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: section, text,
                      flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    path.write_text(text)
