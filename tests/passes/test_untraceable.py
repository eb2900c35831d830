"""An untraceable model gets a CaptureError naming the module, the source line and the
remedies, not fx's traceback."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from fxplan.passes.capture import CaptureError

from fxplan.api import capture


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        if x.sum() > 0:  # data-dependent branch
            return self.lin(x)
        return x


class ShapeLoop(nn.Module):
    def forward(self, x):
        out = x
        for i in range(x.size(0)):  # shape-dependent Python
            out = out + i
        return out


class Net(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 8)
        self.body = nn.Sequential(nn.Identity(), body)

    def forward(self, x):
        return self.body(self.stem(x))


@pytest.mark.parametrize("body, code, reason", [
    (DataDependent(), "if x.sum() > 0:  # data-dependent branch", "control flow"),
    (ShapeLoop(), "for i in range(x.size(0)):  # shape-dependent Python", "used as a Python int"),
])
def test_error_names_module_line_and_remedies(body, code, reason):
    # method="auto" would fall back to torch.export (tests/passes/test_capture_export.py)
    with pytest.raises(CaptureError) as err:
        capture(Net(body), inputs=torch.randn(4, 8), method="symbolic_trace")
    text = str(err.value)
    assert f"module 'body.1' ({type(body).__name__})" in text
    assert f"test_untraceable.py:" in text and f"`{code}`" in text
    assert reason in text
    for remedy in ("leaf_modules=", "concrete_args", "torch.fx.wrap"):
        assert remedy in text
    assert "Traceback" not in text and "symbolically traced variables" not in text
    assert err.value.module_path == "body.1"
    assert err.value.location.split(":")[-1].isdigit()


def test_shape_dependent_module_captures_as_a_leaf():
    graph = capture(Net(ShapeLoop()), inputs=torch.randn(4, 8), leaf_modules=[ShapeLoop])
    assert graph.leaf_modules == {"body.1": "ShapeLoop"}
    assert graph.info("body_1").shape == (4, 8)


def test_value_dependent_leaf_explains_why_fake_tensors_cannot_run_it():
    with pytest.raises(CaptureError) as err:
        capture(Net(DataDependent()), inputs=torch.randn(4, 8), leaf_modules=["body.1"])
    text = str(err.value)
    assert "node 'body_1'" in text and "`if x.sum() > 0:  # data-dependent branch`" in text
    assert "needs tensor values" in text and "torch.where" in text
