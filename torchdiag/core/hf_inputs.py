"""Default inputs of a Hugging Face model whose forward reads neither token ids nor one image (issue 26):
audio (`input_values` waveforms, `input_features` filter banks), time series (`past_values` with their
time features, masks and padding), video (`pixel_values_videos`, or `pixel_values` of a config with
`num_frames`), embeddings. Nothing here knows a model by name: the inputs asked for are the model class's
`main_input_name` and the forward's required parameters; their sizes come from the config (its lengths and
feature sizes, by what the config calls them); which layout the model takes is found by a probe forward
on the built model (core.inputs.source_inputs), which keeps the first candidate that runs.

A candidate is a tuple of specs: `SHAPE:DTYPE` is positional (the forward's first parameter), and
`name=SHAPE:DTYPE` a keyword; a `~ones` / `~zeros` suffix fills the tensor (masks, padding), `~each=A,B,C` gives
every row those values (a grid), `~grid=G` each row the (x, y) of a patch on a grid G patches wide. A dimension
after the first may be 0 (a config with no time features)."""
from __future__ import annotations

import inspect
import math
import types

VARIANTS = 4               # layouts of the inputs besides the main one (_other)
MAX_CANDIDATES = 96        # probe forwards at most; a wrong layout fails in the first layer, so they are cheap
TEXT_LENGTH = 128
AUDIO_SECONDS = 1          # a waveform's default length: this many seconds at the config's sampling rate
VIDEO_FRAMES = 8           # when the config names no num_frames
SHAPES_EACH = 12           # shapes tried for an optional input a forward needs (optional_specs)
MAX_FRAMES = 4096          # a longer sequence is tried as a waveform only (hf: speecht5 read 16000 frames of
                           # features as hidden states: attention over them took the worker's memory)
# config keys that give a sequence's length, and an input's feature (channel) size; by what the key means
_LENGTH_KEYS = ("context_length", "max_source_positions", "num_mel_frames", "max_length", "seq_len", "spec_size")
_FEATURE_KEYS = ("mel_bins", "feature_size", "feat_per_channel", "projection_input_dim", "input_dim",
                 "input_channels", "input_size", "num_channels", "in_channels")
_WIDTH_KEYS = ("hidden_size", "d_model", "embed_dim")


def forward_names(cls) -> tuple[str, list[str]]:
    """(the input the class reads first, the forward's required parameters in order)."""
    params = list(forward_params(cls).values())[1:]   # without self
    named = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = [p.name for p in named if p.default is inspect.Parameter.empty]
    main = getattr(cls, "main_input_name", None)
    if isinstance(main, (list, tuple)):    # OneFormer names two: ["pixel_values", "task_inputs"]
        main = main[0] if main else None
    if not isinstance(main, str) or main not in {p.name for p in named}:
        # a class attribute inherited from another modality's base class (Sam3LiteTextTextModel: pixel_values)
        main = named[0].name if named else main if isinstance(main, str) else "input_ids"
    return main, required


def needs_candidates(cls, config) -> bool:
    """True when the default token ids / image (core.sources) cannot be what the forward reads."""
    main, required = forward_names(cls)
    if main == "pixel_values" and frames_of(config) is None:
        # an image of patches beside their shapes (SigLIP2) is a layout of its own, even with pixel_values optional
        return bool(set(required) - {main}) or _patches_with_shapes(cls, config) is not None
    return main != "input_ids" or bool(set(required) - {main})


def _ints(config) -> dict[str, int]:
    """The config's integer attributes, its sub-configs' after its own (the first name found wins)."""
    out: dict[str, int] = {}
    subs = []
    for key, value in vars(config).items():
        if isinstance(value, int) and not isinstance(value, bool):
            out.setdefault(key, value)
        elif hasattr(value, "to_dict") and hasattr(value, "model_type"):
            subs.append(value)
    for sub in subs:
        for key, value in _ints(sub).items():
            out.setdefault(key, value)
    return out


def frames_of(config, nested: bool = False) -> int | None:
    """The frame count the config names (`nested`: or one of its sub-configs, a video tower's)."""
    frames = _ints(config).get("num_frames") if nested else getattr(config, "num_frames", None)
    return frames if isinstance(frames, int) and not isinstance(frames, bool) and frames > 0 else None


def _lengths(config, main: str) -> list[int]:
    ints = _ints(config)
    lags = getattr(config, "lags_sequence", None)
    lag = max(lags) if isinstance(lags, (list, tuple)) and lags and all(isinstance(v, int) for v in lags) else 0
    out = []
    if "context_length" in ints:
        out += [ints["context_length"] + lag, ints["context_length"]]
    if "max_source_positions" in ints:   # an audio encoder whose convolutions halve the frames (Whisper-like)
        out += [2 * ints["max_source_positions"], ints["max_source_positions"]]
    out += [ints[k] for k in _LENGTH_KEYS[2:] if k in ints]
    rate = ints.get("sampling_rate", 16000)
    waveform = [AUDIO_SECONDS * rate]
    # shortest first: a config's maximum (max_source_positions of 5000) is a bound, and attention over it is
    # slow; a model that needs exactly that length (Whisper) refuses the shorter ones in its first layer
    out = sorted(set(v for v in out + [TEXT_LENGTH] if 0 < v <= 10 ** 6))
    return (waveform + out) if main.endswith("input_values") else (out + waveform)


def _features(config, generic: bool) -> list[int]:
    """Feature sizes the config names: for inputs (filter banks, channels), or (generic) the model's width."""
    ints = _ints(config)
    keys = _WIDTH_KEYS if generic else _FEATURE_KEYS
    found = [(rank, v) for k, v in ints.items() for rank, end in enumerate(keys) if k.endswith(end) and 0 < v <= 8192]
    if not generic and "input_feat_per_channel" in ints and "input_channels" in ints:   # banks stacked per channel
        found.insert(0, (-1, ints["input_feat_per_channel"] * ints["input_channels"]))
    out = [v for _, v in sorted(found, key=lambda t: t[0])]
    return [v for i, v in enumerate(out) if v not in out[:i]]


def image_of(config, nested: bool = True) -> tuple[int, int, int] | None:
    """(channels, height, width) from the config's image_size, else (`nested`) its sub-configs' (a detector's
    backbone, a segmenter's vision encoder: SAM keeps 1024 in vision_config); None when no config names one."""
    found = _image(config)
    if found is None and nested:
        found = next((f for value in vars(config).values() if hasattr(value, "to_dict") and hasattr(value, "model_type")
                      and (f := image_of(value)) is not None), None)
    return _scaled_down(config, found)


def _scaled_down(config, found):
    """The image at least patch_size / min(scaled_images_ratios) a side, for a config whose model also reads the
    image scaled down by each of those ratios and cuts every scaled copy into patch_size patches (DepthPro:
    384 / 0.25 = 1536; its encoder refuses a smaller image, modeling_depth_pro.py:244)."""
    ratios = getattr(config, "scaled_images_ratios", None)
    patch = getattr(config, "patch_size", None)
    if found is None or type(patch) is not int or not (isinstance(ratios, (list, tuple)) and ratios and all(
            isinstance(r, (int, float)) and not isinstance(r, bool) and 0 < r <= 1 for r in ratios)):
        return found
    side = math.ceil(patch / min(ratios) - 1e-9)
    c, h, w = found
    return c, max(h, side), max(w, side)


IMAGE_SIDES = ("image_size", "img_size", "max_image_size", "max_img_size")   # the keys a config names an image's
# side by (TVP's frame prompter pads every frame to max_img_size, transformers' modeling_tvp.py:650-668)


def _image(config) -> tuple[int, int, int] | None:
    size = next((v for k in IMAGE_SIDES if (v := getattr(config, k, None)) is not None), None)
    if type(size) is int:
        size = (size, size)
    if not (isinstance(size, (list, tuple)) and len(size) >= 2 and all(type(v) is int for v in size[:2])):
        return None
    return getattr(config, "num_channels", 3) if type(getattr(config, "num_channels", 3)) is int else 3, size[0], size[1]


def _main_shapes(config, main: str) -> list[tuple[tuple[int, ...], str, int | None]]:
    """(shape without the batch dimension, dtype, its sequence length or None) for the main input, most likely
    first."""
    image = image_of(config)
    if main.startswith("pixel_values"):
        c, h, w = image or (3, 224, 224)
        t = frames_of(config) or frames_of(config, nested=True) or VIDEO_FRAMES   # a video tower's (VideoPrism)
        return [((t, c, h, w), "float32", None), ((c, t, h, w), "float32", None), ((c, h, w), "float32", None)]
    if main.endswith(("_ids", "_index")):
        return [((TEXT_LENGTH,), "int64", TEXT_LENGTH)]
    shapes: list[tuple[tuple[int, ...], str, int | None]] = []
    specific, generic = _features(config, generic=False), _features(config, generic=True)
    # a one-word input's own size first (Decision Transformer's states: state_dim); a longer name's stems
    # (input_values: input_) are the feature keys already
    own = _named_sizes(main, config) if "_" not in main else []
    specific = own + [f for f in specific if f not in own]
    for length in _lengths(config, main):   # a feature size the config names for inputs, then a plain sequence,
        if length > MAX_FRAMES:             # then the model's own width (embeddings of that width)
            # a waveform only (attention over it would not fit): flat, or as one channel (a codec's Conv1d)
            shapes += [((length,), "float32", length), ((1, length), "float32", length)]
            continue
        for f in specific:
            shapes += [((length, f), "float32", length), ((f, length), "float32", length)]
            if main.endswith("_features"):   # filter banks as a one-channel image (ClapAudioModel)
                shapes.append(((1, length, f), "float32", length))
        shapes.append(((length,), "float32", length))
        if main.endswith("input_values"):   # a waveform as one channel (a codec's Conv1d)
            shapes.append(((1, length), "float32", length))
        for f in generic:
            if f not in specific:
                shapes += [((length, f), "float32", length), ((f, length), "float32", length)]
    if isinstance(getattr(config, "vocab_size", None), int):   # a byte/token reader under another name (Perceiver)
        shapes.append(((TEXT_LENGTH,), "int64", TEXT_LENGTH))
    return shapes


def _dims(shape) -> str:
    return "x".join(str(d) for d in (1,) + tuple(shape))


def _other(name: str, main_shape: tuple[int, ...], config, variant: int, boolean: bool = False) -> str | None:
    """A required input besides the main one, shaped from the main input's; `variant` picks the layout.
    `boolean`: the forward annotates it as a bool tensor (a mask of either sense: True may mean padding)."""
    length = main_shape[0]
    ints = _ints(config)
    if "time_features" in name:
        return f"{_dims((length, ints.get('num_time_features', 0)))}:float32"
    if "mask" in name and boolean:
        return [f"{_dims((length,))}:bool~ones", f"{_dims((length,))}:bool~zeros", f"{_dims(main_shape)}:bool~ones",
                f"{_dims(main_shape)}:bool~zeros"][variant]
    if "mask" in name:
        return [f"{_dims(main_shape)}:float32~ones", f"{_dims((length,))}:int64~ones", None, None][variant]
    if "padding" in name:
        return [f"{_dims(main_shape)}:int64~zeros", f"{_dims((length,))}:int64~zeros", None, None][variant]
    if name.endswith("position_ids"):   # a token's position, 0, 1, ... as the model derives it: random ids read as
        return f"{_dims((length,))}:int64~arange=0"   # one-token packed sequences (ESM: every query saw one key)
    if name.endswith(("_ids", "_index")):
        return f"{_dims((length,))}:int64~zeros"
    if name.endswith("input_values"):   # a waveform beside another main input (PE Audio's beside its ids): one
        wave = AUDIO_SECONDS * ints.get("sampling_rate", 16000)   # channel (a codec's Conv1d), or flat
        return [f"{_dims((1, wave))}:float32", f"{_dims((wave,))}:float32", None, None][variant]
    if name.startswith("pixel_values") and not name.endswith("mask"):   # images or video beside another main
        # input (PE Video's pixel_values_videos beside its ids): shaped as a main input of that name is
        images = [f"{_dims(shape)}:{dtype}" for shape, dtype, _ in _main_shapes(config, name)]
        return images[variant] if variant < len(images) else None
    hidden = next(iter(_features(config, generic=True) + _features(config, generic=False)), 32)
    named = _named_sizes(name, config, _LENGTH_ENDS)
    if named:   # a sequence of the length the config names after it (OneFormer's task_inputs: task_seq_len), as
        # values (a forward that casts it for a Linear) or ids; then like the main one, or embeddings
        return [f"{_dims((named[0],))}:float32", f"{_dims((named[0],))}:int64", f"{_dims(main_shape)}:float32",
                f"{_dims((length, hidden))}:float32"][variant]
    # another input like the main one (a prompt image beside the image), an index per sample (as a column, or
    # flat), or embeddings
    return [f"{_dims(main_shape)}:float32", f"{_dims((1,))}:int64~zeros", f"{_dims(())}:int64~zeros",
            f"{_dims((length, hidden))}:float32"][variant]


def _beside(name: str, main_shape: tuple[int, ...], config, variant: int, boolean: bool = False) -> str | None:
    """A required input beside the main one, for the forward's layouts (_layouts): as _other, but features
    (`*_features`) are shaped as a main input of that name is, from the config's feature sizes and lengths (a
    codec's filter banks beside its waveform: a (frames, feature_size) spectrogram, not a copy of the waveform's
    shape), as images beside another main input are; `variant` picks the shape, most likely first."""
    if name.endswith("_features") and "time_features" not in name:   # time features: _other (num_time_features)
        shapes = [f"{_dims(shape)}:{dtype}" for shape, dtype, _ in _main_shapes(config, name)]
        return shapes[variant] if variant < len(shapes) else None
    return _other(name, main_shape, config, variant, boolean)


def candidates(cls, config) -> list[tuple[str, ...]]:
    """Spec tuples to try in order (see the module's docstring)."""
    main, required = forward_names(cls)
    params = forward_params(cls)
    first = next(iter(list(params)[1:]), None)
    others = [n for n in required if n != main]
    out = _layouts(cls, config, main, others, first)
    mask = f"{main}_mask"
    if mask in params and mask not in others:   # an optional mask of the main input some forwards read regardless
        out += _layouts(cls, config, main, others, first, mask)   # (AudioFlamingo3): tried after the others
    packed = _packed_patches(cls, config)
    shaped = _patches_with_shapes(cls, config) or _patches_with_positions(cls, config)
    out = packed + ([shaped] if shaped and not packed else []) + out
    return [c for i, c in enumerate(out) if c not in out[:i]][:MAX_CANDIDATES]


def optional_specs(name: str, specs, model) -> list[str]:
    """Specs for the optional input `name` beside `specs` (batch and main shape from their first), most likely
    first: a size the config names after the input (visual_feat_dim for visual_feats), a (rows, columns) pair
    for per-sample sizes, the shapes of a main input of that name (_main_shapes), then those of a required one
    (_other). For core.optional_inputs: an input the forward takes as optional and its error says it needs."""
    config = getattr(model, "config", None) or types.SimpleNamespace()
    dims = specs[0].partition("=")[2] if "=" in specs[0] else specs[0]
    lead = [int(d) for d in dims.split(":")[0].split("x")]
    batch, main = lead[0], tuple(lead[1:])
    length = main[0] if main else 1
    params = forward_params(type(model))
    boolean = _boolean(params.get(name))
    out = [f"{_dims((length, f))}:float32" for f in _named_sizes(name, config)]
    if name.endswith(("_sizes", "_shapes")):   # a (rows, columns) a sample: of patches, then of pixels
        c, h, w = image_of(config) or (3, TEXT_LENGTH, TEXT_LENGTH)
        p = patch_of(config)
        out += [f"1x2:int64~each={h // p},{w // p}", f"1x2:int64~each={h},{w}"]
    if name.startswith("pixel_values") or name.endswith(("_features", "_values", "_feats")):
        for shape, dtype, _ in _main_shapes(config, name):
            out.append(f"{_dims(shape)}:{dtype}")
            if len(shape) == 2 and dtype == "float32":   # filter banks as one channel (an image of them: CLAP)
                out.append(f"{_dims((1,) + shape)}:{dtype}")
    out += _along_ids(name, specs, main, boolean)
    out += [s for v in range(VARIANTS) if (s := _other(name, main, config, v, boolean))]
    if boolean:   # a flag a sample (CLAP's is_longer) where the forward annotates a bool tensor
        out = [s.replace(":int64", ":bool") for s in out]
    out = list(dict.fromkeys(out))[:SHAPES_EACH]
    specs = [f"{name}={batch}{s[1:]}" for s in out]
    if name.endswith(("_sizes", "_shapes")) and batch > 1:
        # then one row for the whole batch: a forward that packs its images into one sequence reads one size for
        # them all (MiniCPM-V's vision tower adds one row of positions to every sample)
        specs[2:2] = [f"{name}={s}" for s in out[:2]]
    return specs


def _along_ids(name: str, specs, main: tuple[int, ...], boolean: bool) -> list[str]:
    """A mask or ids beside token ids given as a keyword, where the main input is not a sequence (pixels first): as
    long as those ids, all ones (Kosmos-2's image_embeds_position_mask marks where its image embeddings go, one per
    position of its ids: shaped as the pixels, it was no layout the forward could read)."""
    if len(main) < 2 or not ("mask" in name or name.endswith("_ids")):
        return []
    out = []
    for spec in specs[1:]:
        key, _, rest = spec.partition("=")
        shape, _, tail = rest.partition(":")
        dims = shape.split("x")
        if key.endswith("input_ids") and tail.startswith("int64") and len(dims) == 2 and dims[1].isdigit():
            out.append(f"{_dims((int(dims[1]),))}:{'bool' if boolean else 'int64'}~ones")
    return out


_SIZE_ENDS = ("_dim", "_size", "_features", "_channels")
_LENGTH_ENDS = ("_len", "_length")


def _named_sizes(name: str, config, ends: tuple[str, ...] = _SIZE_ENDS) -> list[int]:
    """Feature sizes the config names after the input: keys that start with its name, its last word singular, or
    its words but the last (visual_pos: visual_pos_dim; visual_feats: visual_feat_dim; encoder_hidden_states:
    encoder_hidden_size; states: state_dim), and end in one of `ends` (_LENGTH_ENDS: a sequence's length,
    task_inputs: task_seq_len)."""
    words = name.split("_")
    singular = words[-1][:-1] if words[-1].endswith("s") else words[-1]
    stems = [f"{name}_", "_".join(words[:-1] + [singular]) + "_", "_".join(words[:-1]) + "_"]
    if len(words) < 2:   # one word: itself and its singular (states: state_dim), not the empty stem
        stems = stems[:2]
    found = [v for stem in stems for k, v in _ints(config).items() if k.startswith(stem) and 0 < v <= 8192
             and k.endswith(ends)]
    return list(dict.fromkeys(found))


def _boolean(param) -> bool:
    """The forward annotates the parameter as a bool tensor (torch.BoolTensor)."""
    return param is not None and "BoolTensor" in str(param.annotation)


def _layouts(cls, config, main: str, others: list[str], first, mask: str | None = None) -> list[tuple[str, ...]]:
    """The candidates for the main input's shapes with `others` beside it (see candidates); `mask`: an optional
    mask of the main input, given as ones over its sequence (its frames, whichever axis they are)."""
    params = forward_params(cls)
    futures = _futures([main] + others, cls, config)
    decoder = f"decoder_{main}" if f"decoder_{main}" in params and f"decoder_{main}" not in others else None
    out: list[tuple[str, ...]] = []
    for shape, dtype, length in _main_shapes(config, main):
        if mask and length is None:
            continue
        head = f"{_dims(shape)}:{dtype}"
        head = head if main == first else f"{main}={head}"
        for variant in range(VARIANTS if others else 1):
            specs = [_beside(n, shape, config, variant, _boolean(params.get(n))) for n in others]
            if mask:
                specs.append(f"{_dims((length,))}:{'bool' if _boolean(params.get(mask)) else 'int64'}~ones")
            if futures:   # what the model predicts, shaped like what it reads (prediction_length steps)
                later = (futures[1],) + tuple(shape[1:])
                specs += [_other(n, later, config, variant) if n != futures[2] else f"{_dims(later)}:{dtype}"
                          for n in futures[0]]
            names = others + ([mask] if mask else []) + (futures[0] if futures else [])
            if decoder:   # an encoder-decoder's decoder reads the same kind of input (as decoder_input_ids)
                names, specs = names + [decoder], specs + [f"{_dims(shape)}:{dtype}"]
            out.append((head,) + tuple(f"{n}={s}" for n, s in zip(names, specs) if s is not None))
    ids = _decoder_ids(cls, config, main, others, decoder)
    out += [c + (ids,) for c in out] if ids else []     # after the layouts without them: a decoder that needs them
    return out


PACKED_IMAGES = 2          # images in a packed-patches default, each a grid of 1 x (4·merge) x (4·merge) patches
MERGES = 4                 # merged patches along each side of such an image


def _packed_patches(cls, config) -> list[tuple[str, ...]]:
    """A vision tower that reads every image's patches packed into one (patches, features) tensor beside a
    (images, 3) grid of their (frames, rows, columns) (a `*grid_thw` parameter: Qwen2-VL-style towers): two
    images of 1 x g x g patches, g a multiple of the config's spatial merge size, each patch flattened from
    channels (in_channels or num_channels) x temporal_patch_size (1 when none) x patch_size², then each patch
    as (channels, [frames,] rows, columns) (Kimi-K2.5's tower). A required per-image `*_sizes` input beside them
    gets the merge size (VideoLLaMA3's merge_sizes). [] for another forward, or a config without those sizes."""
    params = forward_params(cls)
    grid = next((n for n in params if n.endswith("grid_thw")), None)
    _, required = forward_names(cls)
    patches = next((n for n in required if n != grid and not n.endswith("_sizes")), None)
    if grid is None or patches is None:
        return []
    flat = packed_patches(patches, grid, config)
    if flat is None:
        return []
    sizes = tuple(f"{n}={PACKED_IMAGES}:int64~each={merge_of(config)}" for n in required
                  if n.endswith("_sizes") and n != patches)
    ints = _ints(config)
    c, t, p = _channels(ints), _temporal(ints), ints.get("patch_size", 0)
    mh, mw = merge_pair(config)
    count = PACKED_IMAGES * MERGES * mh * MERGES * mw
    shape = "x".join(str(d) for d in (count, c) + ((t,) if t > 1 else ()) + (p, p))
    out = [flat + sizes, (f"{patches}={shape}:float32", *flat[1:], *sizes)]
    if t == 1:   # or the grid counts merged patches, each cell a row of (merged rows, merged columns, channels)
        # pixels (Inkling2's tower: one row per language-model image token, the grid in those tokens)
        out.append((f"{patches}={count}x{mh * p}x{mw * p}x{c}:float32", *flat[1:], *sizes))
    return out


def packed_patches(patches: str, grid: str, config) -> tuple[str, ...] | None:
    """The specs of _packed_patches for these parameter names (None when the config names no patch sizes)."""
    size = _patch_size(config)
    if size is None:
        return None
    mh, mw = merge_pair(config)
    rows, cols = MERGES * mh, MERGES * mw
    return (f"{patches}={PACKED_IMAGES * rows * cols}x{size}:float32",
            f"{grid}={PACKED_IMAGES}x3:int64~each=1,{rows},{cols}")


def _patches_with_shapes(cls, config) -> tuple[str, ...] | None:
    """A vision tower that reads each image as a row of flattened patches beside its `spatial_shapes` (rows,
    columns) and a patch mask (SigLIP2's NaFlex): g x g patches a sample, g the square root of the config's
    num_patches (16 when it names none), every patch real."""
    params = forward_params(cls)
    if "spatial_shapes" not in params:
        return None
    _, required = forward_names(cls)
    named = [n for n in params if n not in ("self", "spatial_shapes") and params[n].kind in
             (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    patches = next((n for n in required + named if n.startswith("pixel") and "mask" not in n), None)
    size = _patch_size(config)
    if patches is None or size is None:
        return None
    n = _ints(config).get("num_patches", 256)
    g = math.isqrt(n) if n > 0 and math.isqrt(n) ** 2 == n else 16
    masks = [f"{m}=1x{g * g}:int64~ones" for m in named if m.startswith("pixel") and "mask" in m]
    return (f"{patches}=1x{g * g}x{size}:float32", *masks, f"spatial_shapes=1x2:int64~each={g},{g}")


def _patches_with_positions(cls, config) -> tuple[str, ...] | None:
    """A vision tower that reads each image as a row of flattened patches beside a required `*position_ids` of
    each patch's (x, y) (Gemma 4's): g x g patches a sample, g MERGES times the config's pooling kernel (or merge
    size), so that its pooling takes whole windows; None for another forward or a config without patch sizes."""
    _, required = forward_names(cls)
    patches = next((n for n in required if n.startswith("pixel") and "mask" not in n), None)
    positions = next((n for n in required if n.endswith("position_ids")), None)
    size = _patch_size(config)
    if patches is None or positions is None or size is None:
        return None
    g = MERGES * (_ints(config).get("pooling_kernel_size") or merge_of(config))
    return f"{patches}=1x{g * g}x{size}:float32", f"{positions}=1x{g * g}x2:int64~grid={g}"


def forward_params(cls) -> dict:
    """The forward's parameters by name (self included); {} when they cannot be read."""
    try:
        return dict(inspect.signature(cls.forward).parameters)
    except (TypeError, ValueError, AttributeError):
        return {}


def patch_of(config) -> int:
    """The config's patch side (1 when it names none)."""
    p = _ints(config).get("patch_size", 1)
    return p if p > 0 else 1


def merge_of(config) -> int:
    """The config's spatial merge size (1 when it names none): the larger of merge_pair's two."""
    return max(merge_pair(config))


def merge_pair(config) -> tuple[int, int]:
    """Patches merged along rows and columns: spatial_merge_size or merge_size (square), else a
    merge_kernel_size pair (Kimi-K2.5's, which may be (2, 3)); the config's own first, then its sub-configs';
    (1, 1) when none is named."""
    ints = _ints(config)
    m = ints.get("spatial_merge_size", ints.get("merge_size"))
    if m is not None:
        return (m, m) if m > 0 else (1, 1)
    for c in [config] + [v for v in vars(config).values() if hasattr(v, "to_dict") and hasattr(v, "model_type")]:
        kernel = getattr(c, "merge_kernel_size", None)
        if (isinstance(kernel, (list, tuple)) and len(kernel) == 2
                and all(type(k) is int and k > 0 for k in kernel)):
            return kernel[0], kernel[1]
    return 1, 1


def _patch_size(config) -> int | None:
    """The values of one flattened patch: channels x temporal_patch_size x patch_size², from the config."""
    ints = _ints(config)
    c, t, p = _channels(ints), _temporal(ints), ints.get("patch_size", 0)
    return c * t * p * p if min(c, t, p) > 0 else None


def _channels(ints: dict) -> int:
    """An image patch's channels: in_channels or num_channels, RGB's 3 when the config names neither."""
    return ints.get("in_channels", ints.get("num_channels", 3))


def _temporal(ints: dict) -> int:
    """Frames in one patch: temporal_patch_size (Qwen2-VL) or patch_temporal (Muse), 1 when none."""
    return ints.get("temporal_patch_size", ints.get("patch_temporal", 1))


def _decoder_ids(cls, config, main: str, others: list[str], decoder: str | None) -> str | None:
    """`decoder_input_ids=...` for an encoder-decoder that reads audio or images and writes tokens (a speech
    recogniser: Speech2Text, Moonshine, Canary), whose decoder fails without ids; None when the forward takes
    none, already gets them, or reads token ids itself (core.inputs gives those their decoder ids)."""
    params = forward_params(cls)
    if main == "input_ids" or decoder or "decoder_input_ids" not in params or "decoder_input_ids" in others:
        return None
    ints = _ints(config)
    length = min([TEXT_LENGTH] + [v for k, v in ints.items() if k in ("max_target_positions", "max_length") and v > 1])
    return f"decoder_input_ids={_dims((min(length, 16),))}:int64"


def _futures(names: list[str], cls, config):
    """A forecaster trained on what follows its context: for every required `past_X` the forward also takes a
    `future_X`, given for `prediction_length` steps (without them its decoder has nothing to read in train
    mode). (names, length, the future of the main input) or None."""
    length = getattr(config, "prediction_length", None)
    params = forward_params(cls)
    pairs = [(n, "future_" + n[5:]) for n in names if n.startswith("past_") and "future_" + n[5:] in params]
    if not pairs or not (isinstance(length, int) and length > 0):
        return None
    return [f for _, f in pairs], length, pairs[0][1] if pairs[0][0] == names[0] else None


CODEBOOK_KEYS = ("num_codebooks", "num_channels")   # a config's count of parallel token streams (codebooks)


def codebook_layouts(cls, config, ids: str) -> tuple[tuple[str, ...], ...]:
    """Layouts for a forward that reads token ids of several parallel streams, one per codebook of an audio codec,
    stacked on a trailing axis (tried after plain ids do not run). The ids (batch, length, K + 1), a text stream
    beside K codebooks, then (batch, length, K), for a config that names num_codebooks K, with values below its
    smallest vocabulary (vocab_size, codebook_vocab_size: the embedding adds each stream's offset into one table);
    then decoder ids (batch, length, K) beside the plain ids, where the forward takes decoder_input_ids and its
    decoder's sub-config (decoder_config) names num_codebooks or num_channels K. () otherwise."""
    params = forward_params(cls)
    dims = ids.split(":")[0].split("x")
    if len(dims) != 2 or not all(d.isdigit() for d in dims):
        return ()
    batch, length = dims
    out: list[tuple[str, ...]] = []
    k = getattr(config, "num_codebooks", None)
    if type(k) is int and k > 0 and next(iter(list(params)[1:]), None) == "input_ids":
        vocabs = [v for key in ("vocab_size", "codebook_vocab_size", "codebook_size")
                  if type(v := getattr(config, key, None)) is int and v > 1]
        high = f"[0,{min(vocabs)})" if vocabs else ""
        out += [(f"{batch}x{length}x{n}:int64{high}",) for n in (k + 1, k)]
    decoder = getattr(config, "decoder_config", None) or getattr(config, "decoder", None)
    if "decoder_input_ids" in params and hasattr(decoder, "to_dict"):
        k = next((v for key in CODEBOOK_KEYS if type(v := getattr(decoder, key, None)) is int and v > 1), None)
        if k is not None:
            out.append((ids, f"decoder_input_ids={batch}x{min(int(length), 16)}x{k}:int64"))
    return tuple(out)


def images_per_sample(cls, config, ids: str) -> tuple[tuple[str, ...], ...]:
    """A layout for a forward that reads token ids and cross-attends to images it takes as (batch, images, C, H, W)
    pixel_values, beside a required `image_attention_mask` of which images each token sees (batch, length, images):
    one image every token sees. () for a forward without both parameters."""
    params = forward_params(cls)
    if "pixel_values" not in params or "image_attention_mask" not in params:
        return ()
    dims = ids.split(":")[0].split("x")
    if len(dims) != 2:
        return ()
    c, h, w = image_of(config) or (3, 224, 224)
    return ((ids, f"pixel_values={dims[0]}x1x{c}x{h}x{w}:float32",
             f"image_attention_mask={dims[0]}x{dims[1]}x1:int64~ones"),)


def _token_boxes(shape, dt):
    """(..., L, 4) boxes (x0, y0, x1, y1): the L tokens read as lines of text, ceil(sqrt(L)) words a line, each
    word's box its cell; on LayoutLM's 0..1000 grid for an integer dtype, in [0, 1] for a float one (Bros). Boxes
    at different distances give a layout model's relative-position biases something to learn from: one box for
    every token (or one line) leaves them constant over the keys, and their gradient is rounding noise."""
    import math

    import torch

    n = shape[-2] if len(shape) >= 2 else 1
    per_line = max(1, math.isqrt(n - 1) + 1) if n > 1 else 1
    lines = -(-n // per_line)
    i = torch.arange(n, dtype=torch.float64)
    col, row = i % per_line, (i // per_line)
    top = 1.0 if dt.is_floating_point else 1000.0
    cells = [col / per_line, row / lines, (col + 1) / per_line, (row + 1) / lines]
    box = torch.stack([c * top if top == 1.0 else (c * top).floor() for c in cells], 1)
    return box.to(dt).expand(shape).clone()


def describe(specs: tuple[str, ...], main: str) -> str:
    return ", ".join(s if "=" in s else f"{main}={s}" for s in specs)


def split(spec: str) -> tuple[str | None, str, str | None]:
    """'name=SHAPE:DTYPE~fill' -> (name or None, 'SHAPE:DTYPE', fill or None)."""
    named, eq, rest = spec.partition("=")
    name: str | None = named
    if not eq:
        name, rest = None, spec
    body, _, fill = rest.partition("~")
    return name, body, fill or None


def make(spec: str, device, generator):
    """The tensor of one named spec (shapes may hold 0 after the batch dimension)."""
    import torch

    from ..errors import UsageError
    from .resources import memory_limit

    name, body, fill = split(spec)
    dims, _, dtype = body.partition(":")
    shape = tuple(int(d) for d in dims.split("x")) if dims else ()
    dt = getattr(torch, dtype or "float32")
    if device.type == "meta":
        return torch.empty(shape, dtype=dt, device="meta")
    nbytes = math.prod(shape) * torch.empty((), dtype=dt).element_size()
    if nbytes > memory_limit():   # a config size of 10^9 frames: one line, as a -i shape gets (a review)
        raise UsageError(f"input {name or spec} ({'x'.join(map(str, shape))}) would take {nbytes / 2**30:.1f} GiB",
                         hint="give the inputs with -i, or a config with smaller sizes")
    if fill == "ones":
        return torch.ones(shape, dtype=dt, device=device)
    if fill == "half":   # ones on the first half of the last dimension, zeros after (a mask that marks some)
        row = (torch.arange(shape[-1] if shape else 1) < ((shape[-1] + 1) // 2 if shape else 1)).to(dt)
        return row.expand(shape).clone().to(device)
    if fill == "boxes":   # a box per token, the tokens read as lines of text (see _token_boxes)
        return _token_boxes(shape, dt).to(device)
    if fill and fill.startswith("arange="):   # ids start, start + 1, ... along the last dimension
        start = int(fill[7:])
        row = torch.arange(start, start + (shape[-1] if shape else 1)).to(dt)
        return row.expand(shape).clone().to(device)
    if fill and fill.startswith("grid=") and len(shape) >= 2:   # (x, y) of each row's patch on a grid G wide
        side, i = int(fill[5:]), torch.arange(shape[-2])
        return torch.stack([i % side, i // side], -1).to(dt).expand(shape).clone().to(device)
    if fill and fill.startswith("each="):
        row = torch.tensor([float(v) for v in fill[5:].split(",")]).to(dt)
        return row.expand(shape).clone().to(device)
    if fill == "zeros" or not dt.is_floating_point:
        return torch.zeros(shape, dtype=dt, device=device)
    return torch.randn(shape, generator=generator).to(dt).to(device)
