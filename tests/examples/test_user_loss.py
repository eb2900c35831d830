"""The loss and targets of a user-file model (``fxplan.examples.user_loss``): the file's own
``loss(outputs, batch)`` or the default, targets named by ``build()`` or derived from the output,
shapes checked at capture, the loss in the graph the search prices, inputs bound by name."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from fxplan.api import capture
from fxplan.examples.model_spec import resolve_model
from fxplan.examples.user_loss import LossShapeError
from fxplan.passes.forward_swap import forward_taking
from fxplan.runtime.train.data import SyntheticData

MODELS = Path(__file__).resolve().parents[1] / "runtime" / "models"
NANOGPT = f"{MODELS / 'nanogpt_style.py'}:build"


def _file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "model.py"
    path.write_text("import torch\nfrom torch import nn\nfrom torch.nn import functional as F\n"
                    + textwrap.dedent(body))
    return f"{path}:build"


def _linear(tmp_path: Path, outputs: int, forward: str, rest: str) -> str:
    """A file whose model is one ``nn.Linear(8, outputs)``, its forward returning ``forward``
    (of ``self.fc(x)``), and ``rest`` (the build function, a loss)."""
    return _file(tmp_path, f"""
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, {outputs})
    def forward(self, x):
        return {forward}
""" + textwrap.dedent(rest))


def _ops(graph) -> list[str]:
    return [str(n.target) for n in graph.gm.graph.nodes if n.op == "call_function"]


def test_the_default_loss_is_in_the_graph_the_search_prices():
    """nanoGPT-style (the loss is the caller's): the graph ends in the cross-entropy over every
    position, priced; without the targets it ends at the logits."""
    bundle = resolve_model(NANOGPT)
    with_loss = capture(bundle, batch=2)
    logits_only = capture(bundle, inputs=bundle.example_inputs(2, with_targets=False))
    assert with_loss.inputs["targets"] == ((2, 8), torch.int64)
    assert any("cross_entropy" in op for op in _ops(with_loss))
    assert not any("cross_entropy" in op for op in _ops(logits_only))
    assert with_loss.forward_flops > logits_only.forward_flops
    assert type(with_loss.module).forward is type(logits_only.module).forward  # class restored


def test_a_files_own_loss_is_priced_and_trained_on(tmp_path):
    spec = _linear(tmp_path, 4, "self.fc(x)", """
        def loss(outputs, batch):
            return F.smooth_l1_loss(outputs, batch["targets"])

        def build():
            return Net(), {"x": torch.zeros(2, 8), "targets": torch.zeros(2, 4)}
    """)
    bundle = resolve_model(spec)
    assert bundle.example_inputs(3)["targets"].shape == (3, 4)
    graph = capture(bundle, batch=3)
    assert any("smooth_l1" in op for op in _ops(graph))
    output, targets = torch.randn(3, 4), torch.randn(3, 4)
    assert torch.equal(bundle.loss(output, targets),
                       torch.nn.functional.smooth_l1_loss(output, targets))


def test_shapes_that_do_not_fit_the_default_loss_are_refused_at_capture(tmp_path):
    with pytest.raises(LossShapeError, match=r"returns \(4, 1, 64\) for token ids of shape "
                                             r"\(4, 8\)"):
        capture(f"{MODELS / 'nanogpt_style.py'}:build_last_position", batch=4)
    scalar = _linear(tmp_path, 1, "self.fc(x).sum(-1)", """
        def build():
            return Net(), torch.zeros(2, 8)
    """)
    with pytest.raises(LossShapeError, match=r"forward returns \(2,\) float32; the default loss "
                                             r"needs floating-point scores of shape"):
        capture(scalar, batch=2)
    mismatched = _linear(tmp_path, 4, "self.fc(x)", """
        def build():
            return Net(), {"x": torch.zeros(2, 8), "targets": torch.zeros(2, 3)}
    """)
    with pytest.raises(LossShapeError, match=r"forward returns \(2, 4\) and the targets are "
                                             r"\(2, 3\) floating-point"):
        capture(mismatched, batch=2)


def _lm(tmp_path: Path, given_targets: str) -> str:
    """A file whose ``forward(idx, targets=None)`` returns the logits without targets and
    ``given_targets`` (of ``logits``) with them."""
    return _file(tmp_path, f"""
class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.head = nn.Linear(16, 32)
    def forward(self, idx, targets=None):
        logits = self.head(self.embed(idx))
        if targets is None:
            return logits
        return {given_targets}

def build():
    return LM(), torch.zeros(2, 8, dtype=torch.long)
""")


def test_a_forward_that_takes_targets_is_priced_with_its_own_loss(tmp_path):
    spec = _lm(tmp_path, "logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())")
    graph = capture(spec, batch=2)
    assert graph.inputs["targets"] == ((2, 8), torch.int64)
    assert graph.fed_targets   # and trained on it: the launch feeds the targets too
    output = next(n for n in graph.gm.graph.nodes if n.op == "output")
    assert len(output.args[0]) == 2   # the forward's (logits, loss): no loss traced after it
    assert sum("cross_entropy" in op for op in _ops(graph)) == 1


def test_nanogpts_own_forward_is_captured_on_its_training_path():
    """nanoGPT's ``forward(idx, targets=None)`` returns the last position's logits without
    targets; given them, every position's and its loss: capture takes that path (targets the
    token ids' shape, bounded by the vocabulary), not the inference path."""
    bundle = resolve_model(f"{MODELS / 'nanogpt_style.py'}:build_smoothed")
    specs = bundle.example_inputs(4)
    assert (specs["targets"].shape, specs["targets"].high, specs["idx"].high) == ((4, 8), 64, 64)
    graph = capture(bundle, batch=4)
    assert graph.fed_targets and graph.inputs["targets"] == ((4, 8), torch.int64)
    assert sum("cross_entropy" in op for op in _ops(graph)) == 1


def test_a_forward_that_takes_targets_and_returns_no_loss_is_refused_at_capture(tmp_path):
    spec = _lm(tmp_path, "logits")
    with pytest.raises(LossShapeError, match=r"forward takes targets, so it is trained on the "
                                             r"loss it returns .* given targets \(2, 8\) it "
                                             r"returns a tensor of shape \(2, 8, 32\), no scalar "
                                             r"loss\. Return \(outputs, loss\)"):
        capture(spec, batch=2)


def test_the_loss_a_forward_returns_is_found():
    from fxplan.core.model_output import returned_loss

    logits, loss = torch.randn(2, 3), torch.tensor(1.5)
    assert returned_loss((logits, loss)) is loss
    assert returned_loss((logits, None, loss)) is loss
    with pytest.raises(TypeError, match=r"returns a tuple \(\(2, 3\), NoneType\), not a loss"):
        returned_loss((logits, None))
    assert returned_loss(loss) is loss   # the loss alone
    with pytest.raises(TypeError, match=r"returns a tensor of shape \(2, 3\), not a loss"):
        returned_loss(logits)


def test_synthetic_ids_span_the_vocabulary_and_the_classes(tmp_path):
    specs = resolve_model(NANOGPT).example_inputs(64)
    assert specs["idx"].high == specs["targets"].high == 64
    data = SyntheticData(specs, high=2, seed=0)
    (tokens,), targets = data.batch(0, 0, 64)
    assert int(tokens.max()) > 1 and int(targets.max()) > 1 and int(tokens.max()) < 64
    classifier = resolve_model(f"{MODELS / 'timm_style.py'}:build").example_inputs(8)
    assert (classifier["targets"].shape, classifier["targets"].high) == ((8,), 10)


def test_inputs_given_by_name_reach_their_parameters_when_fed_by_position():
    """The encoder-decoder's build() gives ``tgt`` before ``src``; at launch they are fed in
    that order and bound by name, the parameter names unchanged."""
    spec = f"{MODELS / 'seq2seq_style.py'}:build"
    bundle = resolve_model(spec)
    names = [k for k in bundle.example_inputs(2) if k != "targets"]
    assert names == ["tgt", "src"]
    torch.manual_seed(0)
    model = bundle.build("cpu")
    before = [n for n, _ in model.named_parameters()]
    src, tgt = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 6))
    expected = model(src, tgt)
    forward_taking(model, names)
    assert torch.equal(model(tgt, src), expected)
    assert [n for n, _ in model.named_parameters()] == before
    assert type(model).__name__ == "Seq2Seq"
