"""Configs the zoo completes (issue 26): a default transformers config that leaves unset what every real
checkpoint sets, or a shrunk one whose sizes no longer agree (exit 3 in the zoo run of 2026-11-29, not the
model's fault nor torchdiag's). Each rule reads config attributes and the model's own source, never a type
name; corpus_zoo._configs tries them only after the plain shrunk configs fail, so a row that ran before is
built as before. Each rule works in place on one config (complete / after_shrink apply it to every sub-config)."""
from __future__ import annotations

import re

SLIDING_WINDOW = 64        # a sliding window left unset
EXPERTS_PER_TOKEN = 2      # a MoE's experts per token left unset
ROUTED = {"n_routed_experts": 4, "n_shared_experts": 1}   # a MoE's expert counts left unset
VOCAB = 1000               # a vocabulary left unset
HORIZON = 24               # a forecaster's prediction length left unset (its context length too, when derived from it)


def modeling_source(config) -> str:
    """The source of the modeling module of this config's type ('' where there is none)."""
    import importlib
    import inspect

    module = type(config).__module__.replace(".configuration_", ".modeling_")
    try:
        return inspect.getsource(importlib.import_module(module))
    except Exception:  # noqa: BLE001 - no modeling module of that name
        return ""


def sub_configs(config):
    """`config` and every config nested in it."""
    from transformers import PretrainedConfig

    yield config
    for value in list(vars(config).values()):
        if isinstance(value, PretrainedConfig):
            yield from sub_configs(value)


# ---- before shrinking: what the default leaves unset --------------------------------------------------------

def complete(config, top_id: int) -> None:
    """Every completion rule on `config` and its sub-configs; `top_id` is the largest token id any of them names
    (a placeholder id given here is above it, so shrink keeps the vocabulary large enough)."""
    for c in sub_configs(config):
        top_id = _placeholder_ids(c, top_id)
        _unset_sizes(c)
        _one_feature_level(c)
        _an_attention_layer(c)
        _timm_architecture(c)


def _placeholder_ids(c, top_id: int) -> int:
    """A placeholder id the model compares input_ids with (`input_ids == self.config.image_token_id`), left None
    (BLIP-2's image_token_index: `input_ids == None` is a bool, and the forward fails): a free id. Returns the
    largest id now named."""
    source = None
    for key, value in list(vars(c).items()):
        if value is None and key.endswith(("_token_index", "_token_id")):
            source = modeling_source(c) if source is None else source
            names = {key} | {a for a, t in getattr(c, "attribute_map", {}).items() if t == key}
            if any(re.search(rf"input_ids\s*==\s*(self\.)?config\.{n}\b", source) for n in names):
                top_id += 1
                setattr(c, key, top_id)
    return top_id


def _unset_sizes(c) -> None:
    """A MoE's experts per token left None (DeepSeek-V2: topk(k=None)), or its experts (dots1's n_routed_experts,
    n_shared_experts); a sliding window left None where the model builds its sliding mask whatever its layer kinds
    (Step3p7); a head width left None (HunYuan's and Ministral's head_dim: the rotary table's `base ** (arange /
    None)`), key/value heads left None (Nemotron's num_key_value_heads: `heads // None`), a vocabulary left None
    (ESM's vocab_size: `torch.empty(None, width)`), each of which every checkpoint sets."""
    own = vars(c)
    for key in [k for k, v in own.items() if v is None and k.endswith("experts_per_tok")]:
        setattr(c, key, EXPERTS_PER_TOKEN)
    for key, value in ROUTED.items():
        if key in own and own[key] is None:
            setattr(c, key, value)
    heads, width = own.get("num_attention_heads"), own.get("hidden_size")
    if isinstance(heads, int) and heads > 0 and isinstance(width, int):
        if "head_dim" in own and own["head_dim"] is None and width % heads == 0:
            c.head_dim = width // heads
        if "num_key_value_heads" in own and own["num_key_value_heads"] is None:
            c.num_key_value_heads = heads
    if "vocab_size" in own and own["vocab_size"] is None:
        c.vocab_size = VOCAB
    if "prediction_length" in own and own["prediction_length"] is None:   # a forecaster's horizon (Autoformer:
        c.prediction_length = HORIZON                                     # "needs to be specified")
        if "context_length" in own and own["context_length"] is None:
            c.context_length = HORIZON
    if "sliding_window" in own and own["sliding_window"] is None:
        if "create_sliding_window_causal_mask(" in modeling_source(c):
            c.sliding_window = SLIDING_WINDOW


def _one_feature_level(c) -> None:
    """An empty list of feature scales, i.e. no feature level at all (LW-DETR's projector_scale_factors ():
    torch.cat of nothing): one scale, 1.0, and what the class derives from it when built (num_feature_levels)."""
    for key, value in list(vars(c).items()):
        if key.endswith("_scale_factors") and isinstance(value, (list, tuple)) and not value:
            built, base = vars(type(c)(**{key: [1.0]})), vars(type(c)())
            for k, v in built.items():
                if base.get(k) != v:
                    setattr(c, k, v)


def _an_attention_layer(c) -> None:
    """A hybrid whose layers are all linear attention or Mamba by default (Bamba's attn_layer_indices None,
    GraniteMoeHybrid's layer_types): its cache refuses get_seq_length; its second layer becomes attention."""
    own = vars(c)
    depth = own.get("num_hidden_layers")
    if "attn_layer_indices" in own and not own["attn_layer_indices"] and isinstance(depth, int) and depth > 1:
        c.attn_layer_indices = [1]
    kinds = own.get("layer_types")
    if (isinstance(kinds, list) and len(kinds) > 1 and all(isinstance(k, str) for k in kinds)
            and all("linear" in k or "mamba" in k for k in kinds)):
        kinds[1] = "full_attention"


def _timm_architecture(c) -> None:
    """A timm backbone named in another (misspelled) attribute: transformers' EdgeTAM config says
    `archirecture: repvit_m1`, so timm_wrapper builds its default resnet50, whose widths the neck does not read."""
    own = vars(c)
    if getattr(c, "model_type", None) != "timm_wrapper" or not isinstance(own.get("architecture"), str):
        return
    import timm

    named = [v for k, v in own.items() if k != "architecture" and isinstance(v, str) and timm.is_model(v)]
    if named and named[0] != c.architecture:
        c.architecture = named[0]


# ---- after shrinking: sizes shrink() leaves disagreeing -------------------------------------------------------

def after_shrink(config, layer_counts, small: dict) -> None:
    """Every consistency rule on the shrunk `config` and its sub-configs (`layer_counts`: the depth's names,
    `small`: the shrunk sizes, corpus_zoo.SMALL)."""
    for c in sub_configs(config):
        try:
            default = vars(type(c)())
        except Exception:  # noqa: BLE001 - a config class that needs arguments
            default = {}
        _second_depth(c, default, layer_counts)
        _intermediate_sizes(c, small)
        _default_width_lists(c, default, small)
        _derived_depth(c, layer_counts)
        _rounded_width(c)
        _windowed_image(c)
        _sub_config_widths(c)
        _per_layer_overrides(c, layer_counts)
        _per_layer_input(c, small)


def _second_depth(c, default: dict, layer_counts) -> None:
    """A second name of the depth, equal to it by default (xLSTM builds num_blocks blocks, its cache holds
    num_hidden_layers states: KeyError 2): the shrunk depth."""
    own = vars(c)
    depth = next((k for k in layer_counts if isinstance(own.get(k), int)), None)
    if depth is None:
        return
    for key, value in list(own.items()):
        if (key != depth and ("block" in key or "layer" in key) and isinstance(value, int)
                and not isinstance(value, bool) and value == default.get(depth) != own[depth]):
            setattr(c, key, own[depth])


def _intermediate_sizes(c, small: dict) -> None:
    """An expert's (or any other) *_intermediate_size (DeepSeek-V2's moe_intermediate_size 1407, whose rows are no
    multiple of 16 bytes, which grouped_mm refuses; checkpoints use 1408 or 1536): the shrunk intermediate size."""
    for key, value in list(vars(c).items()):
        if key.endswith("_intermediate_size") and isinstance(value, int) and value > small["intermediate_size"]:
            setattr(c, key, small["intermediate_size"])


def _default_width_lists(c, default: dict, small: dict) -> None:
    """A channel list made of one default width and left as it was (OmDet-Turbo's vision_features_channels, the
    encoder's d_model 256 three times): the shrunk width, as often."""
    own = vars(c)
    for key, value in list(own.items()):
        if not (isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value)
                and list(value) == list(default.get(key) or ()) and len(set(value)) == 1):
            continue
        width = next((w for w in small if isinstance(own.get(w), int) and default.get(w) == value[0]
                      and own[w] != value[0]), None)
        if width:
            setattr(c, key, [own[width]] * len(value))


def _derived_depth(c, layer_counts) -> None:
    """A depth the config class derives from others when built (HRM's num_hidden_layers = per-stack layers x
    cycles, its cache slots): the value the class itself gives for the shrunk depth."""
    own = vars(c)
    for key in layer_counts:
        if isinstance(own.get(key), int) and not isinstance(own.get(key), bool):
            try:
                built = getattr(type(c)(**{key: own[key]}), key)
            except Exception:  # noqa: BLE001 - a config that cannot be built from that alone
                continue
            if isinstance(built, int) and built != own[key]:
                setattr(c, key, built)


def _rounded_width(c) -> None:
    """A width whose factors the config rounds up to multiples of 64 (xLSTM's qk_dim, v_dim; its layers do not
    round): the smallest width that makes every *_dim_factor x width such a multiple already."""
    own = vars(c)
    factors = [v for k, v in own.items() if k.endswith("_dim_factor") and isinstance(v, float) and v > 0]
    if not factors or not isinstance(own.get("hidden_size"), int):
        return
    width = 64
    while any((width * f) % 64 for f in factors) and width < 64 * 64:
        width += 64
    for key in ("hidden_size", "embedding_dim"):
        if isinstance(own.get(key), int):
            setattr(c, key, width)


def _windowed_image(c) -> None:
    """An image side that windows of patches must tile (RF-DETR's windowed DINOv2: 518 / 14 = 37 patches into 4
    windows a side): rounded up to a multiple of patch_size x num_windows."""
    own = vars(c)
    size, patch, windows = own.get("image_size"), own.get("patch_size"), own.get("num_windows")
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (size, patch, windows)):
        c.image_size = -(-size // (patch * windows)) * (patch * windows)


def _sub_config_widths(c) -> None:
    """A parent's *_dim equal to a sub-config's default width (OmDet-Turbo's text_projection_in_dim and
    class_embed_dim: the text model's 512): that sub-config's shrunk width."""
    from transformers import PretrainedConfig

    own = vars(c)
    for name, sub in list(own.items()):
        if not (isinstance(sub, PretrainedConfig) and name.endswith("_config")):
            continue
        wide, narrow = vars(type(sub)()).get("hidden_size"), vars(sub).get("hidden_size")
        if not isinstance(narrow, int):
            continue
        for key, value in list(own.items()):
            if key.endswith("_dim") and value == wide != narrow:
                setattr(c, key, narrow)


def _per_layer_overrides(c, layer_counts) -> None:
    """Per-layer overrides kept for layers the shrunk depth no longer has (Gemma 4's head_dim 512 on its full-attention
    layers 5, 11, ..., 29, over 6 layers: "`per_layer_config` keys must be integer layer indices in the range [0, 6)"):
    the overrides of the layers that remain."""
    spec = vars(c).get("_heterogeneity_spec")
    overrides = getattr(spec, "per_layer_overrides", None)
    depth = next((vars(c)[k] for k in layer_counts if isinstance(vars(c).get(k), int)), None)
    if isinstance(overrides, dict) and isinstance(depth, int) and any(k >= depth for k in overrides):
        c.per_layer_config = {k: v for k, v in overrides.items() if k < depth}


def _per_layer_input(c, small: dict) -> None:
    """The per-layer input embedding's vocabulary and width (Gemma 3n's and 4's vocab_size_per_layer_input 262,144 x
    hidden_size_per_layer_input 256 per layer: 400 M parameters left in a shrunk model): the shrunk vocabulary and a
    quarter of the shrunk width."""
    own = vars(c)
    if isinstance(own.get("vocab_size_per_layer_input"), int):
        c.vocab_size_per_layer_input = min(own["vocab_size_per_layer_input"], own.get("vocab_size") or small["vocab_size"])
    if isinstance(own.get("hidden_size_per_layer_input"), int) and own["hidden_size_per_layer_input"] > 0:
        c.hidden_size_per_layer_input = max(1, small["hidden_size"] // 4)


def every_stage_out(config) -> None:
    """A backbone sub-config that outputs every stage (its default: the last one only), for a head that fuses the
    maps of every stage (UVDoc's bridge connector reads bridge_connector[0] x number of stages channels)."""
    for c in sub_configs(config):
        names = vars(c).get("stage_names")
        if c is not config and isinstance(names, list) and len(names) > 1 and "_out_features" in vars(c):
            c._out_features, c._out_indices = names[1:], list(range(1, len(names)))
