"""Op database on this CPU: estimates of shapes the quick grid did not measure vs fresh measurements.

    .venv/bin/python benchmarks/op_database_accuracy.py [--rounds 2] [--min-run-time 0.02]

Profiles the quick grid (:func:`cost_model.compute.profiler.profile`, every other scale of the CPU
grid, factor 4 apart in size) and measures the shapes of ``OFF_GRID``, which lie between two
of its scales. Both sides are medians of single-threaded ``blocked_autorange`` runs on the
thread's CPU clock (immune to time slices taken by other processes), and the fresh
measurements are interleaved with the profile's own (through its ``progress`` hook) over
``--rounds`` rounds, so that what load remains (memory bandwidth, caches shared with a
neighbour) hits both sides alike rather than one. Prints one row per shape: estimate, fresh
median, error; and how many are within ``--tolerance`` (25 % by default, see
``docs/cost_model.md``, "Accuracy on this CPU"). Exits 1 if any is not.

Wall-clock on a shared machine, so a benchmark, not a test: ``tests/cost_model/
test_profile.py`` checks the same grid and shapes deterministically, against a database whose
times follow a known law.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys

from fxplan.cost_model.compute.op_database import OPS
from fxplan.cost_model.compute.profiler import make_call, measure, profile

#: Shapes not in the quick grid, each between two of its scales. Chosen in the smooth parts of
#: the CPU's time curves (see docs/cost_model.md on cache cliffs).
OFF_GRID: list[tuple[str, tuple[tuple[int, ...], ...]]] = [
    ("linear", ((128, 128), (128, 128))),
    ("linear", ((512, 512), (512, 512))),
    ("linear", ((1024, 128), (512, 128))),
    ("linear", ((384, 384), (384, 384))),
    ("bmm", ((8, 128, 128), (8, 128, 64))),
    ("softmax", ((1024, 256),)),
    ("layer_norm", ((1024, 256),)),
    ("gelu", ((128, 1024),)),
    ("add", ((512, 1024), (512, 1024))),
    ("mul", ((2048, 1024), (2048, 1024))),
    ("dropout", ((128, 1024),)),
    ("embedding", ((256,), (8192, 64))),
    ("conv2d", ((4, 64, 32, 32), (64, 64, 3, 3))),
    ("sdpa", ((4, 4, 256, 64),) * 3),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--min-run-time", type=float, default=0.02)
    parser.add_argument("--tolerance", type=float, default=0.25)
    args = parser.parse_args()
    calls = [make_call(op, shapes, "fp32", "cpu") for op, shapes in OFF_GRID]
    fresh: list[list[float]] = [[] for _ in OFF_GRID]
    turn = itertools.cycle(range(len(OFF_GRID)))

    def interleave(_record: object) -> None:
        i = next(turn)
        fresh[i].append(measure(*calls[i], "cpu", args.min_run_time)[0])

    db = profile("cpu", quick=True, rounds=args.rounds, min_run_time=args.min_run_time,
                 progress=interleave)
    assert set(db.ops()) == set(OPS)
    print(f"1-minute load average at the end of the profile: {os.getloadavg()[0]:.2f}")
    print(f"{'op':<11} {'shapes':<60} {'estimate µs':>12} {'fresh µs':>10} {'runs':>5} {'error':>7}")
    misses = 0
    for (op, shapes), times in zip(OFF_GRID, fresh):
        estimate = db.estimate(op, "fp32", shapes=shapes)
        assert estimate is not None, (op, shapes)
        median = statistics.median(times)
        error = estimate / median - 1
        misses += abs(error) > args.tolerance
        print(f"{op:<11} {str(shapes):<60} {estimate * 1e6:>12.1f} {median * 1e6:>10.1f} "
              f"{len(times):>5} {error:>+7.1%}")
    print(f"{len(OFF_GRID) - misses} of {len(OFF_GRID)} within ±{args.tolerance:.0%}")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
