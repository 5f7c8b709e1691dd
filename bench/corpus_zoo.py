"""The whole zoo that builds offline, as corpus entries (issue 26), listed programmatically, never by hand:

- timm: every architecture family (the module that defines the model: `timm.list_modules()`), at its
  smallest variant by parameter count (counted on the meta device, no values allocated);
- torchvision: every builder in `torchvision.models.list_models()` (classification, segmentation,
  detection, video, optical flow, quantized);
- transformers: every model type in CONFIG_MAPPING whose config, shrunk (hidden size 32, 2 layers, 4
  heads, vocabulary 1000 …, sub-configs too), an Auto class builds without remote code; the task is the
  first Auto mapping that holds the type (causal LM, masked LM, seq2seq, image classification, base; seq2seq
  first for a type that has a seq2seq LM, so an encoder-decoder is built whole). A config whose model torchdiag's
  summary cannot run (exit 3) gives way to the next: shrunk, the default config with only its depth cut to 2
  layers, the default config (up to 150 M parameters); none runs, the first that builds is kept.

Models are run as a user runs them: `torchvision:NAME`, `timm:NAME` and `hf:FOLDER` (the shrunk
config saved to build/corpus-hf/TYPE/config.json) with their default inputs (core/sources.py).

    .venv-corpus/bin/python bench/corpus_zoo.py          # writes bench/corpus-zoo.json (minutes)

The list is cached in bench/corpus-zoo.json (the package versions are recorded in it)."""
from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
ZOO = HERE / "corpus-zoo.json"
HF_DIR = HERE.parent / "build" / "corpus-hf"

# shrunk sizes for any config attribute of these names (sub-configs too); heads divide the hidden size
SMALL = {
    "hidden_size": 32, "d_model": 32, "n_embd": 32, "embed_dim": 32, "dim": 32, "n_embed": 32,
    "intermediate_size": 64, "d_ff": 64, "ffn_dim": 64, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
    "n_inner": 64, "d_inner": 64, "mlp_dim": 64,
    "num_hidden_layers": 2, "num_layers": 2, "n_layer": 2, "n_layers": 2, "encoder_layers": 2,
    "decoder_layers": 2, "num_decoder_layers": 2, "num_encoder_layers": 2,
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "num_heads": 4, "num_key_value_heads": 2, "d_kv": 8, "head_dim": 8,
    "vocab_size": 1000, "max_position_embeddings": 128, "n_positions": 128,
    # a second name of the width (xLSTM's embedding_dim) and of the depth (HRM's layers per stack)
    "embedding_dim": 32, "num_layers_per_stack": 2,
}
MAX_DEFAULT = 150_000_000   # a default (unshrunk) config is used only up to this many parameters
HF_TASKS = (("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"), ("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
            ("seq2seq", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
            ("image-classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
            ("base", "MODEL_MAPPING_NAMES"))


def meta_params(build) -> int | None:
    import torch

    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = build()
        return sum(p.numel() for p in {id(p): p for p in m.parameters()}.values())
    except Exception:  # noqa: BLE001 - a model that cannot be built on meta is counted as unknown
        return None


# the architectures of issue 26's report that are not their family's smallest variant (kept as well)
ISSUE_26 = ("nfnet_l0", "ghostnet_100", "poolformer_s12")


def timm_zoo() -> list[dict]:
    import timm

    out = [{"name": f"timm_{n}", "family": "timm", "spec": f"timm:{n}", "args": [], "why": "issue 26's report",
            "params": meta_params(lambda n=n: timm.create_model(n, pretrained=False))} for n in ISSUE_26]
    for module in timm.list_modules():
        names = timm.list_models(module=module)
        if not names:
            continue
        sized = [(meta_params(lambda n=n: timm.create_model(n, pretrained=False)), n) for n in names]
        known = [s for s in sized if s[0] is not None]
        params, name = min(known) if known else (None, names[0])
        out.append({"name": f"timm_{name}", "family": "timm", "spec": f"timm:{name}", "args": [],
                    "why": f"timm family {module} ({len(names)} variants), smallest", "params": params})
        print(f"timm {module}: {name} {params}", file=sys.stderr, flush=True)
    return out


def torchvision_zoo() -> list[dict]:
    import torchvision

    out = []
    for name in torchvision.models.list_models():
        kind = next((k for k in ("detection", "segmentation", "video", "optical_flow", "quantization")
                     if name in torchvision.models.list_models(module=getattr(torchvision.models, k))), "classification")
        kw = {"weights_backbone": None} if kind in ("detection", "segmentation") else {}
        out.append({"name": f"tv_{name}", "family": "torchvision", "spec": f"torchvision:{name}", "args": [],
                    "why": f"torchvision {kind}",
                    "params": meta_params(lambda n=name, kw=kw: torchvision.models.get_model(n, weights=None, **kw))})
    return out


LAYER_COUNTS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers")


def _token_ids(config) -> int:
    """The largest token id or index the config names (the vocabulary must hold it)."""
    top = -1
    for key, value in vars(config).items():
        if key.endswith(("_token_id", "_token_ids", "_token_index", "_id")) and not isinstance(value, bool):
            for v in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(v, int):
                    top = max(top, v)
    return top


def shrink(config, derived: bool = True, floor: int = -1) -> None:
    """Every known size attribute of `config` and its sub-configs set small (in place); per-layer lists
    cut to the new depth; the vocabulary kept large enough for every token id the config or a parent names
    (`floor`: a vision-language config's image_token_id is read by its text_config's embedding); a `*_dim` that
    was the sum of two widths is their new sum (_summed_dims)."""
    before = _widths(config)
    _shrink(config, derived, floor)
    _summed_dims(config, before, _widths(config))


def _widths(config) -> list[int]:
    """The hidden sizes of a config and of its sub-configs, in order."""
    from transformers import PretrainedConfig

    own = vars(config)
    out = [own["hidden_size"]] if isinstance(own.get("hidden_size"), int) else []
    for v in own.values():
        if isinstance(v, PretrainedConfig):
            out += _widths(v)
    return out


def _summed_dims(config, before: list[int], after: list[int]) -> None:
    """A `*_dim` of the top config that is the sum of two hidden sizes (its own and a sub-config's) is set to their
    shrunk sum: Xcodec2's quantization_dim (2048) is the width of its semantic and acoustic features concatenated
    (1024 + 1024), and left at 2048 the shrunk model cannot run. Only `*_dim` names, never a length or a count."""
    if len(before) != len(after) or len(before) < 2:
        return
    for key, value in list(vars(config).items()):
        if not key.endswith("_dim") or key in SMALL or not isinstance(value, int) or isinstance(value, bool):
            continue
        pairs = [(i, j) for i in range(len(before)) for j in range(i + 1, len(before)) if before[i] + before[j] == value]
        if pairs:
            i, j = pairs[0]
            setattr(config, key, after[i] + after[j])


def _shrink(config, derived: bool = True, floor: int = -1) -> None:
    from transformers import PretrainedConfig

    depth = {k: getattr(config, k) for k in LAYER_COUNTS if isinstance(getattr(config, k, None), int)}
    # multi-head attention stays multi-head (MLA's latent keys are expanded to every query head)
    own = vars(config)
    mha = isinstance(own.get("num_key_value_heads"), int) and own.get("num_key_value_heads") == own.get("num_attention_heads")
    floor = max(floor, _token_ids(config))
    small = dict(SMALL, vocab_size=max(SMALL["vocab_size"], floor + 1))
    width = own.get("hidden_size")
    for key, value in list(vars(config).items()):
        limit = small.get(key, _derived(key) if derived else None)
        if (derived and key.endswith("_hidden_size") and isinstance(width, int) and isinstance(value, int)
                and width > 0 and value > width and value % width == 0):
            limit = value // width * SMALL["hidden_size"]   # a multiple of the width stays one (Zamba2's 2x)
        if isinstance(value, PretrainedConfig):
            _shrink(value, derived, floor)
        elif limit and isinstance(value, int) and not isinstance(value, bool) and value > limit:
            setattr(config, key, limit)
        elif key == "vocab_size" and isinstance(value, int) and value <= floor:
            setattr(config, key, floor + 1)   # a default config whose placeholder id is its vocabulary size (LLaVA)
        elif limit and isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
            # per-stage head counts must divide per-stage widths (swin's 3, 6, 12, 24 over 32, 64, ...): powers of 2
            cut = [_power_of_two(min(v, limit)) if "head" in key else min(v, limit) for v in value]
            setattr(config, key, cut[:4])
    if mha:
        config.num_key_value_heads = config.num_attention_heads
    if isinstance(own.get("visual_prompt_size"), int) and isinstance(own.get("max_img_size"), int):
        # a frame prompter that pads every frame to max_img_size (TVP: 48 frames of 448², a ResNet-50 per frame, more
        # than the worker's 900 s): 4 frames of 96², the pad a sixth of the side (it must stay under half)
        config.num_frames, config.max_img_size, config.visual_prompt_size = 4, 96, 16
    _consistent_heads(config)
    for key, old in depth.items():
        new = _every_kind(config, old, getattr(config, key))
        setattr(config, key, new)
        if new != old and "_out_features" in vars(config):
            # a backbone's chosen stages name the full depth (stage12 of 2): its default, the last stage
            config._out_features, config._out_indices = None, None
            if isinstance(vars(config).get("stage_names"), list):
                config.stage_names = ["stem"] + [f"stage{i}" for i in range(1, new + 1)]
        for k, v in list(vars(config).items()):
            if isinstance(v, list) and len(v) == old and old != new and k not in small:
                setattr(config, k, v[:new])


def _as_read_back(config):
    """The config as torchdiag will read it: saved (only what differs from the defaults) and loaded back; a
    backbone sub-config checks its stage names only then (depth_pro refused its shrunk fusion sizes)."""
    import tempfile

    from transformers import AutoConfig

    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        return AutoConfig.from_pretrained(tmp)


def _derived(key: str) -> int | None:
    """Sizes that must follow the shrunk ones: multi-head latent attention's per-head parts and ranks
    (DeepSeek-V2/V3, MiniCPM3), a rotary span within the head (CodeGen), a second width (RWKV's
    attention_hidden_size, V-JEPA 2's predictor) and its heads."""
    if key.endswith("_head_dim"):
        return 8
    if key.endswith("_lora_rank"):
        return 16
    if key == "rotary_dim":
        return 4
    if key.endswith("_hidden_size"):
        return SMALL["hidden_size"]
    if key.endswith("_attention_heads"):     # the heads over such a width (V-JEPA 2's predictor)
        return SMALL["num_attention_heads"]
    if key.endswith("_key_value_heads"):     # and their key/value heads (Inkling2's sliding-window ones)
        return SMALL["num_key_value_heads"]
    if key.endswith("_heads_per_layer"):     # per-layer head counts (Sapiens2's key/value heads)
        return SMALL["num_attention_heads"]
    if key.endswith("_headdim"):             # Mamba-2's head width: heads x headdim = expand x hidden (Zamba2)
        return 8
    return None


def _power_of_two(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _consistent_heads(config) -> None:
    """Sizes that are sums of shrunk ones: MLA's query/key head (nope + rope parts; its head_dim is the rope
    part); multimodal rotary sections (Qwen2-VL-style mrope, read from rope_parameters with a default of
    [8, 12, 12] in the model code, i.e. for head_dim 64) must sum to half the shrunk head."""
    own = vars(config)      # its own attributes (a per-layer config refuses some getattr)
    nope, rope = own.get("qk_nope_head_dim"), own.get("qk_rope_head_dim")
    params = own.get("rope_parameters")
    width = own.get("hidden_size")
    for heads, dim, expand in MAMBA_HEADS:   # Mamba-2: heads x head width = expand x hidden
        h, d, e = own.get(heads), own.get(dim), own.get(expand)
        if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (h, d, e, width)):
            setattr(config, heads, max(1, e * width // d))
    if isinstance(nope, int) and isinstance(rope, int):
        config.qk_head_dim = nope + rope
        if isinstance(own.get("head_dim"), int):
            # the rotary width is head_dim x partial_rotary_factor where the config has one (Mistral 4)
            part = params.get("partial_rotary_factor") if isinstance(params, dict) else None
            config.head_dim = round(rope / part) if isinstance(part, float) and 0 < part < 1 else rope
    if isinstance(params, dict) and _reads_mrope(config):
        # half the rotary width: head_dim 8 / 2, or of the rotary part (GLM-4V-MoE's partial_rotary_factor 0.5)
        part = params.get("partial_rotary_factor")
        total = max(2, round(8 * (part if isinstance(part, float) and 0 < part < 1 else 1.0)) // 2)
        first = total // 4      # [1, 1, 2] for 4, [0, 1, 1] for 2
        second = (total - first) // 2
        params["mrope_section"] = [first, second, total - first - second]


MAMBA_HEADS = (("num_heads", "head_dim", "expand"), ("mamba_n_heads", "mamba_d_head", "mamba_expand"),
               ("n_mamba_heads", "mamba_headdim", "mamba_expand"))


def _reads_mrope(config) -> bool:
    """Whether the model code of this config's type reads an mrope_section (the config may not hold one)."""
    from zoo_complete import modeling_source

    return "mrope_section" in modeling_source(config)


def _every_kind(config, old: int, new: int) -> int:
    """A depth of at least `new` that keeps one layer of every kind the full model has: a hybrid's per-layer
    list of kinds (layer_types: linear attention, convolution, full attention) cut to 2 layers held no attention
    layer, and the model's cache then refused (qwen3_next, zamba, lfm3, kimi_linear: exit 3 in the run of
    2026-11-28), which no real-sized model does; Jamba names its attention layers by period and offset."""
    need = new
    for key, v in vars(config).items():
        # the per-layer list, or a repeating pattern of kinds (recurrent_gemma's block_types)
        if isinstance(v, list) and v and (len(v) == old or "type" in key) and all(isinstance(x, str) for x in v):
            need = max(need, max(v.index(kind) for kind in set(v)) + 1)
    offset = getattr(config, "attn_layer_offset", None)
    if isinstance(offset, int) and not isinstance(offset, bool):
        need = max(need, offset + 1)
    return min(need, old)


def _cut_depth(config, floor: int = 2) -> None:
    """The default config with only its depth cut (to 2 layers, one of every kind; sub-configs too), its widths
    as the model's authors set them: for a type whose widths do not shrink independently (LiLT's layout width
    is a fraction of its hidden size, SAM's neck reads its encoder's width)."""
    from transformers import PretrainedConfig

    for key in LAYER_COUNTS + ("encoder_layers", "decoder_layers", "num_decoder_layers", "num_encoder_layers"):
        old = vars(config).get(key)
        if isinstance(old, int) and not isinstance(old, bool) and old > floor:
            new = _every_kind(config, old, floor)
            setattr(config, key, new)
            for k, v in list(vars(config).items()):
                if isinstance(v, list) and len(v) == old and old != new:
                    setattr(config, k, v[:new])
    for value in list(vars(config).values()):
        if isinstance(value, PretrainedConfig):
            _cut_depth(value, floor)


def _configs(model_type: str):
    """(how, make the config) in the order tried: shrunk (the dependent sizes too, then only the main ones),
    shrunk and completed (bench/zoo_complete.py; then with every backbone stage out), the default config with its
    depth cut, the default config."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    def shrunk(derived):
        config = CONFIG_MAPPING[model_type]()
        shrink(config, derived)
        return _as_read_back(config)

    def cut():
        config = CONFIG_MAPPING[model_type]()
        whole = config.to_json_string()
        _cut_depth(config)
        if config.to_json_string() == whole:
            raise ValueError("no depth to cut")     # the default config itself, tried next
        return _as_read_back(config)

    def completed(every_stage=False):
        import zoo_complete

        config = CONFIG_MAPPING[model_type]()
        zoo_complete.complete(config, max(_token_ids(c) for c in zoo_complete.sub_configs(config)))
        shrink(config)
        zoo_complete.after_shrink(config, LAYER_COUNTS, SMALL)
        if every_stage:
            zoo_complete.every_stage_out(config)
        return _as_read_back(config)

    yield "shrunk config", lambda: shrunk(True)
    yield "shrunk config", lambda: shrunk(False)
    # only for a type whose plain shrunk config fails: the rows that run as before are left as they were
    yield "shrunk config, completed", completed
    yield "shrunk config, completed, every backbone stage out", lambda: completed(every_stage=True)
    yield "default config, depth cut", cut
    yield "default config", lambda: CONFIG_MAPPING[model_type]()


def _pick_config(model_type: str, cls, folder: Path):
    """(how, config, parameters, why not) for the first config that builds (on meta; a default one within MAX_DEFAULT
    parameters) and whose model torchdiag's summary runs with its default inputs (a forward on the CPU, seconds: a
    shrunk width can break a model's own constraints, as LiLT's and SAM's). None runs: the first that builds, saved to
    `folder` (the zoo run records its failure). None builds: parameters None and why."""
    built, why = None, "does not build from the shrunk or the default config (on meta)"
    for how, make in _configs(model_type):
        try:
            config = make()
        except Exception:  # noqa: BLE001 - a config that refuses the sizes
            continue
        if _causal_head(cls) and hasattr(config, "is_decoder"):
            # an encoder family's causal-LM head (RoFormerForCausalLM, BertLMHeadModel) masks the future only as a
            # decoder: built without it, its own shifted loss read the answer in its input (a sweep: a copy task)
            config.is_decoder = True
        params = meta_params(lambda config=config: cls._from_config(config))
        if params is None:
            continue
        if params > MAX_DEFAULT and how != "shrunk config":    # a shrunk config runs at any size, as before
            why = f"builds only above {MAX_DEFAULT / 1e6:.0f} M parameters ({how}: {params / 1e6:.0f} M, on meta)"
            continue
        config.architectures = [cls.__name__]
        config.save_pretrained(folder)
        if _summary_runs(folder):
            return how, config, params, None
        if built is None and _summary_runs(folder, training=False):
            # it runs at an eval command's batch of 1 and not at a training command's 2: a model that takes one
            # sample at a time (TVP's position table, transformers 5.24), whatever the config; kept, the zoo row says
            # why (the configs after it, default sizes, only cost: TVP's 48 frames of 448² took 10 GB and minutes)
            return how, config, params, None
        built = built or (how, config, params)
    if built is None:    # the default config saved all the same; the row says why it is not run
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        config = CONFIG_MAPPING[model_type]()
        config.architectures = [cls.__name__]
        config.save_pretrained(folder)
        return "default config", config, None, why
    built[1].save_pretrained(folder)
    return (*built, None)


def _causal_head(cls) -> bool:
    """Whether transformers maps `cls` as a causal-LM head."""
    from transformers.models.auto import modeling_auto

    names = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
    return any(cls.__name__ == n or (isinstance(n, (tuple, list)) and cls.__name__ in n) for n in names)


def _pick_class(model_type: str, classes: list[str]):
    """(class, how, config, parameters, why not) for the first of the Auto classes that map `model_type` (in HF_TASKS'
    order) that builds from some config: a head that refuses every config (ReformerModelWithLMHead wants
    `is_decoder=True`) leaves the next, often the base model, to be tried; none builds: the first's, with why."""
    import transformers

    first = None
    for name in dict.fromkeys(classes):   # the same class under two tasks is tried once
        cls = getattr(transformers, name, None)
        if cls is None:   # a name this transformers does not export: the next class
            continue
        how, config, params, why = _pick_config(model_type, cls, HF_DIR / model_type)
        if params is not None:
            return cls, how, config, params, why
        first = first or (cls, how, config, params, why)
    if first is None:
        raise AttributeError(f"transformers exports none of {', '.join(classes)}")
    first[2].save_pretrained(HF_DIR / model_type)   # the first class's default config, as when it alone was tried
    return first


def _summary_runs(folder: Path, training: bool = True) -> bool:
    """Whether `torchdiag summary hf:FOLDER` (in process, default inputs, CPU) gets past the model's forward: any
    exit but 3 (exit 4, torchdiag's own failure, is not a reason to try another config)."""
    from types import SimpleNamespace

    import corpus

    entry = SimpleNamespace(spec=f"hf:{folder}", args=[])
    try:
        model, inputs = corpus.load_spec(entry, "cpu", training)
    except Exception:  # noqa: BLE001 - a model the loader refuses: the zoo run records why
        return False
    return corpus.run_command("summary", model, inputs)["exit"] != 3


def hf_zoo(types=None) -> list[dict]:
    """The transformers part of the zoo: every model type (or those in `types`) with its picked config."""
    from transformers.models.auto import modeling_auto
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    out = []
    HF_DIR.mkdir(parents=True, exist_ok=True)
    for model_type in sorted(types if types is not None else CONFIG_MAPPING.keys()):
        # an encoder-decoder is built as one (its seq2seq LM) where it has that class: its causal-LM class is the
        # decoder alone, whose cross-attention never runs (pegasus in the run of 2026-11-28: no-grad on encoder_attn)
        tasks = HF_TASKS
        if model_type in getattr(modeling_auto, "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", {}):
            tasks = tuple(sorted(HF_TASKS, key=lambda tm: tm[0] != "seq2seq"))
        # a mapping's value is a class name, or a tuple of them (DeiT's and LeViT's image classifiers, with and without
        # a teacher): each tried in turn (a tuple given to getattr made those rows a TypeError)
        mapped = [getattr(modeling_auto, m)[model_type] for _, m in tasks if model_type in getattr(modeling_auto, m, {})]
        classes = [n for v in mapped for n in (v if isinstance(v, (tuple, list)) else (v,))]
        row = {"name": f"hf_{model_type}", "family": "hf", "args": [], "why": f"transformers {model_type}"}
        if not classes:
            continue     # no Auto class builds it (a config-only or sub-model type)
        try:
            cls, how, config, params, why = _pick_class(model_type, classes)
        except Exception as exc:  # noqa: BLE001 - recorded: not buildable from a small config
            row.update(build_error=f"{type(exc).__name__}: {str(exc)[:200]}")
            out.append(row)
            continue
        # the spec relative to the repository root (make corpus runs there)
        row.update(spec=f"hf:{(HF_DIR / model_type).relative_to(HERE.parent)}", params=params,
                   why=f"transformers {model_type} ({cls.__name__}, {how})")
        if why:
            row["build_error"] = why
        out.append(row)
        print(f"hf {model_type}: {cls.__name__} {params}", file=sys.stderr, flush=True)
    return out


def main(argv=None) -> int:
    import importlib.metadata as md

    t0 = time.time()
    only = (argv if argv is not None else sys.argv[1:])
    if only == ["--hf"] and ZOO.exists():   # re-list the transformers part only
        entries = [e for e in json.loads(ZOO.read_text())["entries"] if e["family"] != "hf"] + hf_zoo()
    elif len(only) == 2 and only[0] == "--hf-types" and ZOO.exists():   # re-pick these types' configs only
        types = only[1].split(",")
        new = {e["name"]: e for e in hf_zoo(types)}
        entries = [new.pop(e["name"], e) for e in json.loads(ZOO.read_text())["entries"]] + list(new.values())
    else:
        entries = torchvision_zoo() + timm_zoo() + hf_zoo()
    versions = {p: md.version(p) for p in ("torch", "torchvision", "timm", "transformers")}
    ZOO.write_text(json.dumps({"versions": versions, "entries": entries}, indent=1))
    print(f"{len(entries)} entries in {time.time() - t0:.0f} s -> {ZOO}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
