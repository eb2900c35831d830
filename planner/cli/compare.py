"""``fxplan compare MODEL --tokens 2T``: which machines, how many, how long, at what cost.

    fxplan compare gpt-76.1b --tokens 2T --deadline 30d
    fxplan compare gpt-76.1b --tokens 2T --clusters dgx-h100,dgx-b200,gb200-nvl72 \\
        --price dgx-h100=2.10,dgx-b200=3.90,gb200-nvl72=4.80 --devices 64..4096
    fxplan compare gpt-7.5b --tokens 300B --prices prices.yaml --batch-tokens 4M --json

For each cluster kind the plan the search chooses at each size (or, with ``--deadline``, the
smallest size meeting it): its summary, step time, MFU, memory, the days to train, device-hours
and cost (:mod:`fxplan.compare` has the arithmetic); the table is sorted by cost (by
device-hours when no prices are given, which the command says), the Pareto front of days
against cost is marked, ``--plot PNG`` draws it and ``--html PAGE`` writes both to one page
(:mod:`fxplan.report.compare`). Prices are per device-hour, the user's: ``--price`` inline or
``--prices`` a YAML mapping of kind to price.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fxplan.cli.arguments import add_model_argument, count, number, output_path
from fxplan.core.bounds import MAX_BATCH, MAX_SEQ, MAX_TIME_BUDGET_S


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "compare", help="which clusters, how many devices, how long and at what cost",
        description="Plan MODEL on each cluster kind at a range of sizes and compare the days "
        "to train TOKENS tokens, the device-hours and the cost.")
    add_model_argument(parser)
    parser.add_argument("--tokens", required=True, metavar="T",
                        help="tokens to train on: 2T, 300B, 50M (K, M, B, T: powers of ten)")
    parser.add_argument("--deadline", metavar="D", default=None,
                        help="train by this time (30d, 12h, 2w): per kind the smallest size "
                        "that does; without it, every size is a row")
    parser.add_argument("--clusters", metavar="A,B,...", default=None,
                        help="cluster kinds (built-in specs) to compare; default dgx-h100, "
                        "hgx-h200, dgx-b200, gb200-nvl72, mi300x")
    prices = parser.add_mutually_exclusive_group()
    prices.add_argument("--price", metavar="KIND=P,...", default=None,
                        help="price per device-hour of each kind, e.g. dgx-h100=2.10,dgx-b200=3.90")
    prices.add_argument("--prices", metavar="FILE.yaml", default=None,
                        help="a YAML mapping of kind to price per device-hour")
    parser.add_argument("--devices", metavar="LOW..HIGH", default="64..4096",
                        help="sizes tried: the powers of two in LOW..HIGH that a kind takes "
                        "(default 64..4096)")
    batch = parser.add_mutually_exclusive_group()
    batch.add_argument("--batch", type=count(1, MAX_BATCH), default=None,
                       help="global batch in sequences per step")
    batch.add_argument("--batch-tokens", metavar="T", default=None,
                       help="global batch in tokens per step (4M = 4·2^20, the default)")
    parser.add_argument("--seq", type=count(1, MAX_SEQ), default=None,
                        help="sequence length (default: the model's)")
    parser.add_argument("--time-budget", type=number(0, MAX_TIME_BUDGET_S, low_open=False),
                        default=None, metavar="S", help="bound each search to S seconds")
    parser.add_argument("--jobs", type=count(1, 1024), default=None, metavar="N",
                        help="worker processes, each planning whole cluster kinds (default: "
                        "one per CPU; 1 with --time-budget); the rows do not depend on it")
    parser.add_argument("--plot", metavar="PNG", type=output_path(".png"), default=None,
                        help="draw days against cost (the Pareto front) here")
    parser.add_argument("--html", metavar="PAGE", type=output_path(".html"), default=None,
                        help="write the table and the plot to one HTML page")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.set_defaults(func=run)
    return parser


def _prices(args: argparse.Namespace) -> dict[str, float]:
    from fxplan.compare import CompareError, parse_prices

    if args.prices is None:
        return parse_prices(args.price)
    import yaml

    from fxplan.core.files import read_text

    text = read_text(Path(args.prices), what="prices file",
                     error=lambda message: CompareError(f"--prices: {message}"))
    try:
        mapping = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise CompareError(f"--prices {args.prices}: not YAML ({err}); expected a mapping of "
                           "cluster kind to price per device-hour") from None
    return parse_prices(mapping=mapping, source=f"--prices {args.prices}")


def run(args: argparse.Namespace) -> int:
    from fxplan.batch_tokens import parse_batch_tokens
    from fxplan.compare import (DEFAULT_CLUSTERS, compare, parse_duration_days,
                                parse_size_range, parse_tokens)
    from fxplan.report.compare import plot_comparison, render_comparison, write_html

    tokens = parse_tokens(args.tokens)
    deadline = parse_duration_days(args.deadline) if args.deadline else None
    sizes = parse_size_range(args.devices)
    prices = _prices(args)
    kinds = ([k.strip() for k in args.clusters.split(",") if k.strip()] if args.clusters
             else list(DEFAULT_CLUSTERS))
    batch_tokens = None if args.batch else parse_batch_tokens(args.batch_tokens or "4M")
    result = compare(args.model, tokens=tokens, batch=args.batch, batch_tokens=batch_tokens,
                     seq=args.seq, clusters=kinds, sizes=sizes, prices=prices,
                     deadline_days=deadline, time_budget_s=args.time_budget,
                     jobs=args.jobs)
    written: list[str] = []
    png = Path(args.plot) if args.plot else None
    if args.html:
        png = png or Path(args.html).with_suffix(".png")
    if png is not None and result.rows:
        written.append(f"plot written to {plot_comparison(result, png)}")
        if args.html:
            written.append(f"page written to {write_html(result, args.html, png)}")
    if args.json:
        data = result.to_dict()
        data["written"] = written
        print(json.dumps(data, indent=2))
    else:
        render_comparison(result)
        for line in written:
            print(line)
    return 0
