"""Per-phase wall-clock timings, a time budget and a rich progress bar for the search.

Phases: ``capture`` (tracing the model, when :func:`fxplan.search` is given a model spec),
``intra-op`` (placements of the repeated block), ``inter-op`` (enumeration, lower bounds,
stage partitions, closed-form ranking) and ``simulate`` (step simulator on the finalists).
The progress bar draws on stderr only when it is a terminal and ``enabled``.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["Budget", "PhaseTimer", "progress_bar"]


class PhaseTimer:
    """Accumulates seconds per phase: ``with timer("inter-op"): …``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in self.seconds.items()}


class Budget:
    """``budget.expired()`` once ``seconds`` have passed since construction (never if ``None``)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def expired(self) -> bool:
        return self.seconds is not None and self.elapsed() > self.seconds

    def remaining(self) -> float | None:
        """Seconds left (``None`` without a budget; ``≤ 0`` once spent)."""
        return None if self.seconds is None else self.seconds - self.elapsed()


class _NoBar:
    def advance(self, n: int = 1) -> None:
        pass

    def describe(self, text: str) -> None:
        pass


class _RichBar:
    def __init__(self, progress: Any, task: Any) -> None:
        self.progress, self.task = progress, task

    def advance(self, n: int = 1) -> None:
        self.progress.advance(self.task, n)

    def describe(self, text: str) -> None:
        self.progress.update(self.task, description=text)


@contextmanager
def progress_bar(total: int, description: str, enabled: bool) -> Iterator[Any]:
    """A bar with ``advance``/``describe``; a no-op unless ``enabled`` and stderr is a TTY."""
    if not enabled or not sys.stderr.isatty():
        yield _NoBar()
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    progress = Progress("[progress.description]{task.description}", BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=True)
    with progress:
        yield _RichBar(progress, progress.add_task(description, total=total))
