"""Default inputs of a forward that needs an optional input (issue 26): when a default layout does not run and the
error names one of the forward's optional inputs (in its message, or as the None the module that raised
received), that input is added, shaped from the config and the main input, and the layout tried again. Of one
layout, one traceless probe forward at input resolution tells (only for a forward that takes optional inputs the
layout leaves out; none on meta), its float inputs cast to --dtype as the command's are."""
from __future__ import annotations

import types

import pytest
import torch
from torch import nn


def loaded(model, *default, alternatives=(), trains=True):
    return types.SimpleNamespace(model=model, default_inputs=default, input_alternatives=alternatives,
                                 input_source="test", module=None, trains=trains)


def first_run(source, forwards=None):
    """The inputs a command's forward runs with: source_inputs, then the command's one forward. `forwards`: a
    list the number of root forwards of each stage goes into (resolving the inputs, the command)."""
    from torchdiag.core import inputs

    n = [0]
    handle = source.model.register_forward_pre_hook(lambda m, a: n.__setitem__(0, n[0] + 1))
    resolved = None
    try:
        got = inputs.source_inputs(source, torch.device("cpu"))
        resolved, n[0] = n[0], 0
        got.call(source.model)
    finally:
        handle.remove()
        if forwards is not None:
            forwards += [n[0]] if resolved is None else [resolved, n[0]]
    return got


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
    # a layout that runs costs one probe forward while resolving it, and the command's own
    assert forwards == [1, 1]
    assert inputs.source_inputs(loaded(Runs(), "1x4:float32"), torch.device("cpu")).kwargs == {}

    class Plain(nn.Module):   # no optional inputs: not probed
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x)

    forwards.clear()
    first_run(loaded(Plain(), "1x4:float32"), forwards)
    assert forwards == [0, 1]

    class Broken(NeedsFeatures):
        def forward(self, input_ids, attention_mask=None, extra_features=None):
            raise RuntimeError("the model's own bug")

    forwards.clear()
    with pytest.raises(RuntimeError, match="own bug"):   # the command's own error: the probe's named nothing
        first_run(loaded(Broken(), "1x8:int64"), forwards)
    assert forwards == [2, 1]   # resolving: the probe that ranges the ids, the layout's probe


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

    def counted(model, inputs, dtype=None):
        calls.append(sorted(inputs.kwargs))
        return probe(model, inputs, dtype)

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
    # runs on it as it was, to report its own error
    from torchdiag.core import hf_inputs

    forwards: list[int] = []
    model = NeedsLanguage()
    with pytest.raises(ValueError, match="Input language unknown"):
        first_run(loaded(model, "1x8:int64"), forwards)
    shapes = hf_inputs.optional_specs("lang_ids", ("1x8:int64",), model)
    # resolving: the probe that ranges the ids and the probe of the layout, then the layout with lang_ids in each
    # of its shapes (each with the probe that ranges its ids); the command's one
    assert forwards == [2 + 2 * len(shapes), 1]


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


def test_added_position_ids_count_positions_and_every_query_sees_every_key(tmp_path, cli):
    # ESM derives its positions from pad_token_id; a config without one needs position_ids, which the error names.
    # Made as ids (random integers in the position table's range), transformers read them as packed sequences of one
    # token each: every query attended to itself alone, and query/key got exactly zero gradient (`zero-grad`, an
    # error, on a healthy model). Positions are 0, 1, ... along each sequence, as the model derives them.
    transformers = pytest.importorskip("transformers")
    cfg = transformers.EsmConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                                 num_hidden_layers=1, max_position_embeddings=64, pad_token_id=None)
    cfg.architectures = ["EsmForMaskedLM"]
    cfg.save_pretrained(tmp_path / "esm")
    r = cli("gradflow", f"hf:{tmp_path / 'esm'}", "--json")
    assert "position_ids added: optional in the forward" in r.json["input_source"], r.json["input_source"]
    assert "position_ids: 0, 1, 2, … along each sequence (positions, as the model derives them)" in r.json["input_notes"]
    query = {p["name"]: p for p in r.json["params"]}["esm.encoder.layer.0.attention.self.query.weight"]
    assert query["status"] == "ok" and query["grad_norm"] > 0
    assert r.code == 0, [f["code"] for f in r.json["findings"] if f["severity"] != "info"]


def test_on_meta_no_probe_runs():
    from torchdiag.core import inputs

    model = NeedsFeatures().to("meta")
    n = [0]
    model.register_forward_pre_hook(lambda m, a: n.__setitem__(0, n[0] + 1))
    got = inputs.source_inputs(loaded(model, "1x8:int64"), torch.device("meta"))
    assert n[0] == 0 and got.kwargs == {} and got.source == "test"


# fake hf: models registered with transformers for the tests below (one default layout each); `needs_extra`
# in their config: the forward cannot do without the optional input extra_features (named in its error)
def _fake_hf(monkeypatch):
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto import modeling_auto

    class FakeImageConfig(transformers.PretrainedConfig):
        model_type = "tdfake_image"

        def __init__(self, image_size=16, num_channels=3, extra_feature_dim=6, needs_extra=True, **kw):
            self.image_size, self.num_channels, self.extra_feature_dim = image_size, num_channels, extra_feature_dim
            self.needs_extra = needs_extra
            super().__init__(**kw)

    class TdFakeImageModel(transformers.PreTrainedModel):
        """Pixels through a BatchNorm (a buffer a forward moves), then extra_features when it needs them."""
        config_class = FakeImageConfig
        main_input_name = "pixel_values"

        def __init__(self, config):
            super().__init__(config)
            self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
            self.proj, self.head = nn.Linear(config.extra_feature_dim, 8), nn.Linear(8, 5)
            self.post_init()

        def _init_weights(self, module):
            pass

        def forward(self, pixel_values, extra_features=None, labels=None):
            self.seen.append((pixel_values.dtype, extra_features is not None))
            h = self.bn(self.conv(pixel_values)).mean((-1, -2))
            if extra_features is not None:
                h = h + self.proj(extra_features).mean(1)
            elif self.config.needs_extra:
                raise ValueError("`extra_features` cannot be `None`")
            return transformers.modeling_outputs.ImageClassifierOutput(logits=self.head(h))

    class FakeLMConfig(transformers.PretrainedConfig):
        model_type = "tdfake_lm"

        def __init__(self, vocab_size=50, extra_feature_dim=6, hidden_size=8, needs_extra=True, **kw):
            self.vocab_size, self.extra_feature_dim, self.hidden_size = vocab_size, extra_feature_dim, hidden_size
            self.needs_extra = needs_extra
            super().__init__(**kw)

    class TdFakeLMForCausalLM(transformers.PreTrainedModel):
        """A causal LM (its own loss on labels = the ids: the inputs carry labels)."""
        config_class = FakeLMConfig

        def __init__(self, config):
            super().__init__(config)
            self.emb, self.proj = nn.Embedding(config.vocab_size, 8), nn.Linear(config.extra_feature_dim, 8)
            self.head = nn.Linear(8, config.vocab_size)
            self.post_init()

        def _init_weights(self, module):
            pass

        def forward(self, input_ids, attention_mask=None, extra_features=None, labels=None):
            self.seen.append((labels is not None, extra_features is not None))
            h = self.emb(input_ids)
            if extra_features is not None:
                h = h + self.proj(extra_features)
            elif self.config.needs_extra:
                raise ValueError("`extra_features` cannot be `None`")
            logits = self.head(h)
            loss = None
            if labels is not None:
                loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
            return transformers.modeling_outputs.CausalLMOutput(loss=loss, logits=logits)

    seen: list = []
    for cfg, cls in ((FakeImageConfig, TdFakeImageModel), (FakeLMConfig, TdFakeLMForCausalLM)):
        transformers.AutoConfig.register(cfg.model_type, cfg, exist_ok=True)
        monkeypatch.setattr(transformers, cls.__name__, cls, raising=False)
        monkeypatch.setattr(cls, "seen", seen, raising=False)
    monkeypatch.setitem(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "tdfake_lm", "TdFakeLMForCausalLM")
    return types.SimpleNamespace(image=FakeImageConfig, lm=FakeLMConfig, seen=seen)


def _saved(tmp_path, config, arch, name):
    config.architectures = [arch]
    config.save_pretrained(tmp_path / name)
    return f"hf:{tmp_path / name}"


def test_a_one_layout_causal_lm_with_labels_completes_in_summary_check_and_python(tmp_path, cli, monkeypatch):
    # a review: the first-forward watch was spent by the loss rule's look at the inputs (prepare) in a causal LM
    # with labels: its command never completed; the probe at input resolution runs with the labels
    fake = _fake_hf(monkeypatch)
    spec = _saved(tmp_path, fake.lm(), "TdFakeLMForCausalLM", "lm")
    r = cli("summary", spec, "--json")
    assert r.code == 0, r.stderr
    assert r.json["inputs"] == ["input[0]: 1x128 int64", "extra_features: 1x128x6 float32", "labels: 1x128 int64"]
    assert "labels = the input ids" in r.json["input_source"]
    assert "extra_features added: optional in the forward" in r.json["input_source"]
    config = tmp_path / "check.toml"
    config.write_text('[tool.torchdiag]\ndevice = "cpu"\n[tool.torchdiag.check]\ngradflow = true\n')
    r = cli("check", spec, "--config", config)
    assert r.code == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout
    # the Python API on the model and the inputs torchdiag resolves for it
    import torchdiag.api
    from torchdiag.core import inputs, loading

    source = loading.load_model(spec, device=torch.device("cpu"))
    got = inputs.resolve_inputs([], source, torch.device("cpu"))
    assert sorted(got.kwargs) == ["extra_features", "labels"]
    res = torchdiag.api.run("gradflow", source.model, got)
    assert res.exit_code == 0, [f.to_dict() for f in res.findings]


def test_flops_and_memory_complete_and_dtype_casts_the_probe(tmp_path, cli, monkeypatch):
    # a review: flops and memory run their forwards under dispatch modes, where the watch never came; and under
    # --dtype bfloat16 the probes' float32 inputs failed on the cast model, so nothing was added
    fake = _fake_hf(monkeypatch)
    spec = _saved(tmp_path, fake.image(), "TdFakeImageModel", "image")
    for command in ("flops", "memory"):
        r = cli(command, spec, "--json")
        assert r.code == 0, (command, r.stderr)
        assert r.json["inputs"][1].startswith("extra_features: "), command
    fake.seen.clear()
    r = cli("summary", spec, "--json", "--dtype", "bfloat16")
    assert r.code == 0, r.stderr
    assert r.json["inputs"] == ["input[0]: 1x3x16x16 bfloat16", "extra_features: 1x3x6 bfloat16"]
    # every forward (the probe, the one with extra_features, summary's) read bfloat16 pixels
    assert fake.seen and all(dtype == torch.bfloat16 for dtype, _ in fake.seen), fake.seen
    # (the premise: the cast model refuses float32 pixels)
    from torchdiag.core import loading

    model = loading.load_model(spec, device=torch.device("cpu")).model.to(torch.bfloat16)
    with pytest.raises(RuntimeError):
        model(torch.randn(1, 3, 16, 16), extra_features=torch.randn(1, 3, 6, dtype=torch.bfloat16))


@pytest.mark.parametrize("kind", ["image", "lm"])
def test_a_healthy_one_layout_model_gets_the_same_inputs_and_one_forward_more(tmp_path, monkeypatch, kind):
    # the probe is the one cost of a forward that takes optional inputs: the inputs are those it would get
    # without it, and the model (its BatchNorm statistics) is as it was
    from torchdiag.core import inputs, loading, optional_inputs

    fake = _fake_hf(monkeypatch)
    config = fake.image(needs_extra=False) if kind == "image" else fake.lm(needs_extra=False)
    spec = _saved(tmp_path, config, "TdFakeImageModel" if kind == "image" else "TdFakeLMForCausalLM", kind)
    source = loading.load_model(spec, device=torch.device("cpu"))
    before = {k: v.clone() for k, v in source.model.state_dict().items()}

    def resolve():
        fake.seen.clear()
        got = inputs.resolve_inputs([], source, torch.device("cpu"))
        return got, len(fake.seen)

    probed, n = resolve()
    with monkeypatch.context() as m:
        m.setattr(optional_inputs, "needs_probe", lambda model, given: False)
        plain, n_plain = resolve()
    assert n == n_plain + 1
    assert probed.source == plain.source and probed.notes == plain.notes and probed.describe() == plain.describe()
    assert [k for k, _ in probed.tensors()] == [k for k, _ in plain.tensors()]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(probed.tensors(), plain.tensors()))
    assert all(torch.equal(v, before[k]) for k, v in source.model.state_dict().items())
    if kind == "lm":
        assert "labels" in probed.kwargs


class _WritesItsWeights(torch.nn.Module):
    """A forward that writes its parameters in place under no_grad (a codebook's EMA), a whole tensor and a view."""

    def __init__(self):
        super().__init__()
        self.codebook = torch.nn.Parameter(torch.full((4,), 8.0), requires_grad=False)
        self.w = torch.nn.Parameter(torch.ones(3, 4))

    def forward(self, x, extra=None):
        with torch.no_grad():
            self.codebook.mul_(0.5)
            self.w[0].add_(1.0)
        return x @ self.w.t() + self.codebook.sum()


def test_a_probe_forward_leaves_parameters_it_writes_in_place_as_they_were():
    """A review: the probe restored buffers only, so the command diagnosed a model the probe had changed."""
    from torchdiag.core.inputs import ModelInputs, traceless

    model = _WritesItsWeights()
    out = traceless(model, ModelInputs((torch.ones(2, 4),)))
    assert float(out[0, 0]) == 8.0 + 16.0          # the forward itself saw its writes (w row 0 = 2, codebook 4 x 4)
    assert torch.equal(model.codebook, torch.full((4,), 8.0)) and torch.equal(model.w, torch.ones(3, 4))


class _BadStr(Exception):
    def __str__(self):
        raise RuntimeError("str() of this exception raises")


class _RaisesBadStr(torch.nn.Module):
    def forward(self, x, extra=None):
        raise _BadStr()


def test_a_probe_whose_error_cannot_be_printed_is_a_failed_layout_not_a_crash():
    from torchdiag.core import optional_inputs
    from torchdiag.core.inputs import ModelInputs

    got = optional_inputs.probe(_RaisesBadStr(), ModelInputs((torch.ones(2, 4),)))
    assert got.out is None and not got.said


class Trajectory(nn.Module):
    """Decision Transformer's contract: every input optional, states (batch, steps, state_dim) first, actions
    (act_dim wide, a name the config does not spell after the input), returns (one wide), each read by an nn.Linear
    the forward's own line hands it to, and an integer step index."""

    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace(state_dim=5, act_dim=3, hidden_size=8)
        self.state, self.action, self.ret = nn.Linear(5, 8), nn.Linear(3, 8), nn.Linear(1, 8)
        self.step = nn.Embedding(16, 8)

    def forward(self, states=None, actions=None, returns_to_go=None, timesteps=None):
        s = self.state(states)
        a = self.action(actions)
        r = self.ret(returns_to_go)
        return s + a + r + self.step(timesteps)


def test_a_none_the_forwards_line_hands_a_module_is_named_and_an_added_input_gets_the_width_its_linear_reads():
    from torchdiag.core import hf_inputs, inputs

    model = Trajectory()
    main = hf_inputs._main_shapes(model.config, "states")[0][0]
    assert main == (128, 5)      # a one-word input's own size: state_dim
    got = inputs._first_that_runs([(f"1x{main[0]}x{main[1]}:float32",)], loaded(model), torch.device("cpu"), 0)
    assert got.kwargs["actions"].shape == (1, 128, 3) and got.kwargs["returns_to_go"].shape == (1, 128, 1)
    assert "actions, returns_to_go, timesteps added" in got.source


def test_a_none_the_failing_forward_reads_on_its_own_line_is_named():
    # Idefics' forward reads image_attention_mask.size(-1) itself: no module receives the None
    from torchdiag.core import optional_inputs
    from torchdiag.core.tracking import ModuleTracker

    class Reads(nn.Module):
        def forward(self, x, extra_mask=None, other=None):
            return x * extra_mask.size(-1)

    model = Reads()
    tracker = ModuleTracker(model, record_shapes=False)
    with pytest.raises(AttributeError) as info, tracker:
        model(torch.ones(2))
    assert optional_inputs.named(tracker, info.value) == ["extra_mask"]


class Frames(nn.Module):
    """Voxtral Realtime's contract: token ids and optional filter banks, every 8 frames one audio token added to one
    token's embedding: without the features the forward refuses, with them the ids must match their count."""

    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace(num_mel_bins=4)
        self.emb, self.conv = nn.Embedding(10, 6), nn.Conv1d(4, 6, 8, stride=8)

    def forward(self, input_ids, input_features=None):
        if input_features is None:
            raise ValueError("You must specify input_features")
        return self.emb(input_ids) + self.conv(input_features).transpose(1, 2)


def test_an_added_input_that_fixes_the_layout_but_for_a_size_gets_the_size_its_error_asks_for():
    from torchdiag.core import inputs

    got = inputs._first_that_runs([("1x128:int64",), ("1x64:int64",)], loaded(Frames()), torch.device("cpu"), 0)
    frames = got.kwargs["input_features"].shape
    assert frames[1] == 4 and got.args[0].shape == (1, frames[2] // 8)
    assert "the size the model's own error asked for" in got.source and "optional inputs its errors named" in got.source


class Placed(nn.Module):
    """Kosmos-2's contract: pixels, token ids, and a mask of the ids' positions where its image embeddings (4 per
    image here, 64 there) go, optional in the forward but read without a check (`mask.to(bool)`)."""

    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace()
        self.emb, self.patch = nn.Embedding(10, 6), nn.Conv2d(3, 6, 4, stride=4)

    def forward(self, pixel_values, input_ids=None, image_embeds_position_mask=None):
        if input_ids is None:
            raise ValueError("You have to specify either input_ids or inputs_embeds")
        image = self.patch(pixel_values).flatten(2).transpose(1, 2)   # (batch, 4, 6) from 8x8 pixels
        embeds = self.emb(input_ids)
        embeds[image_embeds_position_mask.to(dtype=torch.bool)] = image.reshape(-1, 6)
        return embeds


def test_a_mask_beside_ids_is_shaped_as_the_ids_and_the_size_its_assignment_asks_for_is_given():
    """Kosmos-2 exited 3: its mask was tried shaped as the pixels (the main input), never as the ids, and the masked
    assignment's error (64 values for 16 marked positions) asked for no size. A mask beside keyword ids is tried as
    long as they are, all ones, and the assignment's rows are a size."""
    from torchdiag.core import inputs

    got = inputs._first_that_runs([("1x3x8x8", "input_ids=1x16:int64")], loaded(Placed()), torch.device("cpu"), 0)
    assert got.kwargs["input_ids"].shape == (1, 4) and got.kwargs["image_embeds_position_mask"].shape == (1, 4)
    assert "16 → 4" in got.source, got.source


def test_a_per_sample_size_is_also_tried_as_one_row_for_a_batch():
    # MiniCPM-V's vision tower packs a batch into one sequence and adds one row of positions to every sample
    from torchdiag.core import hf_inputs

    model = nn.Linear(2, 2)
    model.config = types.SimpleNamespace(image_size=8, patch_size=4, num_channels=3)
    specs = hf_inputs.optional_specs("target_sizes", ("2x3x8x8:float32",), model)
    assert specs[:4] == ["target_sizes=2x2:int64~each=2,2", "target_sizes=2x2:int64~each=8,8",
                         "target_sizes=1x2:int64~each=2,2", "target_sizes=1x2:int64~each=8,8"]
    assert hf_inputs.optional_specs("target_sizes", ("1x3x8x8:float32",), model)[2] != "target_sizes=1x2:int64~each=2,2"


class MarksGlobal(nn.Module):
    """Longformer's question-answering head in small: positions its optional mask marks take the `wide` branch,
    the others the `local` one, and the forward refuses to run without the mask."""

    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace()
        self.emb, self.local, self.wide = nn.Embedding(10, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, input_ids, global_mask=None):
        if global_mask is None:
            raise ValueError("`global_mask` cannot be `None`")
        h = self.emb(input_ids)
        marked = global_mask.unsqueeze(-1).bool()
        return torch.where(marked, self.wide(h), self.local(h))


class MasksPadding(MarksGlobal):
    """The same mask read as padding: every parameter gets a gradient under all ones."""

    def forward(self, input_ids, global_mask=None):
        if global_mask is None:
            raise ValueError("`global_mask` cannot be `None`")
        h = self.emb(input_ids)
        return (self.wide(h) + self.local(h)) * global_mask.unsqueeze(-1)


def test_an_added_mask_of_all_ones_that_leaves_parameters_without_gradient_marks_half_instead():
    # Longformer's QA head: an all-ones global_attention_mask made every token global, and its local query, key and
    # value got no gradient (doctor's param-not-updated error on a healthy model); ones on the first half reach them

    model = MarksGlobal()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    got = first_run(loaded(model, "2x8:int64"))
    mask = got.kwargs["global_mask"]
    assert mask.shape == (2, 8) and mask[:, :4].eq(1).all() and mask[:, 4:].eq(0).all()
    assert "global_mask: ones on the first half of each row (all ones left 2 parameter(s) without a gradient)" \
        in got.notes
    assert all(p.grad is None for p in model.parameters())   # the comparison wrote no gradient
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # the same mask read as padding keeps its ones: half reaches no more parameters
    kept = first_run(loaded(MasksPadding(), "2x8:int64")).kwargs["global_mask"]
    assert kept.eq(1).all()
    # a command that runs no backward has no gradient to miss: no comparison
    assert first_run(loaded(MarksGlobal(), "2x8:int64", trains=False)).kwargs["global_mask"].eq(1).all()


class PadsWithAVector(nn.Module):
    """A review: attention_mask in transformers' sense (1: a real token), padded positions taking a learned vector;
    half the batch padded reaches that vector, all ones does not, and all ones is still the input without padding."""

    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace()
        self.emb, self.pad, self.head = nn.Embedding(10, 4), nn.Parameter(torch.zeros(4)), nn.Linear(4, 3)

    def forward(self, input_ids, attention_mask=None):
        if attention_mask is None:
            raise ValueError("`attention_mask` cannot be `None`")
        h = torch.where(attention_mask.unsqueeze(-1).bool(), self.emb(input_ids), self.pad)
        return self.head(h).mean(1)


def test_an_added_attention_mask_keeps_its_ones_whatever_the_gradients_say():
    got = first_run(loaded(PadsWithAVector(), "2x8:int64"))
    assert got.kwargs["attention_mask"].eq(1).all() and not any("first half" in n for n in got.notes)


def test_longformer_question_answering_trains_every_attention_projection_by_default(tmp_path, cli):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LongformerConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                        intermediate_size=64, attention_window=[8], max_position_embeddings=80,
                                        vocab_size=100)
    cfg.architectures = ["LongformerForQuestionAnswering"]
    cfg.save_pretrained(tmp_path / "lf")
    r = cli("doctor", f"hf:{tmp_path / 'lf'}", "--json")
    assert "global_attention_mask added: optional in the forward" in r.json["input_source"]
    assert r.code == 0, [(f["code"], f["where"]) for f in r.json["findings"] if f["severity"] != "info"]
