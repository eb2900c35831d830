"""``fxplan doctor``: check this machine's set-up, one line per check.

    fxplan doctor            a table: check, status (ok / warn / fail), detail
    fxplan doctor --json     the same as JSON

Checks fxplan and Python; torch, its build, the features that arrived inside the supported
range, and ``torch.distributed`` with gloo and NCCL; the CUDA devices; CPU cores and memory;
which built-in cluster spec describes this machine; the op database for its device; and the
optional extras (``transformers``, OR-Tools, HiGHS).
Every check catches its own exceptions and reports them as ``fail``: the doctor itself never
crashes. Exit code 0 when no check fails, 1 when one does (the last line names them).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Check:
    """The outcome of one check: ``status`` is ok, warn or fail; ``detail`` one line."""

    name: str
    status: str
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Devices:
    """What the checks learned of the accelerators (filled by :func:`_check_cuda`)."""

    names: tuple[str, ...] = ()
    memory_gib: tuple[float, ...] = ()


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "doctor", help="check torch, distributed backends, devices, cluster spec and op database",
        description="Check this machine's set-up: fxplan, Python, torch and its build, "
        "torch.distributed with gloo and NCCL, visible CUDA devices, CPU cores and memory, the "
        "built-in cluster spec that matches this machine, the op database for its device, and "
        "the optional extras. Exit code 1 when a check fails.")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)
    return parser


# -- the checks -------------------------------------------------------------------------------
def _check_fxplan() -> Check:
    from pathlib import Path

    import fxplan

    where = str(Path(fxplan.__file__).resolve().parent)
    return Check("fxplan", OK, f"{fxplan.__version__} at {where}",
                 {"version": fxplan.__version__, "location": where})


def _check_python() -> Check:
    version = platform.python_version()
    status = OK if sys.version_info >= (3, 10) else FAIL
    detail = f"{version} ({platform.python_implementation()}) at {sys.executable}"
    if status == FAIL:
        detail += "; fxplan needs Python ≥ 3.10"
    return Check("Python", status, detail, {"version": version, "executable": sys.executable})


def _check_torch() -> Check:
    import torch

    from fxplan.core.torch_support import NEWEST, TorchVersionError, check_torch, parse_version, \
        supported_range

    cuda, hip = torch.version.cuda, getattr(torch.version, "hip", None)
    build = f"CUDA {cuda} build" if cuda else f"ROCm {hip} build" if hip else "CPU-only build"
    data = {"version": torch.__version__, "cuda": cuda, "hip": hip,
            "supported": supported_range()}
    try:
        check_torch(torch.__version__)
    except TorchVersionError as err:
        return Check("torch", FAIL, f"{torch.__version__}, {build}: {err}", data)
    if parse_version(torch.__version__)[:2] > NEWEST:
        return Check("torch", WARN, f"{torch.__version__}, {build}: newer than the releases "
                     f"fxplan was tested with ({supported_range()})", data)
    return Check("torch", OK, f"{torch.__version__}, {build} (supported: {supported_range()})", data)


def _check_torch_features() -> Check:
    """The features that arrived inside the supported range (``torch_support.FEATURES``,
    detected by import): ``warn`` naming those this torch lacks, whose plans are refused
    before training and left out by the search."""
    from fxplan.core.torch_support import FEATURES, torch_has

    data = {name: torch_has(name) for name in FEATURES}
    missing = [name for name, present in data.items() if not present]
    if not missing:
        return Check("torch features", OK, f"all {len(FEATURES)} that arrived inside the "
                     f"supported range: {', '.join(FEATURES)}", data)
    return Check("torch features", WARN, f"this torch lacks {len(missing)} of {len(FEATURES)}: "
                 + "; ".join(f"{name}, {FEATURES[name][2]}" for name in missing)
                 + ". Plans that need them are refused before training, and the search leaves "
                 "them out", data)


def _check_distributed() -> Check:
    import torch.distributed as dist

    if not dist.is_available():
        return Check("torch.distributed", FAIL, "not available in this torch build: "
                     "fxplan launch and multi-rank plans cannot run", {"available": False})
    return Check("torch.distributed", OK, "available", {"available": True})


def _check_gloo() -> Check:
    import torch.distributed as dist

    if dist.is_available() and dist.is_gloo_available():
        return Check("gloo", OK, "available (CPU ranks, local-cpu)", {"available": True})
    status = WARN if dist.is_available() and dist.is_nccl_available() else FAIL
    return Check("gloo", status, "not available: CPU ranks (local-cpu) cannot run",
                 {"available": False})


def _check_nccl() -> Check:
    import torch
    import torch.distributed as dist

    available = dist.is_available() and dist.is_nccl_available()
    if not available:
        if torch.cuda.is_available():
            return Check("NCCL", WARN, "not available although CUDA devices are visible: "
                         "GPU ranks fall back to gloo", {"available": False})
        return Check("NCCL", OK, "not available (no CUDA; gloo is used)", {"available": False})
    version = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    detail = f"available, version {version}" if version else "available (no CUDA device visible)"
    # On a ROCm build torch's "nccl" backend is RCCL (AMD's NCCL), which GPU ranks then run.
    library = "rccl" if getattr(torch.version, "hip", None) else "nccl"
    if library == "rccl":
        detail += " — RCCL: the nccl backend of this ROCm build of torch"
    return Check("NCCL", OK, detail, {"available": True, "version": version, "library": library})


def _check_cuda(devices: list[Devices]) -> Check:
    import torch

    from fxplan.core.units import binary_bytes

    if not torch.cuda.is_available():
        built = torch.version.cuda is not None
        status = WARN if built else OK
        detail = ("none (CUDA build, but no device visible: check the driver and "
                  "CUDA_VISIBLE_DEVICES)" if built else "none (CPU)")
        return Check("CUDA devices", status, detail, {"count": 0})
    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    names = tuple(p.name for p in props)
    devices[0] = Devices(names, tuple(p.total_memory / 2 ** 30 for p in props))
    groups: dict[str, list[Any]] = {}
    for p in props:
        groups.setdefault(f"{p.name} ({binary_bytes(p.total_memory)})", []).append(p)
    detail = f"{len(props)}: " + ", ".join(f"{len(v)}× {k}" for k, v in groups.items())
    return Check("CUDA devices", OK, detail,
                 {"count": len(props), "names": list(names),
                  "memory_bytes": [p.total_memory for p in props]})


def _check_cpu() -> Check:
    from fxplan.core.units import binary_bytes
    from fxplan.cluster_specs.local_cpu import cpu_cores, cpu_model, memory_gib

    cores, memory = cpu_cores(), memory_gib()
    return Check("CPU", OK, f"{cores} cores usable, {binary_bytes(memory * 2 ** 30)} memory; "
                 f"{cpu_model()}", {"cores": cores, "memory_gib": memory, "model": cpu_model()})


def _gpu_family(model: str) -> str | None:
    """The family token of a GPU name: ``NVIDIA H100 80GB HBM3`` → ``h100``."""
    match = re.search(r"\b([a-z]{1,2}\d{2,3})[a-z]?\b", model.lower().replace("-", " "))
    return match[1] if match else None


def _check_cluster_spec(devices: list[Devices]) -> Check:
    from fxplan.cluster_specs import Cluster, available_specs
    from fxplan.cluster_specs.local_cpu import cpu_cores

    found = devices[0]
    if not found.names:
        spec = f"local-cpu:devices={cpu_cores()}"
        Cluster.load(spec)  # a spec that does not load is a failure of this check
        return Check("cluster spec", OK, f"{spec} (CPU ranks on gloo)", {"spec": spec})
    from fxplan.cost_model.compute.efficiency import normalise_model

    family, count = _gpu_family(found.names[0]), len(found.names)
    memory, gpu_name = min(found.memory_gib), normalise_model(found.names[0])
    same_model: list[tuple[bool, str]] = []  # (the name differs from the GPU's, spec)
    exact: list[tuple[bool, str]] = []
    for name in available_specs():
        if name == "local-cpu":
            continue
        cluster = Cluster.load(name)
        if len(cluster.device_groups) != 1:
            continue
        group = cluster.device_groups[0]
        # Same family (h100, a100) and memory within 10 %: the driver reports a little less
        # than the marketed size (80 GB → 79.1 GiB), and the size tells A100 40 GB from 80 GB.
        if (group.kind == "gpu" and _gpu_family(group.model) == family
                and abs(memory - group.memory_gib) <= 0.1 * group.memory_gib):
            # the spec whose model is spelled in the GPU's name first (SXM4 before PCIe)
            entry = (normalise_model(group.model) not in gpu_name, name)
            same_model.append(entry)
            if group.nodes == 1 and group.devices_per_node == count:
                exact.append(entry)
    if exact:
        names = [name for _, name in sorted(exact)]
        return Check("cluster spec", OK, f"{names[0]} ({count}× {found.names[0]})",
                     {"spec": names[0], "also": names[1:]})
    if same_model:
        spec = f"{min(same_model)[1]}:nodes=1,devices_per_node={count}"
        return Check("cluster spec", WARN, f"no spec with {count} of these devices; {spec} "
                     f"describes this machine (check it with `fxplan clusters --show {spec}`)",
                     {"spec": spec})
    return Check("cluster spec", WARN, f"none matches {count}× {found.names[0]}; write one with "
                 "`fxplan clusters --show` (start from the closest built-in spec)", {"spec": None})


def _check_op_database(devices: list[Devices]) -> Check:
    from fxplan.cluster_specs.local_cpu import cpu_model
    from fxplan.cost_model.compute.op_database import find_database_file

    model = devices[0].names[0] if devices[0].names else cpu_model()
    path = find_database_file(model)
    if path is None:
        return Check("op database", WARN, f"none for {model}: roofline only; "
                     "`fxplan profile` measures one", {"device_model": model, "path": None})
    return Check("op database", OK, f"{path} ({model})", {"device_model": model, "path": path})


def _check_transformers() -> Check:
    from importlib import metadata

    try:
        version = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return Check("transformers", WARN, "not installed: hf: model specs unavailable "
                     "(pip install 'fxplan[hf]')", {"version": None})
    return Check("transformers", OK, f"{version} (hf: model specs)", {"version": version})


def _check_ortools() -> Check:
    from importlib import metadata

    version = metadata.version("ortools")
    return Check("OR-Tools", OK, f"{version} (CP-SAT placement solver)", {"version": version})


def _check_highs() -> Check:
    from ortools.math_opt.python import mathopt

    model = mathopt.Model(name="doctor")
    x = model.add_binary_variable(name="x")
    model.maximize(x)
    result = mathopt.solve(model, mathopt.SolverType.HIGHS)
    if result.termination.reason != mathopt.TerminationReason.OPTIMAL:
        return Check("HiGHS", WARN, f"ortools.math_opt could not solve a one-variable model "
                     f"({result.termination.reason.name}); the CP-SAT backend is used",
                     {"available": False})
    return Check("HiGHS", OK, "available through ortools.math_opt (placement ILP)",
                 {"available": True})


def _run_one(name: str, check: Callable[[], Check]) -> Check:
    """``check()``, or a ``fail`` that says what it raised."""
    try:
        return check()
    except Exception as err:  # noqa: BLE001 — the doctor reports, it does not crash
        reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return Check(name, FAIL, f"{type(err).__name__}: {reason}".rstrip(": "), {"error": repr(err)})


def run_checks() -> list[Check]:
    """Every check, in the order the table shows them."""
    devices = [Devices()]  # filled by the CUDA check, read by the spec and database checks
    checks: list[tuple[str, Callable[[], Check]]] = [
        ("fxplan", _check_fxplan),
        ("Python", _check_python),
        ("torch", _check_torch),
        ("torch features", _check_torch_features),
        ("torch.distributed", _check_distributed),
        ("gloo", _check_gloo),
        ("NCCL", _check_nccl),
        ("CUDA devices", lambda: _check_cuda(devices)),
        ("CPU", _check_cpu),
        ("cluster spec", lambda: _check_cluster_spec(devices)),
        ("op database", lambda: _check_op_database(devices)),
        ("transformers", _check_transformers),
        ("OR-Tools", _check_ortools),
        ("HiGHS", _check_highs),
    ]
    return [_run_one(name, check) for name, check in checks]


def summary(checks: list[Check]) -> str:
    """The last line: all fine, or which checks failed (and how many warned)."""
    failed = [c.name for c in checks if c.status == FAIL]
    warned = sum(c.status == WARN for c in checks)
    warnings = f"{warned} warning{'s' if warned != 1 else ''}"
    if failed:
        return (f"{len(failed)} check{'s' if len(failed) != 1 else ''} failed: "
                f"{', '.join(failed)} ({warnings})")
    return f"no check failed ({warnings})"


def run(args: argparse.Namespace) -> int:
    checks = run_checks()
    failed = any(c.status == FAIL for c in checks)
    if args.json:
        print(json.dumps({"ok": not failed, "checks": [asdict(c) for c in checks]}, indent=2))
        return 1 if failed else 0
    from rich.table import Table

    from fxplan.report.console import console

    style = {OK: "green", WARN: "yellow", FAIL: "bold red"}
    table = Table(title="fxplan doctor", title_justify="left")
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for c in checks:
        table.add_row(c.name, f"[{style[c.status]}]{c.status}[/]", c.detail)
    out = console()
    out.print(table)
    out.print(summary(checks), markup=False)
    return 1 if failed else 0
