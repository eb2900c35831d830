"""The router's auxiliary loss of a Hugging Face mixture of experts (single process): with one
replica it is ``transformers``' own ``load_balancing_loss_func``; it is hooked only where the
config asks for the router logits, and refused under pipelining (never left out of the loss)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from fxplan.runtime.styles.router_aux import RouterAux, install_router_aux, with_router_aux  # noqa: E402


def test_one_replica_is_transformers_loss():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    generator = torch.Generator().manual_seed(0)
    logits = tuple(torch.randn(24, 6, generator=generator) for _ in range(3))   # 3 layers
    ours = RouterAux(experts=6, top_k=2, coef=0.1, group=None).local_aux(list(logits))
    theirs = load_balancing_loss_func(logits, 6, 2)
    assert float(ours) == pytest.approx(float(theirs), rel=1e-6)


def _mixtral(output_router_logits: bool):
    from rt_module_cases import MIXTRAL

    from fxplan.examples.model_spec import resolve_model
    from fxplan.runtime.apply.build import meta_parameters

    spec = MIXTRAL + (",output_router_logits=True,router_aux_loss_coef=0.1"
                      if output_router_logits else "")
    with meta_parameters():
        return resolve_model(spec).build("cpu")


def test_hooked_where_the_config_asks_and_not_under_pipelining():
    """Under pipelining the auxiliary loss cannot be computed: refused, never left out of the
    loss (which trained another loss than one process, with only a fallback line)."""
    from fxplan.runtime.apply.offload import RuntimeSupportError

    fallbacks: list[str] = []
    assert install_router_aux(_mixtral(False), None, False, fallbacks) is None
    assert install_router_aux(_mixtral(False), None, True, fallbacks) is None
    with pytest.raises(RuntimeSupportError, match=r"auxiliary loss.*--constrain pp=1"):
        install_router_aux(_mixtral(True), None, True, fallbacks)
    model = _mixtral(True)
    aux = install_router_aux(model, None, False, fallbacks)
    assert isinstance(aux, RouterAux) and (aux.experts, aux.top_k, aux.coef) == (4, 2, 0.1)
    assert not fallbacks

    def plain(output, target):
        return output.sum() * 0

    assert with_router_aux(plain, [_mixtral(False)]) is plain
    loss = with_router_aux(plain, [model])
    aux.value = torch.tensor(2.0)
    assert float(loss(torch.zeros(3), None)) == pytest.approx(0.2)   # + coef · aux
    with pytest.raises(RuntimeError, match="no router_logits"):
        loss(torch.zeros(3), None)   # taken: each forward's value is used once
