"""Which peak an op runs against, and what fraction of it it reaches.

An op of class ``c`` (a :class:`passes.capture.NodeInfo` ``op_class``) belongs to a *family*
(``matmul``, ``attention``, ``conv``, ``memory``, ``embedding``; the table
``op_class_family`` in ``cost_model/data/efficiency.json``). Each family has two legs, each a
saturating curve in the op's work:

    e_c(F) = c_max · F / (F + F_half)      compute leg, F = FLOPs
    e_m(B) = m_max · B / (B + B_half)      memory leg,  B = bytes read + written

``F_half``/``B_half`` are the work at which half of the maximum is reached (small kernels do
not fill the device). Note that F / (P · e_c(F)) = (F + F_half) / (P · c_max): the curve is a
fixed latency ``F_half / (P · c_max)`` added to the asymptotic time, so a small op pays it on
top of the kernel launch floor.

Where the maxima come from, first found wins:

- compute leg, ``c_max``: ``device.compute_efficiency[c]``, then ``[family]``, then the data
  file (only compute-bound families take the spec's value for the compute leg);
- memory leg, ``m_max``: for memory-bound families ``device.compute_efficiency[c]``,
  ``[family]``, then ``["memory_bound"]``; for compute-bound families ``["memory_bound"]``;
  then the data file.
- the kernels of an op's backward look the same keys up in ``device.backward_efficiency``
  first (a spec that measured its backward kernels apart, as ``local-cpu`` does), then as
  above.

The curve shapes (``F_half``, ``B_half``) are data, per device model (the longest key of the
data file's ``devices`` contained in the normalised model name, else ``cpu`` for CPU devices
and ``default`` for the others).

Peaks: tensor-core families (matmul, attention, conv) run at ``peak_tflops[dtype]``, with
fp32 promoted to tf32 when TF32 is allowed and the device lists it, and a 16-bit dtype the
device lacks priced at its 16-bit twin (:func:`fxplan.cluster_specs.group_precision`: a V100
group of a heterogeneous cluster trains a bf16 model in fp16). PyTorch's defaults are
made explicit here: ``torch.backends.cuda.matmul.allow_tf32`` is ``False`` (fp32 matmuls and
attention use the fp32 peak) while ``torch.backends.cudnn.allow_tf32`` is ``True`` (fp32
convolutions use tf32). Other families run on the vector units at the fp32 peak whatever
their dtype (they are memory-bound in practice).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from fxplan.cluster_specs.precision import group_precision

__all__ = [
    "Curve",
    "EfficiencyModel",
    "dtype_key",
    "family_of",
    "load_efficiency",
    "normalise_model",
]

DATA_FILE = Path(__file__).parents[1] / "data" / "efficiency.json"

#: ``dtype_key`` results that name a floating-point peak of ``DeviceGroup.peak_tflops``.

_DTYPE_ALIASES: dict[str, str] = {
    "float32": "fp32", "float": "fp32", "fp32": "fp32", "f32": "fp32",
    "tf32": "tf32",
    "bfloat16": "bf16", "bf16": "bf16",
    "float16": "fp16", "half": "fp16", "fp16": "fp16", "f16": "fp16",
    "fp8": "fp8",
}

#: ``allow_tf32=None`` means PyTorch's default for the family (see the module docstring).
TORCH_DEFAULT_TF32: dict[str, bool] = {"matmul": False, "attention": False, "conv": True}


def dtype_key(dtype: Any) -> str:
    """``torch.bfloat16`` / ``"bfloat16"`` / ``"bf16"`` → ``"bf16"``; integers and bools →
    ``"int"``; float8 variants → ``"fp8"``; ``float64`` → ``"fp64"``; complex numbers → the
    precision of their parts (``complex64`` → ``"fp32"``)."""
    text = str(dtype).lower().removeprefix("torch.")
    if text in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[text]
    if text.startswith("float8"):
        return "fp8"
    if text in ("float64", "double", "fp64"):
        return "fp64"
    if text.startswith(("int", "uint", "bool", "long")):
        return "int"
    if text.startswith("complex"):  # pairs of reals (rotary embeddings written with complex)
        return {"complex32": "fp16", "complex64": "fp32"}.get(text, "fp64")
    raise ValueError(f"unknown dtype {dtype!r}: expected a torch dtype or one of {sorted(_DTYPE_ALIASES)}")


def normalise_model(model: str) -> str:
    """``"NVIDIA A100-SXM4-80GB"`` → ``"nvidiaa100sxm480gb"``: lower case, letters and digits."""
    return re.sub(r"[^a-z0-9]", "", model.lower())


@dataclass(frozen=True)
class Curve:
    """``eff(w) = eff_max · w / (w + half)``; ``half == 0`` is a flat ``eff_max``."""

    eff_max: float
    half: float

    def __call__(self, work: float) -> float:
        if work <= 0:
            return self.eff_max
        return self.eff_max * work / (work + self.half)


@dataclass(frozen=True)
class EfficiencyModel:
    """The parsed data file: family facts, op class → family, per-device curve parameters."""

    families: Mapping[str, Mapping[str, Any]]
    op_class_family: Mapping[str, str | None]
    devices: Mapping[str, Mapping[str, Mapping[str, float]]]

    def curves(self, device: Any, op_class: str, backward: bool = False) -> tuple[Curve, Curve]:
        """(compute curve, memory curve) of ``op_class`` on ``device`` (a ``DeviceGroup``);
        ``backward=True``: of the kernels of an op's backward, whose maxima the device's
        ``backward_efficiency`` may set (key by key, before ``compute_efficiency``)."""
        c_keys, m_keys = self.spec_keys(op_class)
        params = self._device_params(device)[family_of(op_class, self)]
        spec: Mapping[str, float] = getattr(device, "compute_efficiency", {}) or {}
        c_max = _first(spec, c_keys, params["compute_eff_max"])
        m_max = _first(spec, m_keys, params["memory_eff_max"])
        if backward:
            spec_bwd: Mapping[str, float] = getattr(device, "backward_efficiency", {}) or {}
            c_max = _first(spec_bwd, c_keys, c_max)
            m_max = _first(spec_bwd, m_keys, m_max)
        return Curve(c_max, params["half_flops"]), Curve(m_max, params["half_bytes"])

    def spec_keys(self, op_class: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The keys of a spec's ``compute_efficiency`` (and ``backward_efficiency``) that set
        ``op_class``'s maxima, each in the order they are read, the first present winning:
        ``(compute curve's, memory curve's)``. A compute-bound class reads its own name, then
        its family's, for the compute curve and ``memory_bound`` for the memory one; a
        memory-bound class has no compute keys and reads its name, its family's, then
        ``memory_bound``."""
        family = family_of(op_class, self)
        if family is None:
            raise ValueError(f"op class {op_class!r} runs no kernel and has no efficiency curve")
        if self.families[family]["bound"] == "compute":
            return (op_class, family), ("memory_bound",)
        return (), (op_class, family, "memory_bound")

    def peak_flops(self, device: Any, op_class: str, dtype: Any, allow_tf32: bool | None = None) -> float:
        """FLOP/s the compute leg of ``op_class`` runs against (see the module docstring)."""
        family = family_of(op_class, self)
        key = dtype_key(dtype)
        peaks: Mapping[str, float] = device.peak_tflops
        if family is None or not self.families[family]["tensor_cores"]:
            key = "fp32"
        elif key == "fp32":
            tf32 = TORCH_DEFAULT_TF32.get(family, False) if allow_tf32 is None else allow_tf32
            if tf32 and getattr(device, "kind", "gpu") == "gpu" and "tf32" in peaks:
                key = "tf32"
        if key not in peaks:
            key = group_precision(device, key) or key   # a V100 trains a bf16 model in fp16
        if key not in peaks:
            listed = ", ".join(peaks)
            raise ValueError(
                f"{device.model} lists no peak for {key!r} (dtype {dtype}); it lists {listed}"
            )
        return peaks[key] * 1e12

    def _device_params(self, device: Any) -> Mapping[str, Mapping[str, float]]:
        """The longest ``devices`` key contained in the normalised model name; else ``cpu``
        for CPU devices (their model is the processor's name) and ``default`` for the rest."""
        name = normalise_model(device.model)
        matches = [key for key in self.devices if key not in ("default", "cpu") and normalise_model(key) in name]
        if matches:
            return self.devices[max(matches, key=len)]
        return self.devices["cpu" if getattr(device, "kind", "gpu") == "cpu" else "default"]


def family_of(op_class: str, model: EfficiencyModel | None = None) -> str | None:
    """The efficiency family of a NodeInfo ``op_class`` (``None`` for ``view``: no kernel)."""
    table = (model or load_efficiency()).op_class_family
    if op_class not in table:
        raise ValueError(f"unknown op class {op_class!r}; known: {', '.join(table)}")
    return table[op_class]


def _first(mapping: Mapping[str, float], keys: tuple[str, ...], default: float) -> float:
    for key in keys:
        if key in mapping:
            return float(mapping[key])
    return float(default)


@lru_cache(maxsize=4)
def load_efficiency(path: str | Path = DATA_FILE) -> EfficiencyModel:
    """Parse (once) the efficiency data file; see ``docs/cost_model.md``."""
    raw = json.loads(Path(path).read_text())
    if raw.get("format_version") != 1:
        raise ValueError(f"{path}: unsupported efficiency format_version {raw.get('format_version')!r}")
    return EfficiencyModel(raw["families"], raw["op_class_family"], raw["devices"])
