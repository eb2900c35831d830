"""The runnable program ``fxplan plan --emit program.py`` writes.

A short script that embeds the plan (its JSON) and trains it exactly as ``fxplan launch``
does, through the same entry point, :func:`fxplan.worker.main` (the process ``fxplan launch``
starts on every rank), so flags and defaults are the launch's (``--data`` required;
``--steps 10``, ``--seed 0``, AdamW at ``--lr 1e-3`` …; ``--run-dir`` defaults to
``runs/<program name>``). Run it under torchrun on the plan's cluster::

    torchrun --nnodes=1 --nproc-per-node=4 program.py --data synthetic --steps 20

Below the code, the planned program is printed as comments to read: the model's fx code per
stage with every planned placement annotated (:func:`fxplan.passes.rewrite.emit.emit_program`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["runnable_program"]

_TEMPLATE = '''#!/usr/bin/env python3
"""fxplan program: {summary}

{model} on {cluster}, batch {batch}; {world} ranks ({nnodes} node(s) x {nproc}).
Trains like `fxplan launch` (same entry point, flags and defaults); run it under torchrun:

    torchrun --nnodes={nnodes} --nproc-per-node={nproc} {name} --data synthetic --steps 20

(--data tokens.bin | synthetic | data.py:build is required; --help lists the other flags.)
The planned program, per stage with its placements, follows the code as comments.
"""

import os
import sys

from fxplan.core.plan import Plan
from fxplan.worker import main

PLAN_JSON = {plan_json}


if __name__ == "__main__":
    argv = sys.argv[1:]
    if not any(a == "--run-dir" or a.startswith("--run-dir=") for a in argv):
        argv += ["--run-dir", os.path.join("runs", os.path.splitext(os.path.basename(__file__))[0])]
    sys.exit(main(argv, plan=Plan.from_json(PLAN_JSON, source=__file__)))

# ---------------------------------------------------------------------------------------------
# The planned program (to read):
{listing}
'''


def runnable_program(plan: Plan, listing: str, *, name: str = "program.py",
                     nnodes: int = 1, nproc: int | None = None) -> str:
    """The program's source (module docstring); ``listing`` is the annotated fx code, put in
    as comments."""
    text = json.dumps(plan.to_dict(), indent=2, ensure_ascii=False)
    # readable as a raw triple-quoted string unless the JSON holds a quote triple or a backslash
    literal = repr(text) if '"""' in text or "\\" in text else f'r"""\n{text}\n"""'
    return _TEMPLATE.format(
        summary=plan.summary, model=plan.model, cluster=plan.cluster, batch=plan.batch,
        world=plan.world_size, nnodes=nnodes, nproc=nproc or plan.world_size // nnodes,
        name=name, plan_json=literal,
        listing="\n".join(line if line.startswith("#") else f"#   {line}" if line else "#"
                           for line in listing.splitlines()))
