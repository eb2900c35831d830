"""Search time of ``fxplan.search`` for GPT models from 1.7B on 32 GPUs to 1T on 3072 GPUs.

    python benchmarks/search_time.py             # print the table
    python benchmarks/search_time.py --write     # and rewrite the "Search time" section of
                                                 # docs/benchmarks.md
    python benchmarks/search_time.py --only gpt3-175b

Rows: every Megatron-LM SC'21 Table 1 configuration (model, GPU count, global batch; DGX
A100 80GB nodes, s = 2048) plus GPT-3 175B on 1024 GPUs (batch 1536). Capture is timed apart
(it is per model, not per search); ``search`` is the wall-clock of :func:`fxplan.search` on
the captured graph, with its phases. Targets: GPT-3 175B on 1024 GPUs ≤ 10 s, 1T on 3072
GPUs ≤ 30 s, on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import logging
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
START, END = "<!-- search-time:start -->", "<!-- search-time:end -->"

#: (preset, GPUs, global batch): Table 1 of Narayanan et al. (2021), and GPT-3 175B.
ROWS: tuple[tuple[str, int, int], ...] = (
    ("gpt-1.7b", 32, 512), ("gpt-3.6b", 64, 512), ("gpt-7.5b", 128, 512),
    ("gpt-18.4b", 256, 1024), ("gpt-39.1b", 512, 1536), ("gpt-76.1b", 1024, 1792),
    ("gpt3-175b", 1024, 1536), ("gpt-145.6b", 1536, 2304), ("gpt-310.1b", 1920, 2160),
    ("gpt-529.6b", 2520, 2520), ("gpt-1t", 3072, 3072),
)
TARGETS = {("gpt3-175b", 1024): 10.0, ("gpt-1t", 3072): 30.0}


def measure(preset: str, gpus: int, batch: int) -> dict:
    from fxplan.cluster_specs import Cluster
    from fxplan import search
    from fxplan.api import capture_for_search

    start = time.perf_counter()
    graph = capture_for_search(preset, seq=2048)
    captured = time.perf_counter() - start
    cluster = Cluster.load(f"dgx-a100-80g:nodes={gpus // 8}")
    start = time.perf_counter()
    plan = search(graph, cluster, batch=batch, progress=False)
    seconds = time.perf_counter() - start
    return {"preset": preset, "gpus": gpus, "batch": batch, "capture_s": captured,
            "search_s": seconds, "timings": dict(plan.timings),
            "visited": plan.estimate.get("candidates_visited"), "summary": plan.summary,
            "step_s": plan.estimate["step_time_s"], "mfu": plan.estimate["mfu"],
            "target": TARGETS.get((preset, gpus))}


def markdown(rows: list[dict]) -> str:
    lines = ["| model | GPUs | batch | capture (s) | search (s) | inter-op / simulate / "
             "intra-op (s) | candidates ranked | target | plan | step (s) | MFU |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r["timings"]
        target = f"≤ {r['target']:g} s" if r["target"] else ""
        lines.append(
            f"| {r['preset']} | {r['gpus']} | {r['batch']} | {r['capture_s']:.1f} | "
            f"{r['search_s']:.2f} | {t.get('inter-op', 0):.2f} / {t.get('simulate', 0):.2f} / "
            f"{t.get('intra-op', 0):.2f} | {r['visited']} | {target} | "
            f"`{r['summary'].replace('|', chr(92) + '|')}` | "
            f"{r['step_s']:.2f} | {100 * r['mfu']:.1f} % |")
    return "\n".join(lines)


def measured_on() -> str:
    """``2026-11-29, the tree of commit 8d94059``: the day and the commit (``with changes``
    where the working tree differs from it) a measurement names."""
    import datetime
    import subprocess

    root = Path(__file__).resolve().parent.parent
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                            capture_output=True, text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                           capture_output=True, text=True).stdout.strip()
    day = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    return f"{day}, the tree of commit `{commit}`" + (" with changes" if dirty else "")


def write_section(table: str, load: float, path: Path = DOC) -> None:
    """Put this benchmark's section into ``docs/benchmarks.md``: in place of its previous
    version if there is one, else at the end; every other section is kept as it is. ``load``:
    the machine's 1-minute load average before the run (other jobs slow every row)."""
    section = ("## Search time\n\n"
               "Wall-clock of `fxplan.search` (inter-op enumeration and bounds, stage DP, "
               "closed-form ranking, intra-op solve per tp degree of the finalists, step "
               "simulator on the finalists priced with their placements and with the default "
               "layout, and the runtime's check that it can apply the plan to the model, which "
               "the phase column leaves out) on a 2-core machine (1-minute load average "
               f"{load:.1f} before the run; {measured_on()}), "
               "after capture (timed apart). DGX A100 80GB nodes, s = 2048. Reproduce with "
               "`python benchmarks/search_time.py`.\n\n"
               f"{table}")
    from doc_sections import replace_section  # benchmarks/, on sys.path when run as a script

    replace_section(path, START, END, section)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true",
                        help="rewrite the Search time section of docs/benchmarks.md")
    parser.add_argument("--no-write", action="store_true", help="print only (the default)")
    parser.add_argument("--only", action="append", default=[], metavar="PRESET")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    load = os.getloadavg()[0]
    rows = []
    for preset, gpus, batch in ROWS:
        if args.only and preset not in args.only:
            continue
        row = measure(preset, gpus, batch)
        print(f"{preset:>11} {gpus:>5} GPUs  capture {row['capture_s']:5.1f} s  search "
              f"{row['search_s']:6.2f} s  {row['summary']}", flush=True)
        rows.append(row)
    table = markdown(rows)
    print("\n" + table)
    if args.write and not args.no_write and not args.only:
        write_section(table, load)
        print(f"\nwrote the Search time section of {DOC}")


if __name__ == "__main__":
    main()
