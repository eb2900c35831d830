"""``fxplan.core.units``: numbers for people, never a raw float."""

from __future__ import annotations

from fxplan.core.units import binary_bytes, gib, percent, seconds


def test_seconds_pick_a_unit_and_hide_float_noise() -> None:
    assert seconds(0.0222788) == "22.3 ms" and seconds(8.718) == "8.72 s"
    assert seconds(3e-6) == "3 µs" and seconds(1.421e-14) == "0 s"
    assert seconds(0.5, sign=True) == "+500 ms" and seconds(-0.0229, sign=True) == "-22.9 ms"
    assert seconds(123456) == "123456 s"           # no exponent


def test_percent_and_memory() -> None:
    assert percent(0.3061) == "30.6 %" and percent(0.021, sign=True) == "+2.1 %"
    assert gib(36.62) == "36.6 GiB" and gib(0.25) == "256 MiB"
    assert binary_bytes(1000 * 2 ** 30) == "1000 GiB"   # not 1e+03 GiB
