"""Wall-clock time of ``fxplan compare``: 5 cluster kinds × 8 sizes for a 70B model.

    python benchmarks/compare_time.py                 # Llama-3-70B shape, 2T tokens, 4M batch
    python benchmarks/compare_time.py --sizes 64..1024 --clusters dgx-h100,dgx-b200

The model is the zoo's ``llama`` family at Llama 3 70B's shape (80 layers, hidden 8192, 64
heads with 8 key/value heads, FFN 28672, vocabulary 128256, s = 4096); the global batch 4M
tokens (1024 sequences); the kinds ``dgx-h100``, ``hgx-h200``, ``dgx-b200``, ``gb200-nvl72``
and ``mi300x``; the sizes the powers of two from 64 to 8192 (8 per kind). It prints the
comparison (:func:`fxplan.compare.compare`) and the time of the capture, of every search and
of the whole; ``--time-budget S`` bounds each search as ``fxplan compare --time-budget`` does.
With several worker processes (``--jobs``, default one per CPU) a kind's rows arrive together
when its worker is done: the time printed beside a row is then the wait since the previous
one, not its search's. Not a test: the times are this machine's.
"""

from __future__ import annotations

import argparse
import time

MODEL = ("llama:layers=80,hidden=8192,heads=64,kv_heads=8,ffn_hidden=28672,vocab=128256,"
         "seq=4096")
CLUSTERS = "dgx-h100,hgx-h200,dgx-b200,gb200-nvl72,mi300x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--clusters", default=CLUSTERS)
    parser.add_argument("--sizes", default="64..8192")
    parser.add_argument("--tokens", default="2T")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="bound each search to this many seconds (fxplan compare --time-budget)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="worker processes (fxplan compare --jobs; default one per CPU)")
    args = parser.parse_args()

    from fxplan.api import capture_for_search
    from fxplan.batch_tokens import parse_batch_tokens
    from fxplan.compare import compare, parse_size_range, parse_tokens
    from fxplan.report.compare import render_comparison
    from fxplan.examples.model_spec import canonical_spec

    start = time.perf_counter()
    capture_for_search(canonical_spec(args.model), dtype="bfloat16")   # cached for compare
    captured = time.perf_counter() - start
    times: list[float] = []
    last = [time.perf_counter()]

    def tick(row) -> None:
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now
        print(f"  {row.cluster:>12} {row.devices:>5}: {times[-1]:6.2f} s  {row.summary}",
              flush=True)

    result = compare(args.model, tokens=parse_tokens(args.tokens),
                     batch_tokens=parse_batch_tokens("4M"),
                     clusters=args.clusters.split(","), sizes=parse_size_range(args.sizes),
                     time_budget_s=args.time_budget, on_row=tick, jobs=args.jobs)
    total = time.perf_counter() - start
    render_comparison(result)
    print(f"capture {captured:.1f} s; {len(times)} searches, {sum(times):.1f} s "
          f"(max {max(times, default=0):.1f} s); compare {result.elapsed_s:.1f} s; "
          f"total {total:.1f} s")


if __name__ == "__main__":
    main()
