"""The sharding rules, one module per op family; importing this package registers them."""

from fxplan.sharding.rules import (  # noqa: F401
    attention,
    conv,
    embedding,
    indexing,
    loss,
    matmul,
    norm,
    pointwise,
    reduction,
    slicing,
    softmax,
    sources,
    views,
)
