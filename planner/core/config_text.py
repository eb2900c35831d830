"""A configuration's text: the one-line form, the edge to text — what ``fxplan estimate
--config`` takes, what :meth:`TextForm.parse` reads and :meth:`TextForm.to_string` writes::

    dp=24,tp=8,pp=8,mb=1,schedule=interleaved:2,zero=0,recompute=full,sp=off
    [,m=96][,stages=3/3/2/2][,recompute_layers=3/2/1/0][,zero_stages=3/3/1/1][,offload=optimizer]
    [,offload_stages=none/none/optimizer/optimizer]
    [,fp8=on][,cp=1][,ep=1][,tp_overlap=on][,pg_overlap=on]

— and the summary people read, :meth:`TextForm.summary`: ``pp=8 dp=24 tp=8 | zero=0 |
interleaved:2 mb=1×96 | recompute=full | sp=off``.
"""

from __future__ import annotations

from typing import Any

from fxplan.core.config_error import CostModelError
from fxplan.core.config_fields import ConfigSelf
from fxplan.core.config_ranks import RankViews
from fxplan.core.schedule import Schedule

__all__ = ["TextForm"]

_ON = ("on", "true", "yes", "1")
_OFF = ("off", "false", "no", "0")

#: ``parse`` keys → field names.
_KEYS: dict[str, str] = {
    "dp": "dp", "tp": "tp", "pp": "pp",
    "mb": "microbatch_size", "microbatch_size": "microbatch_size",
    "m": "num_microbatches", "microbatches": "num_microbatches",
    "num_microbatches": "num_microbatches",
    "schedule": "schedule", "zero": "zero_stage", "zero_stage": "zero_stage",
    "recompute": "recompute", "sp": "sequence_parallel", "sequence_parallel": "sequence_parallel",
    "stages": "stage_layers", "cp": "cp", "ep": "ep", "offload": "offload", "fp8": "fp8",
    "tp_overlap": "tp_comm_overlap", "tp_comm_overlap": "tp_comm_overlap",
    "pg_overlap": "param_gather_overlap", "param_gather_overlap": "param_gather_overlap",
    "recompute_layers": "recompute_layers", "zero_stages": "zero_stages",
    "offload_stages": "offload_stages",
}
#: The short keys the error messages list (the others in :data:`_KEYS` are their long names).
_KEY_NAMES = ("dp, tp, pp, mb, m, schedule, zero, recompute, sp, stages, recompute_layers, "
              "zero_stages, cp, ep, offload, offload_stages, fp8, tp_overlap, pg_overlap")


def _parse_bool(name: str, text: str) -> bool:
    """``text`` as a switch: on/true/yes/1 or off/false/no/0; else :class:`CostModelError`
    naming ``name``."""
    if text.lower() in _ON:
        return True
    if text.lower() in _OFF:
        return False
    raise CostModelError(f"{name}={text!r}: expected on or off")


def _parse_int(name: str, text: str) -> int:
    """``text`` as an integer; else :class:`CostModelError` naming ``name``."""
    try:
        return int(text)
    except ValueError:
        raise CostModelError(f"{name}={text!r}: expected an integer") from None


class TextForm(RankViews):
    """The text forms of a :class:`~fxplan.core.config.ParallelConfig`."""

    # -- text forms -----------------------------------------------------------------------
    @classmethod
    def parse(cls: type[ConfigSelf], text: str) -> ConfigSelf:
        """Read ``"dp=24,tp=8,pp=8,mb=1,schedule=interleaved:2,zero=0,recompute=full,sp=off"``.

        Keys: ``dp tp pp mb m schedule zero recompute sp stages`` (``stages=3/3/2/2``),
        ``recompute_layers`` (``recompute_layers=2/1/1/0``, with ``stages``), one entry per
        pipeline rank ``zero_stages`` (``zero_stages=3/3/1/1``) and ``offload_stages``
        (``offload_stages=optimizer/none/none/none``)
        and ``cp ep offload fp8 tp_overlap pg_overlap`` (``offload=optimizer``, ``fp8=on``,
        ``tp_overlap=on``, ``pg_overlap=on``; absent: 1, 1, ``none``, off, off, off); unknown or
        repeated keys are errors.
        """
        if not isinstance(text, str) or not text.strip():
            raise CostModelError(f"config {text!r}: expected key=value,... with keys "
                                 f"{_KEY_NAMES} (e.g. \"dp=4,tp=2,mb=1\")")
        values: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in text.replace(" ", ",").split(","))):
            key, sep, value = item.partition("=")
            key = key.strip().lower()
            if not sep or key not in _KEYS:
                raise CostModelError(
                    f"config {text!r}: cannot read {item!r}; expected key=value with keys "
                    f"{_KEY_NAMES}")
            name = _KEYS[key]
            if name in values:
                raise CostModelError(f"config {text!r}: {key} is given twice")
            value = value.strip()
            if name in ("sequence_parallel", "fp8", "tp_comm_overlap", "param_gather_overlap"):
                values[name] = _parse_bool(key, value)
            elif name == "offload":
                values[name] = value.lower()
            elif name == "offload_stages":
                values[name] = tuple(v.strip().lower() for v in value.split("/"))
            elif name in ("stage_layers", "recompute_layers", "zero_stages"):
                values[name] = tuple(_parse_int(key, v) for v in value.split("/"))
            elif name == "schedule":
                values[name] = Schedule.parse(value)
            elif name == "recompute":
                values[name] = value.lower()
            else:
                values[name] = _parse_int(key, value)
        return cls(**values)

    def to_string(self) -> str:
        """The :meth:`parse` form; round-trips every field but ``placements``, which it
        drops (they are a placement map, not part of the text form). ``cp``, ``ep``,
        ``offload`` and ``fp8`` are written only when they differ from their defaults, so the
        text of a configuration without them is what it was before they existed."""
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}", f"mb={self.microbatch_size}"]
        if self.num_microbatches is not None:
            parts.append(f"m={self.num_microbatches}")
        parts += [f"schedule={self.schedule}", f"zero={self.zero_stage}",
                  f"recompute={self.recompute}", f"sp={'on' if self.sequence_parallel else 'off'}"]
        if self.stage_layers is not None:
            parts.append("stages=" + "/".join(map(str, self.stage_layers)))
        if self.recompute_layers is not None:
            parts.append("recompute_layers=" + "/".join(map(str, self.recompute_layers)))
        if self.zero_stages is not None:
            parts.append(f"zero_stages={self.zero_text}")
        # an offload per pipeline rank is written as its list (offload, the highest, follows)
        parts += [f"{'offload_stages' if k == 'offload' and self.offload_stages else k}={v}"
                  for k, v in self.extras().items()]
        return ",".join(parts)

    def extras(self) -> dict[str, str]:
        """The fields beyond the classic ones that differ from their defaults, as text:
        ``{"cp": "2", "ep": "4", "offload": "optimizer", "fp8": "on"}``; an offload per
        pipeline rank as its list (:attr:`offload_text`, ``"optimizer/none"``)."""
        out: dict[str, str] = {}
        for name in ("cp", "ep"):
            if getattr(self, name) != 1:
                out[name] = str(getattr(self, name))
        if self.offload != "none":
            out["offload"] = self.offload_text
        if self.fp8:
            out["fp8"] = "on"
        if self.tp_comm_overlap:
            out["tp_overlap"] = "on"
        if self.param_gather_overlap:
            out["pg_overlap"] = "on"
        return out

    def summary(self, *, recompute: str | None = None) -> str:
        """``pp=8 dp=24 tp=8 | zero=0 | interleaved:2 mb=1×96 | recompute=full | sp=off``
        (``mb=1×?`` while ``num_microbatches`` is not resolved), then ``| offload=optimizer``
        and ``| fp8=on`` when set. ``recompute`` replaces the policy's name: a plan whose
        blocks recompute differently prints ``mixed``; a configuration that recomputes some
        layers per stage prints the policy and the counts, ``recompute=full:3/2/1/0``; a ZeRO
        stage or an offload per pipeline rank prints them all, ``zero=3/3/1/1``,
        ``offload=optimizer/none/none/none``."""
        m = "?" if self.num_microbatches is None else str(self.num_microbatches)
        extras = "".join(f" | {k}={v}" for k, v in self.extras().items())
        return (f"pp={self.pp} dp={self.dp} tp={self.tp} | zero={self.zero_text} | "
                f"{self.schedule} mb={self.microbatch_size}×{m} | "
                f"recompute={recompute or self.recompute_text} | "
                f"sp={'on' if self.sequence_parallel else 'off'}{extras}")

    @property
    def recompute_text(self) -> str:
        """``full``, or ``full:3/2/1/0`` with per-stage counts (``recompute_layers``)."""
        if self.recompute_layers is None:
            return self.recompute
        return f"{self.recompute}:{'/'.join(map(str, self.recompute_layers))}"

    def __str__(self) -> str:
        return self.summary()
