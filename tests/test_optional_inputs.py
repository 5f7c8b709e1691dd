"""Default inputs of a forward that needs an optional input (issue 26): when no default layout runs and the
error names one of the forward's optional inputs (in its message, or as the None a module still running
received), that input is added, shaped from the config and the main input, and the layout tried again."""
from __future__ import annotations

import types

import pytest
import torch
from torch import nn


def loaded(model, *default, alternatives=()):
    return types.SimpleNamespace(model=model, default_inputs=default, input_alternatives=alternatives,
                                 input_source="test", module=None)


class NeedsFeatures(nn.Module):
    """Reads token ids, and features it takes as optional but cannot do without (LXMERT's visual_feats)."""

    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace(extra_feature_dim=6)
        self.emb, self.proj = nn.Embedding(10, 4), nn.Linear(6, 4)

    def forward(self, input_ids, attention_mask=None, extra_features=None):
        if extra_features is None:
            raise ValueError("`extra_features` cannot be `None`")
        return self.emb(input_ids) + self.proj(extra_features)


def test_an_optional_input_the_error_names_is_added_with_the_size_the_config_names_after_it():
    from torchdiag.core import inputs

    got = inputs.source_inputs(loaded(NeedsFeatures(), "1x8:int64"), torch.device("cpu"))
    assert got.args[0].shape == (1, 8) and list(got.kwargs) == ["extra_features"]
    assert got.kwargs["extra_features"].shape == (1, 8, 6)   # (the main input's length, extra_feature_dim)
    assert "extra_features added: optional in the forward, which failed without it" in got.source
    # the layouts are tried in their order: the first that runs with it added is kept
    got = inputs.source_inputs(loaded(NeedsFeatures(), "1x8:float32", alternatives=(("1x5:int64",),)),
                               torch.device("cpu"))
    assert got.args[0].shape == (1, 5) and got.kwargs["extra_features"].shape == (1, 5, 6)


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 2)

    def forward(self, pixel_values):
        return self.conv(pixel_values).mean((-1, -2))


class NeedsPixels(nn.Module):
    """An image tower given its pixels positionally, None when the caller gives none (TVP's prompter), and a
    second optional input it needs once the pixels are there."""

    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace(image_size=8, num_channels=3)
        self.emb, self.tower, self.norm = nn.Embedding(10, 4), Tower(), nn.LayerNorm(4)

    def forward(self, input_ids, pixel_values=None, pixel_mask=None):
        image = self.norm(self.tower(pixel_values))   # read: the forward goes further than without it
        if pixel_mask is None:
            raise ValueError("pixel_mask must be given with the image")
        return self.emb(input_ids).mean(1) + image


def test_a_none_a_module_received_by_position_names_the_input_and_a_second_one_follows():
    from torchdiag.core import inputs

    got = inputs.source_inputs(loaded(NeedsPixels(), "2x8:int64"), torch.device("cpu"))
    assert got.kwargs["pixel_values"].shape == (2, 3, 8, 8)   # an image of the config's size, at the batch of the ids
    assert "pixel_mask" in got.kwargs
    assert "pixel_values, pixel_mask added" in got.source and "named them" in got.source


def test_a_forward_that_runs_or_fails_for_another_reason_keeps_its_inputs():
    from torchdiag.core import inputs

    class Runs(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)

        def forward(self, input_ids, attention_mask=None, extra_features=None):
            return self.emb(input_ids)

    got = inputs.source_inputs(loaded(Runs(), "1x8:int64"), torch.device("cpu"))
    assert got.kwargs == {} and got.source == "test"

    class Broken(NeedsFeatures):
        def forward(self, input_ids, attention_mask=None, extra_features=None):
            raise RuntimeError("the model's own bug")

    got = inputs.source_inputs(loaded(Broken(), "1x8:int64"), torch.device("cpu"))
    assert got.kwargs == {} and got.source == "test"


def test_added_inputs_are_bounded():
    from torchdiag.core import optional_inputs

    class Endless(nn.Module):   # every input it is given asks for another one
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)

        def forward(self, input_ids, a_ids=None, b_ids=None, c_ids=None, d_ids=None):
            for name, value in (("a_ids", a_ids), ("b_ids", b_ids), ("c_ids", c_ids), ("d_ids", d_ids)):
                self.emb(input_ids)     # one module call more per input given: each is read
                if value is None:
                    raise ValueError(f"{name} is required")
            return self.emb(input_ids)

    calls = []
    probe = optional_inputs.probe

    def counted(model, inputs):
        calls.append(sorted(inputs.kwargs))
        return probe(model, inputs)

    from torchdiag.core import inputs

    optional_inputs.probe = counted
    try:
        got = inputs.source_inputs(loaded(Endless(), "1x8:int64"), torch.device("cpu"))
    finally:
        optional_inputs.probe = probe
    assert got.kwargs == {}     # the fourth would be needed: MAX_ADDED is 3
    assert max(len(k) for k in calls) == optional_inputs.MAX_ADDED
    assert len(calls) <= optional_inputs.MAX_TRIES + 1


def test_the_error_names_only_optional_tensor_inputs_not_given():
    from torchdiag.core.optional_inputs import named
    from torchdiag.core.tracking import ModuleTracker

    class M(nn.Module):
        def forward(self, x, given=None, cache=None, use_cache: bool | None = None,
                    inputs_embeds: torch.Tensor | None = None, visual_feats: torch.Tensor | None = None):
            raise ValueError("given, cache, use_cache, inputs_embeds or visual_feats cannot be None")

    tracker = ModuleTracker(M())
    with tracker, pytest.raises(ValueError) as err:
        tracker.model(torch.zeros(1), given=torch.zeros(1))
    # cache has no annotation, so it may hold a tensor; a flag and embeddings (an input in place of x) may not
    assert named(tracker, err.value) == ["cache", "visual_feats"]
