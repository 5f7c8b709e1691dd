"""Nested tensors from PyTorch's fast paths (issue 14): nn.TransformerEncoder in eval mode, under
no_grad, with a padding mask runs its layers on a nested tensor, whose .shape raises. They are shown
by their per-sample shapes and never crash summary."""
from __future__ import annotations

import torch

from torchdiag.core.inputs import ModelInputs, shape_str
from torchdiag.core.tracking import describe

from support import sample


def nested(*lengths, dim=4):
    return torch.nested.nested_tensor([torch.randn(n, dim) for n in lengths])


def test_describe_shows_per_sample_shapes():
    t = nested(5, 3)
    assert describe(t) == "nested(2: 5x4, 3x4)"
    assert describe((t, torch.zeros(2, 3))) == "(nested(2: 5x4, 3x4), 2x3)"
    assert describe(nested(1, 2, 3, 4, 5)) == "nested(5: 1x4, 2x4, 3x4, 4x4, …)"
    assert shape_str(t) == "nested(2: 5x4, 3x4)"
    inputs = ModelInputs((t,))
    assert inputs.batch_size == 2 and inputs.describe() == ["input[0]: nested(2: 5x4, 3x4) float32"]


def run_summary(model, inputs):
    import torchdiag

    return torchdiag.summary(model, inputs)


def test_summary_of_an_encoder_on_the_fast_path():
    import importlib.util

    spec = importlib.util.spec_from_file_location("nested_fastpath", sample("nested_fastpath.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = mod.nested_output().eval()
    inputs = mod.example_inputs()            # second sample padded after 7 tokens
    text = str(run_summary(model, inputs).to_dict())
    assert "nested(2: 12x32, 7x32)" in text   # the layer's real output: 12 and 7 tokens
