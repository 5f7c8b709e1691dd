"""core/error_sizes: when no default layout of a source runs, the sizes the model's own error asks for are tried
(measured on the zoo: FunASR's encoder, TVP, PE Video and Muse Spark's audio tower ran with none of their layouts;
each said the size it wanted). Each expected size below is the one the error states."""
import pytest
import torch
from torch import nn

from torchdiag.core import error_sizes
from torchdiag.core.inputs import _first_that_runs


@pytest.mark.parametrize("text,sizes,want", [
    ("The size of tensor a (80) must match the size of tensor b (560) at non-singleton dimension 2", {80, 128}, [(80, 560)]),
    ("The size of tensor a (7) must match the size of tensor b (128) at non-singleton dimension 1", {128, 32}, [(128, 7)]),
    ("Input height (224) doesn't match model (336).", {3, 224}, [(224, 336)]),
    ("expected input[1, 128, 160] to have 1 channels, but got 128 channels instead", {128, 160}, [(128, 1)]),
    ("`input_values` length 16000 is not a multiple of 1920. Prepare the audio", {16000}, [(16000, 17280)]),
    ("must be a multiple of `n_window * 2` (100)", {128, 80}, [(80, 100), (128, 200)]),
    ("mat1 and mat2 shapes cannot be multiplied (2x32 and 512x32)", {32}, []),      # a width: core.input_width's
    ("The size of tensor a (5) must match the size of tensor b (7)", {3}, []),      # neither is a size given
])
def test_the_sizes_an_error_asks_for(text, sizes, want):
    assert error_sizes.asked(text, sizes) == want


def test_variants_change_each_set_of_positions_smallest_first():
    specs = ("1x128x128:float32", "mask=1x128:int64~ones")
    got = error_sizes.variants(specs, 128, 200)
    assert got[:3] == [("1x200x128:float32", "mask=1x128:int64~ones"), ("1x128x200:float32", "mask=1x128:int64~ones"),
                       ("1x128x128:float32", "mask=1x200:int64~ones")]
    assert ("1x128x200:float32", "mask=1x200:int64~ones") in got and len(got) == 7
    assert error_sizes.variants(("1x5:int64",), 1, 9) == []   # the batch dimension is never resized


class _Positions(nn.Module):
    """A learned table of 7 positions added to (N, T, 4) features: only T = 7 runs."""

    def __init__(self):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1, 7, 4))
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x + self.pos)


class _Frames(nn.Module):
    """Reads frames in windows of 4: refuses a length that is not a multiple of it, as a feature extractor would."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        if x.shape[-1] % 4:
            raise ValueError(f"length {x.shape[-1]} is not a multiple of 4; pad it first")
        return self.lin(x.reshape(x.shape[0], -1, 4))


@pytest.mark.parametrize("model,layouts,shape,said", [
    (_Positions(), [("1x5x4:float32",), ("1x6x4:float32",)], (1, 7, 4), "5 → 7"),
    (_Frames(), [("1x10:float32",)], (1, 12), "10 → 12"),
])
def test_a_source_whose_layouts_all_fail_gets_the_size_its_error_asks_for(model, layouts, shape, said):
    loaded = type("Loaded", (), {"model": model, "input_source": "test", "labels_from_ids": False})()
    got = _first_that_runs(layouts, loaded, torch.device("cpu"), 0)
    assert tuple(got.args[0].shape) == shape
    assert f"layout 1 of {len(layouts)} with {said}: the size the model's own error asked for" in got.source
