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
    # a masked assignment, x[mask] = values (Kosmos-2's image embeddings at the positions its mask marks): the rows the
    # mask selects, batch 2 x 16, scaled to the 128 values; or a size given itself
    ("shape mismatch: value tensor of shape [128, 32] cannot be broadcast to indexing result of shape [32, 32]",
     {3, 224, 16}, [(16, 64)]),
    ("shape mismatch: value tensor of shape [64, 32] cannot be broadcast to indexing result of shape [16, 32]",
     {3, 224, 16}, [(16, 64)]),
])
def test_the_sizes_an_error_asks_for(text, sizes, want):
    assert error_sizes.asked(text, sizes) == want


def test_variants_change_each_position_then_all_then_the_sets_between():
    specs = ("1x128x128:float32", "mask=1x128:int64~ones")
    got = [g for _, g in error_sizes.variants(specs, 128, 200)]
    assert got == [("1x200x128:float32", "mask=1x128:int64~ones"), ("1x128x200:float32", "mask=1x128:int64~ones"),
                   ("1x128x128:float32", "mask=1x200:int64~ones"), ("1x200x200:float32", "mask=1x200:int64~ones"),
                   ("1x200x200:float32", "mask=1x128:int64~ones"), ("1x200x128:float32", "mask=1x200:int64~ones"),
                   ("1x128x200:float32", "mask=1x200:int64~ones")]
    assert error_sizes.variants(("1x5:int64",), 1, 9) == []   # the batch dimension is never resized
    # a fill that fixes the last dimension (one row per image, a box's four corners) keeps it (a review: a crash)
    assert error_sizes.variants(("1x16:int64", "grid=2x3:int64~each=1,2,4", "bbox=1x16x4:int64~boxes"), 3, 4) == []
    assert [g[0] for _, g in error_sizes.variants(("1x16x4:float32", "bbox=1x16x4:int64~boxes"), 4, 8)] == ["1x16x8:float32"]


@pytest.mark.parametrize("text,sizes", [
    ("divisible by the stride; input length (1001)", {3, 224}),             # a review: the value, not the divisor
    ("divisible by patch size, got (225)", {3, 224}),
    ("The size of tensor a (2) must match the size of tensor b (3) at non-singleton dimension 0", {2, 16}),   # batch
    ("The size of tensor a (30000000) must match the size of tensor b (128)", {128}),   # 234,375x: a misread
    ("The size of tensor a (" + "9" * 5000 + ") must match the size of tensor b (128)", {128}),
])
def test_what_is_not_a_size_asked_for(text, sizes):
    assert error_sizes.asked(text, sizes) == []


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


class _MaskedFrames(nn.Module):
    """A 200-position table; the frames counted from the mask (a review: features resized alone ran, and 72 of the
    200 frames became padding)."""

    def __init__(self):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1, 200, 8))

    def forward(self, x, attention_mask):
        return (x + self.pos).sum(-1)[:, : int(attention_mask.sum(-1).max())]


@pytest.mark.parametrize("model,layouts,shapes,said", [
    (_Positions(), [("1x5x4:float32",), ("1x6x4:float32",)], [(1, 7, 4)], "5 → 7"),
    (_Frames(), [("1x10:float32",)], [(1, 12)], "10 → 12"),
    (_MaskedFrames(), [("1x128x8:float32", "attention_mask=1x128:int64~ones")], [(1, 200, 8), (1, 200)], "128 → 200"),
])
def test_a_source_whose_layouts_all_fail_gets_the_size_its_error_asks_for(model, layouts, shapes, said):
    loaded = type("Loaded", (), {"model": model, "input_source": "test", "labels_from_ids": False})()
    got = _first_that_runs(layouts, loaded, torch.device("cpu"), 0)
    assert [tuple(t.shape) for _, t in got.tensors()] == shapes
    assert f"layout 1 of {len(layouts)} with {said}: the size the model's own error asked for" in got.source
