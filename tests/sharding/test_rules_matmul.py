"""Matmul-family rules: einsum options give batch, column, row (→ Partial) and replicated
strategies, for nn.Linear and its functional forms, matmul with broadcasting, bmm, addmm."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from fxplan.sharding import OpStrategy, describe_module, einsum_options
from fxplan.sharding.rules.matmul import matmul_equation


class _Wrap(nn.Module):
    """Keeps ``inner`` a ``call_module`` leaf of the traced graph."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def test_einsum_options_cover_batch_free_and_contracted_letters() -> None:
    options = {str(OpStrategy.from_axes([o])) for o in einsum_options("mk,kn->mn")}
    assert options == {
        "R, R -> R",
        "S(0), R -> S(0)",  # rows of the left operand
        "S(1), S(0) -> P",  # contracted: partial sums
        "R, S(1) -> S(1)",  # columns of the right operand
    }


def test_linear_module_has_data_column_and_row_parallel_strategies() -> None:
    table = describe_module(_Wrap(nn.Linear(16, 32)), (4,), x=(8, 4, 16))
    assert set(table["inner"]) == {
        "R, R, R -> R",
        "S(0), R, R -> S(0)",  # batch
        "S(1), R, R -> S(1)",  # sequence
        "R, S(0), S(0) -> S(2)",  # column parallel: weight rows and bias sharded
        "S(2), S(1), R -> P",  # row parallel: partial output, bias added once
    }


class _FunctionalLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(32, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


def test_functional_linear_matches_the_module_rule() -> None:
    table = describe_module(_FunctionalLinear(), (4,), x=(8, 16))
    assert set(table["linear"]) == {"R, R -> R", "S(0), R -> S(0)", "R, S(0) -> S(1)", "S(1), S(1) -> P"}
    assert set(table["weight"]) == {" -> R", " -> S(0)", " -> S(1)"}  # a get_attr: any layout


class _MatMul(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a @ b) + torch.bmm(a[0], b[0])


def test_matmul_with_broadcast_batch_dims() -> None:
    assert matmul_equation((8, 4, 64, 16), (8, 4, 16, 64)) == "abmk,abkn->abmn"
    assert matmul_equation((8, 64, 64), (64, 32)) == "amk,kn->amn"
    # a size-1 batch dim broadcast against 7: only the operand that has 7 is sharded on it
    assert matmul_equation((1, 4, 3, 5), (7, 1, 5, 2)) == "acmk,bdkn->bcmn"
    assert matmul_equation((3, 5), (5,)) == "mk,k->m"


def test_matmul_and_bmm_strategies() -> None:
    table = describe_module(_MatMul(), (4,), a=(2, 4, 8, 16), b=(2, 4, 16, 8))
    assert "S(1), S(1) -> S(1)" in table["matmul"]  # heads
    assert "S(3), S(2) -> P" in table["matmul"]  # contracted
    assert "R, S(3) -> S(3)" in table["matmul"]
    assert set(table["bmm"]) >= {"S(0), S(0) -> S(0)", "S(2), S(1) -> P", "S(1), R -> S(1)"}


class _AddMM(nn.Module):
    def forward(self, c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.addmm(c, a, b)


def test_addmm_bias_follows_the_output_with_broadcasting() -> None:
    table = describe_module(_AddMM(), (4,), c=(8,), a=(4, 16), b=(16, 8))
    assert set(table["addmm"]) == {"R, R, R -> R", "R, S(0), R -> S(0)", "S(0), R, S(1) -> S(1)",
                                   "P, S(1), S(0) -> P"}


def test_two_axis_mesh_combines_options_and_checks_divisibility() -> None:
    strategies = describe_module(_Wrap(nn.Linear(16, 30)), (2, 4), x=(8, 16))["inner"]
    assert "S(0)R, RS(0), RS(0) -> S(0)S(1)" not in strategies  # 30 columns do not divide by 4
    assert "S(0)S(1), RS(1), RR -> S(0)P" in strategies  # batch over axis 0, row parallel over 1
    assert "RS(0), S(0)R, S(0)R -> S(1)S(0)" in strategies  # columns over axis 0 (30 / 2)
