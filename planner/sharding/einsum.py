"""Einsum-style strategies: one equation describes a whole family of ops.

For an equation ``"btk,nk->btn"`` every index letter yields one single-axis option:

* a letter kept in the output (a batch letter shared by several operands, or a free letter of
  one operand) — shard that dim in every operand holding the letter and in the output; the
  operands without it stay replicated (``S(0),R -> S(0)``: data parallel; ``R,S(0) -> S(2)``:
  column parallel);
* a contracted letter — shard it in every operand holding it; each rank then holds a partial
  sum, so the output is ``Partial`` (``S(2),S(1) -> P``: row parallel);

plus the all-replicated option. Which of these survive depends on the shapes (a dim must
divide by the axis size), checked later by :func:`~fxplan.sharding.expand.expand_options`.
"""

from __future__ import annotations

from fxplan.sharding.strategy import P, R, S, AxisOption

__all__ = ["parse_equation", "einsum_options"]


def parse_equation(equation: str) -> tuple[list[str], str]:
    """``"bk,kn->bn"`` → ``(["bk", "kn"], "bn")``, checking letters are unique per term."""
    lhs, arrow, out = equation.replace(" ", "").partition("->")
    if not arrow:
        raise ValueError(f"einsum equation {equation!r} needs an explicit '->' output")
    terms = lhs.split(",")
    for term in (*terms, out):
        if len(set(term)) != len(term):
            raise ValueError(f"einsum term {term!r} of {equation!r} repeats a letter (traces are not supported)")
    missing = set(out) - set("".join(terms))
    if missing:
        raise ValueError(f"output letters {sorted(missing)} of {equation!r} appear in no operand")
    return terms, out


def einsum_options(equation: str) -> list[AxisOption]:
    """The single-axis options of an einsum-like op (module docstring)."""
    terms, out = parse_equation(equation)
    options = [AxisOption(tuple(R for _ in terms), R)]
    for letter in dict.fromkeys("".join(terms) + out):
        inputs = tuple(S(term.index(letter)) if letter in term else R for term in terms)
        output = S(out.index(letter)) if letter in out else P
        options.append(AxisOption(inputs, output))
    return options
