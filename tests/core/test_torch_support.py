"""The supported torch range: refused below, warned above, features detected by import."""

from __future__ import annotations

import warnings

import pytest

from fxplan.core import torch_support as ts


def test_versions_parse_with_local_and_pre_release_tags() -> None:
    assert ts.parse_version("2.11.0+cu130") == (2, 11, 0)
    assert ts.parse_version("2.13.0a0+git1234") == (2, 13, 0)
    assert ts.parse_version("2.12") == (2, 12, 0)
    with pytest.raises(ValueError):
        ts.parse_version("nightly")


def test_below_the_range_is_one_clear_refusal() -> None:
    with pytest.raises(ts.TorchVersionError) as err:
        ts.check_torch("2.10.1+cu126")
    text = str(err.value)
    assert "torch 2.10.1+cu126 is too old" in text and ts.supported_range() in text
    assert "\n" not in text


def test_inside_the_range_passes_and_above_it_warns() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ts.check_torch(f"{ts.OLDEST[0]}.{ts.OLDEST[1]}.0+cu130")
        assert ts.check_torch(f"{ts.NEWEST[0]}.{ts.NEWEST[1]}.0+cpu")
    with pytest.warns(UserWarning, match="newer than the newest release"):
        ts.check_torch(f"{ts.NEWEST[0]}.{ts.NEWEST[1] + 7}.0")


def test_the_installed_torch_is_in_the_range() -> None:
    installed = ts.installed_torch()
    assert installed is not None
    assert ts.OLDEST <= ts.parse_version(installed)[:2]


def test_a_missing_feature_is_refused_naming_what_needs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ts.FEATURES, "imaginary", ("torch", "no_such_attribute", "an imaginary API"))
    ts.torch_has.cache_clear()
    assert not ts.torch_has("imaginary")
    with pytest.raises(ts.TorchVersionError, match="an imaginary API"):
        ts.require("imaginary", "this plan")
    ts.torch_has.cache_clear()


def test_the_package_admits_every_supported_release_and_any_build_of_it() -> None:
    """``pip install -e .`` must keep a CUDA or ROCm torch of the range that is installed."""
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    (torch_req,) = [Requirement(r) for r in pyproject["project"]["dependencies"]
                    if Requirement(r).name == "torch"]
    spec = torch_req.specifier
    for version in ("2.11.0", "2.11.0+cu130", "2.12.1+rocm6.4", "2.13.0", "2.13.0+cpu"):
        assert spec.contains(version, prereleases=False), version
    assert not spec.contains("2.10.1")
    assert f">={ts.OLDEST[0]}.{ts.OLDEST[1]}" in str(spec)
