"""Default inputs of a forward that needs an optional input (issue 26): when no default layout runs and the
error names one of the forward's optional inputs (in its message, or as the None the module that raised
received), that input is added, shaped from the config and the main input, and the layout tried again. Of one
layout, the command's own first forward is the one watched: a layout that runs costs no forward more."""
from __future__ import annotations

import types

import pytest
import torch
from torch import nn


def loaded(model, *default, alternatives=()):
    return types.SimpleNamespace(model=model, default_inputs=default, input_alternatives=alternatives,
                                 input_source="test", module=None)


def first_run(source, forwards=None):
    """The inputs a command's forward runs with: source_inputs, then a one-forward command (run_completing, as
    the CLI runs one). `forwards`: a list the number of root forwards of each stage goes into."""
    from torchdiag.core import inputs, optional_inputs

    n = [0]
    handle = source.model.register_forward_pre_hook(lambda m, a: n.__setitem__(0, n[0] + 1))
    try:
        got = inputs.source_inputs(source, torch.device("cpu"))
        resolved, n[0] = n[0], 0

        def command(model, given):
            given.call(model)
            return given

        out = optional_inputs.run_completing(command, source.model, got, lambda grown: grown)
    finally:
        handle.remove()
        if forwards is not None:
            forwards += [resolved, n[0]]
    return out


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

    got = first_run(loaded(NeedsFeatures(), "1x8:int64"))
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
    got = first_run(loaded(NeedsPixels(), "2x8:int64"))
    assert got.kwargs["pixel_values"].shape == (2, 3, 8, 8)   # an image of the config's size, at the batch of the ids
    assert "pixel_mask" in got.kwargs
    assert "pixel_values, pixel_mask added" in got.source and "named them" in got.source


def test_a_forward_that_runs_or_fails_for_another_reason_keeps_its_inputs():
    from torchdiag.core import inputs

    class Runs(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, attention_mask=None, extra_features=None):
            return self.lin(x)

    forwards: list[int] = []
    got = first_run(loaded(Runs(), "1x4:float32"), forwards)
    assert got.kwargs == {} and got.source == "test"
    # a review: a layout that runs costs no forward more than the command's own (none while resolving it)
    assert forwards == [0, 1]
    assert inputs.source_inputs(loaded(Runs(), "1x4:float32"), torch.device("cpu")).kwargs == {}

    class Broken(NeedsFeatures):
        def forward(self, input_ids, attention_mask=None, extra_features=None):
            raise RuntimeError("the model's own bug")

    forwards.clear()
    with pytest.raises(RuntimeError, match="own bug"):   # the command's own error, once: its error names nothing
        first_run(loaded(Broken(), "1x8:int64"), forwards)
    assert forwards[1] == 1


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

    optional_inputs.probe = counted
    try:
        with pytest.raises(ValueError, match="a_ids is required"):   # the fourth would be needed: MAX_ADDED is 3
            first_run(loaded(Endless(), "1x8:int64"))
    finally:
        optional_inputs.probe = probe
    assert max(len(k) for k in calls) == optional_inputs.MAX_ADDED
    assert len(calls) <= optional_inputs.MAX_TRIES + 1


class Embeddings(nn.Module):
    """RoBERTa's: position ids made when not given, for at most 6 positions."""

    def __init__(self):
        super().__init__()
        self.words, self.positions = nn.Embedding(10, 4), nn.Embedding(6, 4)

    def forward(self, input_ids, position_ids=None, token_type_ids=None):
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1]).unsqueeze(0)
        return self.words(input_ids) + self.positions(position_ids)


class NeedsLanguage(nn.Module):
    """XMOD: a language it must be told, and RoBERTa's embeddings (a limit of 6 positions)."""

    def __init__(self):
        super().__init__()
        self.embeddings, self.adapter = Embeddings(), nn.Linear(4, 4)

    def forward(self, input_ids, lang_ids=None, position_ids=None, token_type_ids=None):
        if lang_ids is None:
            raise ValueError("Input language unknown: give lang_ids")
        h = self.embeddings(input_ids, position_ids=position_ids, token_type_ids=token_type_ids)
        return self.adapter(h) * (lang_ids.unsqueeze(-1) + 1)


def test_another_layout_comes_before_an_input_the_model_makes_itself():
    # a review: XMOD (128 ids, 128 positions less RoBERTa's padding offset) got lang_ids and made-up position_ids
    # on its 128-long layout, though its 126-long one runs with lang_ids alone
    from torchdiag.core import inputs

    got = inputs.source_inputs(loaded(NeedsLanguage(), "1x8:int64", alternatives=(("1x6:int64",),)),
                               torch.device("cpu"))
    assert got.args[0].shape == (1, 6) and list(got.kwargs) == ["lang_ids"]
    assert "layout 2 of 2, lang_ids added" in got.source
    # one layout: the embeddings' None position ids are theirs to make (they went on into their position
    # embedding with them), so the 8-long layout gets no position ids; nothing added makes it run, and the command
    # runs again on it as it was, to report its own error
    from torchdiag.core import hf_inputs

    forwards: list[int] = []
    model = NeedsLanguage()
    with pytest.raises(ValueError, match="Input language unknown"):
        first_run(loaded(model, "1x8:int64"), forwards)
    shapes = hf_inputs.optional_specs("lang_ids", ("1x8:int64",), model)
    # the command's, the layout's again and with lang_ids in each of its shapes (each with the probe that ranges
    # its ids), the command's again
    assert forwards[1] == 1 + 2 * (1 + len(shapes)) + 1


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


def test_lxmert_gets_its_visual_features_and_their_positions(tmp_path, cli):
    # LXMERT takes visual_feats and visual_pos as optional, and raises without them: before issue 26 no default
    # layout ran and summary failed (exit 3); the sizes come from visual_feat_dim and visual_pos_dim
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LxmertConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                                    l_layers=1, x_layers=1, r_layers=1, visual_feat_dim=12, visual_pos_dim=4,
                                    max_position_embeddings=64, num_qa_labels=5, num_object_labels=7,
                                    num_attr_labels=3)
    cfg.architectures = ["LxmertModel"]
    cfg.save_pretrained(tmp_path / "lxmert")
    r = cli("summary", f"hf:{tmp_path / 'lxmert'}", "--json")
    assert r.code == 0, r.stderr
    assert r.json["inputs"][1:] == ["visual_feats: 1x64x12 float32", "visual_pos: 1x64x4 float32"]
    assert "visual_feats, visual_pos added: optional in the forward" in r.json["input_source"]


def test_a_forward_on_meta_is_not_the_one_watched():
    # doctor's meta check runs a meta copy first: the layout's first forward on values is the one that counts
    from torchdiag.core import inputs, optional_inputs

    source = loaded(NeedsFeatures(), "1x8:int64")
    got = inputs.source_inputs(source, torch.device("cpu"))

    class ReadsValues(NeedsFeatures):   # a model's .item(): no values on meta, and an error that names no input
        def forward(self, input_ids, attention_mask=None, extra_features=None):
            raise RuntimeError("Tensor.item() cannot be called on meta tensors")

    meta_model = ReadsValues().to("meta")

    def command(model, given):
        try:
            given.to("meta").call(meta_model)
        except RuntimeError:
            pass
        given.call(model)
        return given

    out = optional_inputs.run_completing(command, source.model, got, lambda grown: grown)
    assert list(out.kwargs) == ["extra_features"]
