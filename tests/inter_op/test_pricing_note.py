"""The note on which layout priced a finalist reads as information, with formatted times."""

from __future__ import annotations

from types import SimpleNamespace

from fxplan.core.config import ParallelConfig
from fxplan.inter_op.pricing import INTRA_OP, MEGATRON, Priced, _why


def _priced(layout: str, step: float) -> Priced:
    config = ParallelConfig.parse("dp=2,tp=2,pp=1,mb=1,schedule=1f1b").resolve(8)
    return Priced(config, SimpleNamespace(step_time_s=step, fits=True), None, layout, "")  # type: ignore[arg-type]


def test_megatron_kept_note_is_worded_as_information() -> None:
    best, other = _priced(MEGATRON, 0.0222788), _priced(INTRA_OP, 0.0262524)
    note = _why(best, [best, other], SimpleNamespace(priced=True), [])
    assert "22.3 ms against 26.3 ms" in note and "0.0222788" not in note
    assert note.endswith("without the pipeline)") and "is kept:" not in note
    assert "the plan carries the default Megatron layout, as it prices faster" in note
