"""Models as people have them: `torchvision:NAME`, `timm:NAME`, `hf:PATH` (a local folder with config.json) or
`hf:NAME` (a Hub model in the local Hugging Face cache, core.hub).

Each builds the model with random weights (weights come from `--checkpoint`, or for `hf:` from the
`*.safetensors` beside config.json) and says what inputs the model takes by default. Nothing here
downloads weights: zoo models are built with `weights=None` / `pretrained=False`, Hugging Face
configs are read from disk with the Hub switched offline; only `--download config` (core.hub) fetches a
config.json, when the caller asks."""
from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ModelError, UsageError, host_out_of_memory, one_line
from . import hub
from .limits import json_depth, read_text, regular_file
from .resources import ran_out_building, room_for_model

LABELS_FROM_IDS = "labels = the input ids"   # the header's words (inputs.py says when they changed)
PREFIXES = ("torchvision:", "timm:", "hf:")
NO_NETWORK = "torchdiag never downloads weights (no network access is attempted)"
# --arg task=... for hf: the head on top of the base model
HF_TASKS = {
    "base": "AutoModel",
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq2seq": "AutoModelForSeq2SeqLM",
    "sequence-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "image-classification": "AutoModelForImageClassification",
}
TEXT_LENGTH = 128          # default sequence length of a text model (capped by its position table)
# The commands that run the model in train mode (the registry's `trains`): there a BatchNorm after global pooling
# (ResNeSt's split attention, LeViT's heads) refuses a single sample, so their default batch is TRAIN_BATCH (issue
# 26); the others (summary, flops, ...) keep 1: their numbers are per sample.
TRAIN_BATCH = 2
# A model with BatchNorm gets 3: two samples through a BatchNorm then a mean pool come out as exact negatives
# (each channel loses its batch mean), and against made-up targets [0, 1] of a two-class head their gradients
# on the head's bias cancel: mobilevitv2 under bf16 got false zero-grad errors (a sweep, 2026-12-02).
BATCH_NORM_BATCH = 3
VIDEO_FRAMES = 16          # torchvision video models: (N, C, T, H, W)


@dataclass
class Source:
    """What a source form built: everything core.loading.LoadedModel needs besides the model."""

    build: Callable[..., Any]              # build(**kwargs) -> nn.Module (random weights)
    kwargs: dict[str, Any]
    label: str                             # "torchvision resnet50", for the header
    inputs: tuple[str, ...] = ()           # default -i specs
    input_source: str = ""
    example_inputs: Callable | None = None  # when -i specs cannot say it (a list of images)
    weights: list[str] = field(default_factory=list)  # checkpoint files found beside the spec
    header: dict[str, Any] = field(default_factory=dict)
    labels_from_ids: bool = False          # a causal LM: its default inputs pass labels = the input ids
    head_labels: tuple[str, int] | None = None      # a classification head's (kind, classes): random labels given
    alternatives: tuple[tuple[str, ...], ...] = ()  # further default inputs to try when `inputs` do not run (hf_inputs)
    saved_keys: frozenset[str] | None = None       # hf --arg task: the state-dict keys of the head the weights are of
    normalisation: tuple | None = None   # (mean, std, where from): the model's own input normalisation (gradcam)


def is_source(spec: str) -> bool:
    return spec.startswith(PREFIXES)


def resolve(spec: str, kwargs: dict[str, Any], download: str | None = None) -> Source:
    """The Source a spec names; `download` (--download config) lets hf:NAME fetch its config.json."""
    prefix, _, rest = spec.partition(":")
    if not rest:
        raise UsageError(f"MODEL_SPEC '{spec}' names no model",
                         hint="write torchvision:resnet50, timm:resnet18, hf:path/to/folder-with-config.json or hf:org/name")
    if prefix == "hf":
        return hf_source(rest, kwargs, download)
    return {"torchvision": torchvision_source, "timm": timm_source}[prefix](rest, kwargs)


def require(package: str, extra: str | None = None):
    """Import an optional library; missing → one line with the install command (exit 2)."""
    import importlib

    try:
        return importlib.import_module(package)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == package.split(".")[0]:
            install = f"pip install {package.split('.')[0]}" + (f"  (or pip install 'torchdiag[{extra}]')" if extra else "")
            raise UsageError(f"{package.split('.')[0]} is not installed: {install}",
                             hint=f"{package.split('.')[0]} models need the library; the rest of torchdiag works without it") from exc
        raise UsageError(f"{package} cannot be imported: {one_line(exc)}",
                         hint="install its missing dependency, or a version built for your torch") from exc
    except Exception as exc:  # e.g. a torchvision built for another torch ('operator torchvision::nms does not exist')
        import torch

        raise UsageError(f"{package} cannot be imported with torch {torch.__version__}: {one_line(exc)}",
                         hint=f"install the {package.split('.')[0]} release built for torch {torch.__version__.split('+')[0]}") from exc


def unknown_name(kind: str, name: str, known: list[str], what: str = "model") -> UsageError:
    close = difflib.get_close_matches(name, known, n=4, cutoff=0.5)
    if not close:  # a prefix or a substring is often what was meant (resnet → resnet18, resnet34, ...)
        close = [k for k in known if k.startswith(name) or name in k][:4]
    lister = _LISTERS[kind] if what == "model" else "import torchvision; print(torchvision.datasets.__all__)"
    hint = f"did you mean {', '.join(close)}?" if close else f"list them with: python -c \"{lister}\""
    return UsageError(f"{kind} has no {what} named '{name}'", hint=hint)


_LISTERS = {"torchvision": "import torchvision; print(torchvision.models.list_models())",
            "timm": "import timm; print(timm.list_models())"}


# ---- torchvision -----------------------------------------------------------------------------------

def torchvision_source(name: str, kwargs: dict[str, Any]) -> Source:
    require("torchvision")
    models = require("torchvision.models")
    known = models.list_models()
    if name not in known:
        raise unknown_name("torchvision", name, known)
    kwargs = dict(kwargs)
    if kwargs.get("weights") not in (None, "None"):
        raise UsageError(f"torchvision:{name} is built with random weights; --arg weights=... would download them",
                         hint=f"{NO_NETWORK}: save the weights once (torch.save(model.state_dict(), 'w.pt')) and pass --checkpoint w.pt")
    kwargs.pop("weights", None)
    if kwargs.pop("pretrained", None) not in (None, False, "False", "false"):   # torchvision's old spelling of weights
        raise UsageError(f"torchvision:{name} is built with random weights; --arg pretrained=... would download them",
                         hint=f"{NO_NETWORK}: save the weights once (torch.save(model.state_dict(), 'w.pt')) and pass --checkpoint w.pt")
    import inspect

    if "weights_backbone" in inspect.signature(models.get_model_builder(name)).parameters:
        if kwargs.pop("weights_backbone", None) not in (None, "None"):
            raise UsageError(f"torchvision:{name}: --arg weights_backbone=... would download them",
                             hint=f"{NO_NETWORK}: pass the weights as --checkpoint FILE")
        kwargs["weights_backbone"] = None   # detection/segmentation builders download a backbone by default

    def build(**kw):
        return models.get_model(name, weights=None, **kw)

    source = Source(build, kwargs, f"torchvision {name}", header={"source": f"torchvision:{name}", "random": " (random weights)"})
    _torchvision_inputs(models, name, source)
    return source


def _normalisation(mean, std, where: str) -> tuple | None:
    """(mean, std, where) when both are per-channel numbers of one length, the weights' own preprocessing (the
    size was read from the same object, the normalisation was not: a new user's hour); else None."""
    try:
        m, s = tuple(float(v) for v in mean), tuple(float(v) for v in std)
    except (TypeError, ValueError):
        return None
    return (m, s, where) if m and len(m) == len(s) and all(v > 0 for v in s) else None


def _torchvision_inputs(models, name: str, source: Source) -> None:
    """The default input from the weights enum's transforms: crop size (classification, video),
    resize size (segmentation), a list of images (detection), two frames (optical flow)."""
    try:
        weights = models.get_model_weights(name).DEFAULT
        transform = weights.transforms()
    except Exception:  # no weights enum: the ImageNet size
        weights, transform = None, None
    kind = type(transform).__name__ if transform is not None else "ImageClassification"
    size = getattr(transform, "crop_size", None) or getattr(transform, "resize_size", None) or [224]
    h, w = (size[0], size[-1])
    if transform is None:
        why = "no weights enum: the ImageNet size"
    else:
        why = f"{weights}.transforms() {'crop_size' if getattr(transform, 'crop_size', None) else 'resize_size'} {h}x{w}"
        source.normalisation = _normalisation(getattr(transform, "mean", None), getattr(transform, "std", None),
                                              f"{weights}.transforms()")
    if kind == "VideoClassification":
        source.inputs = (f"1x3x{VIDEO_FRAMES}x{h}x{w}",)
        why += f", {VIDEO_FRAMES} frames"
    elif kind == "OpticalFlow":
        source.inputs = ("1x3x224x224", "1x3x224x224")
        why = "two 224x224 frames (optical flow)"
    elif kind == "ObjectDetection" or name in models.list_models(module=models.detection):
        source.example_inputs = _one_image
        why = "a list of one 3x320x320 image (detection models resize it themselves)"
    else:
        (_, h2, w2), given = _given_size((3, h, w), source.kwargs, None, "image_size")
        if given:   # a ViT built for another size: the weights' size no longer fits it
            source.inputs, source.input_source = (f"1x3x{h2}x{w2}",), f"torchvision:{name} default ({why}{given})"
            return
        source.inputs = (f"1x3x{h}x{w}",)
        meta = getattr(weights, "meta", None) or {}
        if (h, w) != (224, 224) and tuple(meta.get("min_size", ())) == (h, w):
            # weights for one size only (ViT-H/14's default, 518): the builder takes its image size from them,
            # and without them builds the 224 model; the weights' size is tried first (one probe forward)
            source.alternatives = (("1x3x224x224",),)
            why += "; a model for that size only: without its weights the builder makes the 224 one, tried next"
    source.input_source = f"torchvision:{name} default ({why})"


def _one_image():
    import torch

    return ([torch.rand(3, 320, 320)],)


_one_image.samples = 1   # type: ignore[attr-defined]  # a list of images: ModelInputs.batch_size reads this
_one_image.chosen = True   # type: ignore[attr-defined]  # torchdiag's own default, not the user's (ModelInputs.chosen)


def _two_images():
    """Two images even with BatchNorm: no mean pool and made-up class targets follow it here.
    A detection model in train mode takes (images, targets) and returns its own loss dict (summed by
    the auto loss): two images, each with seven boxes (xyxy inside the image), labels, instance masks
    (Mask R-CNN reads them) and 17 keypoints per box (Keypoint R-CNN's default). Every label is 1: the one
    class every detection model has (Keypoint R-CNN's default knows only background and person)."""
    import torch

    images = [torch.rand(3, 320, 320) for _ in range(TRAIN_BATCH)]
    # boxes from 30 to 320 pixels: every feature level of an SSD/FPN head has an anchor that matches one
    boxes = torch.tensor([[10.0, 10.0, 40.0, 40.0], [50.0, 50.0, 130.0, 130.0], [140.0, 20.0, 300.0, 180.0],
                          [0.0, 0.0, 319.0, 319.0], [200.0, 200.0, 260.0, 300.0], [40.0, 70.0, 270.0, 300.0],
                          [100.0, 0.0, 300.0, 200.0]])
    targets = []
    for _ in range(TRAIN_BATCH):
        masks = torch.zeros(len(boxes), 320, 320, dtype=torch.uint8)
        for k, (x0, y0, x1, y1) in enumerate(boxes.int().tolist()):
            masks[k, y0:y1, x0:x1] = 1
        lo, hi = boxes[:, None, :2], boxes[:, None, 2:]
        xy = lo + torch.rand(len(boxes), 17, 2) * (hi - lo)
        keypoints = torch.cat([xy, torch.ones(len(boxes), 17, 1)], -1)
        targets.append({"boxes": boxes.clone(), "labels": torch.ones(len(boxes), dtype=torch.int64), "masks": masks,
                        "keypoints": keypoints})
    return images, targets


_two_images.samples = TRAIN_BATCH   # type: ignore[attr-defined]
_two_images.chosen = True   # type: ignore[attr-defined]


# ---- timm --------------------------------------------------------------------------------------------

def timm_source(name: str, kwargs: dict[str, Any]) -> Source:
    timm = require("timm", extra="zoo")
    known = timm.list_models()
    if name not in known:
        raise unknown_name("timm", name, known)
    kwargs = dict(kwargs)
    if kwargs.pop("pretrained", False):
        raise UsageError(f"timm:{name} is built with random weights; --arg pretrained=True would download them",
                         hint=f"{NO_NETWORK}: pass the weights as --checkpoint FILE")

    def build(**kw):
        return timm.create_model(name, pretrained=False, **kw)

    source = Source(build, kwargs, f"timm {name}", header={"source": f"timm:{name}", "random": " (random weights)"})
    try:
        cfg = timm.models.get_pretrained_cfg(name) if hasattr(timm.models, "get_pretrained_cfg") else None
        size = tuple((cfg.input_size if cfg is not None else None) or (3, 224, 224))
        source.normalisation = _normalisation(getattr(cfg, "mean", None), getattr(cfg, "std", None),
                                              "its pretrained_cfg")
    except Exception:
        size = (3, 224, 224)
    read = "x".join(str(d) for d in size)
    channels = size[0]
    size, given = _given_size(size, kwargs, "in_chans", "img_size")
    if size[0] != channels:   # the weights' per-channel mean/std fit their own channels only
        source.normalisation = None
    source.inputs = ("1x" + "x".join(str(d) for d in size),)
    source.input_source = f"timm:{name} default (its pretrained_cfg input_size {read}{given})"
    return source


def _given_size(size: tuple, kwargs: dict, channels: str | None, image: str) -> tuple[tuple, str]:
    """The default input's (C, H, W) with the channels and image size the user's --arg builds the model for (timm
    keeps its pretrained_cfg's 3x224x224 under `img_size=384` or `in_chans=1`: a sweep's healthy ViT at 384 exited
    3 on a 224 input), and what the header says of it."""
    c, h, w = size[0], size[-2], size[-1]
    said = []
    def positive(v) -> bool:   # (a bool is an int to Python)
        return isinstance(v, int) and not isinstance(v, bool) and v > 0

    if channels and positive(kwargs.get(channels)):
        c = kwargs[channels]
        said.append(f"{channels}={c}")
    got = kwargs.get(image)
    if positive(got):
        h = w = got
    elif isinstance(got, (list, tuple)) and len(got) == 2 and all(positive(v) for v in got):
        h, w = got
    if (h, w) != (size[-2], size[-1]):
        said.append(f"{image}={got}")
    return (c, h, w), (f"; {' and '.join(said)} from --arg" if said else "")


# ---- Hugging Face ------------------------------------------------------------------------------------

def hf_source(path: str, kwargs: dict[str, Any], download: str | None = None) -> Source:
    """A folder (or config.json) on disk first, as from_pretrained looks; else a Hub name in the cache."""
    origin = ""
    if os.path.exists(path) or hub.looks_like_path(path):
        folder, config_file = _hf_paths(path)
    else:
        snapshot = hub.resolve(path, download)
        folder, config_file = snapshot.folder, os.path.join(snapshot.folder, "config.json")
        origin = "; " + snapshot.describe()
    try:
        text = read_text(config_file, "hf: config")
        json_depth(text)   # before json.loads recurses
        config_dict = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, UsageError) as exc:
        raise UsageError(f"cannot read {config_file}: {exc.message if isinstance(exc, UsageError) else one_line(exc)}", hint="config.json must be the JSON file save_pretrained writes") from exc
    config_dict = _special_floats(config_dict)   # before the check: {"__float__": "NaN"} alone is not a config
    if not isinstance(config_dict, dict):
        raise UsageError(f"{config_file} is not a JSON object", hint="config.json must be the JSON file save_pretrained writes")
    if config_dict.get("auto_map"):
        raise UsageError(f"{config_file} asks for custom model code (auto_map); torchdiag never runs code from a model folder",
                         hint="write a factory in a .py file you trust that builds the model, and point torchdiag at file.py:factory")
    require("transformers", extra="hf")
    kwargs = dict(kwargs)
    task = kwargs.pop("task", None)
    config = _hf_config(config_dict, config_file, kwargs)
    cls, how = _hf_class(config, task)

    def build(**overrides):
        return _from_config(cls, _hf_config(config_dict, config_file, overrides))

    source = Source(build, kwargs, f"hf {path}",
                    header={"source": f"hf:{path} ({how}){origin}{_unknown_keys(config_dict, kwargs, config)}"})
    source.weights = _hf_weights(folder)
    if task is not None and source.weights:   # another head on the saved weights: what from_pretrained starts anew
        source.saved_keys = _saved_keys(config, cls, source.weights)   # and drops (checkpoint.other_head)
    source.header["unread"] = _unread_weights(folder, source.weights)   # said by core.context (--checkpoint or not)
    if not source.weights:
        where = "the snapshot" if origin else folder   # a snapshot's path is long, and said before
        none = "no model weights (*.safetensors)" if source.header["unread"] else "no *.safetensors"
        # said by core.context, which knows whether --checkpoint gives the weights instead (then not "random")
        source.header["random"] = f"; {none} in {where}: random weights" + _pickled_weights(folder)
    _hf_inputs(config, path, source, cls)
    return source


def _hf_paths(path: str) -> tuple[str, str]:
    hint = (f"{NO_NETWORK}: give a local folder with config.json (save_pretrained writes one; "
            "`hf download NAME --local-dir DIR` fetches one), or a Hub name in the Hugging Face cache (hf:org/name)")
    if os.path.isfile(path):
        return os.path.dirname(os.path.abspath(path)), path
    if not os.path.isdir(path):
        raise UsageError(f"hf:{path}: no such folder or file", hint=hint)
    config_file = os.path.join(path, "config.json")
    if not os.path.lexists(config_file):
        raise UsageError(f"hf:{path}: the folder has no config.json", hint=hint)
    # there, but a FIFO, a folder or a dangling link: said as what it is (a sweep: a FIFO was "no config.json")
    regular_file(config_file, f"hf:{path}:", hint="config.json is a file save_pretrained writes")
    return path, config_file


def _timm_folder(arch: str, config_file: str) -> UsageError:
    """A timm model's Hub folder (timm's save_for_hf: `architecture`, no `model_type`) given as hf: (a sweep: told
    to add a transformers model_type): the timm: spec that builds it, with its weights file."""
    import shlex

    folder = os.path.dirname(config_file)
    weights = next((os.path.join(folder, n) for n in ("model.safetensors", "pytorch_model.bin")
                    if os.path.isfile(os.path.join(folder, n))), None)
    ckpt = f" --checkpoint {shlex.quote(weights)}" if weights else ""   # (a folder with a space: a review)
    return UsageError(f"{config_file} is a timm model's (architecture {arch}), not a transformers one",
                      hint=f"build it with timm: give timm:{arch}{ckpt} in its place")


FLOAT_TAGS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def _special_floats(obj):
    """The floats JSON cannot hold, as save_pretrained writes them ({"__float__": "Infinity"}: Mamba-2's
    time_step_limit) and from_pretrained reads them back; the config is read here, not by from_pretrained."""
    if isinstance(obj, dict):
        tag = obj.get("__float__") if len(obj) == 1 else None
        if isinstance(tag, str) and tag in FLOAT_TAGS:
            return FLOAT_TAGS[tag]
        return {k: _special_floats(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_special_floats(v) for v in obj]
    return obj


def _hf_config(config_dict: dict, config_file: str, overrides: dict):
    """The config from the JSON (no Hub lookup), with --arg overrides (e.g. num_hidden_layers=2)."""
    from transformers import AutoConfig

    model_type = config_dict.get("model_type")
    if not model_type and isinstance(config_dict.get("architecture"), str):
        raise _timm_folder(config_dict["architecture"], config_file)
    if not model_type:
        raise UsageError(f"{config_file} has no model_type", hint="config.json written by save_pretrained names it, e.g. \"model_type\": \"gpt2\"")
    values = {k: v for k, v in config_dict.items() if k != "model_type"}
    values.update(overrides)
    try:
        return AutoConfig.for_model(model_type, **values)
    except Exception as exc:
        import transformers

        if _known_type(model_type):   # a value of the wrong type or range (strict config dataclasses)
            why = exc.__cause__ or exc
            raise UsageError(f"{config_file}{' with --arg ' + ', '.join(overrides) if overrides else ''}: transformers "
                             f"refused the config: {one_line(why)}",
                             hint="fix the value in config.json (or the --arg): e.g. \"n_layer\": 2, not \"two\"") from exc
        raise UsageError(f"transformers {transformers.__version__} does not know model_type '{model_type}' ({config_file})",
                         hint="a newer transformers may: pip install -U transformers") from exc


def _unknown_keys(config_dict: dict, given: dict, config) -> str:
    """The --arg keys that are no field of the config class (nor in config.json) and that transformers kept as given:
    said, not refused (model code may ask for a key of its own with getattr), with the nearest field (a sweep:
    `--arg num_hiden_layers=1` ran the 2-layer model, exit 0)."""
    import difflib

    from transformers import CONFIG_MAPPING

    try:
        default = CONFIG_MAPPING[config_dict.get("model_type")]()
    except Exception:   # noqa: BLE001 - a config class that cannot be built bare: nothing to compare with
        return ""
    odd = [k for k in given if k not in config_dict and not hasattr(default, k) and k in vars(config)]
    said = []
    for k in odd:
        near = difflib.get_close_matches(k, [f for f in vars(default) if not f.startswith("_")], n=1)
        said.append(f"{k}" + (f" (did you mean {near[0]}?)" if near else ""))
    out = (f"; --arg {', '.join(said)}: no field of {type(default).__name__}, kept on the config as given and read "
           "only by code that asks for it") if said else ""
    inert = _inert_keys(config_dict, {k: v for k, v in given.items() if k not in odd})
    return out + (f"; --arg {', '.join(inert)} changed nothing in the config: it holds that value already, or "
                  "transformers keeps one config.json gives elsewhere (a nested setting such as rope_parameters: set "
                  "it there)" if inert else "")


def _inert_keys(config_dict: dict, given: dict) -> list[str]:
    """The --arg keys whose config, built with each alone, is the config.json's own (transformers read the key and
    kept another value: llama's rope_theta where the file has rope_parameters)."""
    try:   # vars: to_dict leaves out private fields that take effect (attn_implementation's)
        plain = vars(_hf_config(config_dict, "config.json", {}))
    except UsageError:   # the real build says what is wrong
        return []
    out = []
    for k, v in given.items():
        try:
            if vars(_hf_config(config_dict, "config.json", {k: v})) == plain:
                out.append(k)
        except UsageError:   # as above
            continue
    return out


def _known_type(model_type) -> bool:
    from transformers import CONFIG_MAPPING

    return isinstance(model_type, str) and model_type in CONFIG_MAPPING


def _saved_keys(config, cls, weights: list[str]) -> frozenset[str] | None:
    """The state-dict keys of the class the folder's weights are of (the one built without --arg task:
    architectures[0]; a config that names none: the head class of its type whose keys hold every key of the file, the
    fewest besides, else the default head), built on meta; None where that is `cls` or cannot be built."""
    try:
        saved, _ = _hf_class(config, None)
        default = None if saved is cls else _keys_on_meta(saved, config)
        if getattr(config, "architectures", None):
            return default
        return _keys_holding(config, _file_keys(weights)) or default   # (a review: an MLM file read as a base's)
    except Exception:   # noqa: BLE001 - unknown: every key stays strict
        return None


def _from_config(model_cls, config):
    """An Auto class builds with from_config, a model class with _from_config."""
    return model_cls.from_config(config) if hasattr(model_cls, "from_config") else model_cls._from_config(config)


def _keys_on_meta(model_cls, config) -> frozenset[str]:
    import torch

    with torch.device("meta"):
        return frozenset(_from_config(model_cls, config).state_dict())


def _file_keys(weights: list[str]) -> set[str]:
    """The tensor names the weight files hold, read as on meta (safetensors headers, a shards' index: no data)."""
    import torch

    from .checkpoint import read_state

    return {k for path in weights for k in read_state(path, torch.device("meta"))[0]}


def _keys_holding(config, file_keys: set[str]) -> frozenset[str] | None:
    """Of the head classes transformers has for this config's type, the keys of the one that holds every key of the
    file with the fewest besides (its tied copies the file left out); None when none holds them all."""
    import transformers

    best = None
    for auto in dict.fromkeys(HF_TASKS.values()):
        model_cls = getattr(transformers, auto)._model_mapping.get(type(config), None)
        if model_cls is None:
            continue
        keys = _keys_on_meta(model_cls, config)
        if file_keys <= keys and (best is None or len(keys - file_keys) < len(best - file_keys)):
            best = keys
    return best


def _hf_class(config, task: str | None):
    """(class, how it was chosen): --arg task=... picks an Auto class; else the config's architectures[0]."""
    import transformers

    if task is not None:
        if task not in HF_TASKS:
            raise UsageError(f"--arg task={task} is not one of {', '.join(HF_TASKS)}",
                             hint="task picks the head: causal-lm for a decoder LM, seq2seq for an encoder-decoder, base for the bare model")
        auto = getattr(transformers, HF_TASKS[task])
        if type(config) not in auto._model_mapping:   # e.g. image-classification on a GPT-2 config
            has = [t for t, name in HF_TASKS.items() if type(config) in getattr(transformers, name)._model_mapping]
            raise UsageError(f"--arg task={task}: transformers has no {HF_TASKS[task]} for model_type "
                             f"'{config.model_type}'", hint=f"pick a task this model has a head for: {', '.join(has)}"
                             if has else "pick a task this model has a head for")
        return auto, f"{HF_TASKS[task]} for task {task}"
    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, str(arch), None)
        if isinstance(cls, type):
            if not issubclass(cls, transformers.PreTrainedModel):   # "architectures": ["Trainer"]
                raise UsageError(f"config.json architectures names {arch}, which is not a transformers model class",
                                 hint="name the model class save_pretrained wrote (e.g. GPT2LMHeadModel), or pick a "
                                      "head with --arg task=...")
            return cls, f"{arch} from config.architectures"
    if _decoder_only(config):   # its own LM head by default: what a decoder-only model is trained with
        return transformers.AutoModelForCausalLM, (
            f"AutoModelForCausalLM: config.json names no architecture and model_type '{config.model_type}' is "
            "decoder-only in transformers' mappings (a causal-LM class, no masked-LM or seq2seq one); "
            "--arg task=... picks another head")
    if _seq2seq(config):   # likewise an encoder-decoder: its seq2seq LM head
        return transformers.AutoModelForSeq2SeqLM, (
            f"AutoModelForSeq2SeqLM: config.json names no architecture and model_type '{config.model_type}' is an "
            "encoder-decoder with a seq2seq-LM class in transformers' mappings; --arg task=... picks another head")
    return transformers.AutoModel, "AutoModel (config.json names no known architecture; --arg task=... picks a head)"


def _seq2seq(config) -> bool:
    from transformers.models.auto import modeling_auto as auto

    return bool(getattr(config, "is_encoder_decoder", False)) and \
        getattr(config, "model_type", None) in auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES


def _decoder_only(config) -> bool:
    """transformers' own auto mappings say so: a causal-LM class for the model_type, and neither a
    seq2seq nor a masked-LM one (an encoder with a causal-LM variant, like BERT, has a masked-LM one)."""
    from transformers.models.auto import modeling_auto as auto

    kind = getattr(config, "model_type", None)
    return (not getattr(config, "is_encoder_decoder", False) and kind in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            and kind not in auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES
            and kind not in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES)


def _hf_weights(folder: str) -> list[str]:
    """The files from_pretrained reads, in its order: model.safetensors, else the shards' index. Only a folder
    with neither has its *.safetensors read (a step's file beside the weights is not the model's)."""
    for name in ("model.safetensors", "model.safetensors.index.json"):
        if os.path.isfile(os.path.join(folder, name)):
            return [os.path.join(folder, name)]
    # a PEFT adapter is never the model's weights (a review: its lora_A keys were read as the model's, exit 2)
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".safetensors") and not _adapter(f))


def _adapter(name: str) -> bool:
    return name.startswith("adapter_model")


def _unread_weights(folder: str, weights: list[str]) -> list[str]:
    """The other *.safetensors files beside the weights read (names), said so that a step's file is not taken as
    loaded."""
    read = {os.path.basename(w) for w in weights}
    return sorted(f for f in os.listdir(folder) if (f.endswith(".safetensors") or f.endswith(".safetensors.index.json"))
                  and f not in read and not _a_shard(f))


def _a_shard(name: str) -> bool:
    return re.fullmatch(r"model-\d{5}-of-\d{5}\.safetensors", name) is not None


def _pickled_weights(folder: str) -> str:
    """Weights only as a pickle (pytorch_model.bin): never read unasked; said, with how to ask."""
    try:
        names = sorted(f for f in os.listdir(folder) if f.startswith("pytorch_model") and f.endswith(".bin"))
    except OSError:
        return ""
    if "pytorch_model.bin" in names:
        return (f" (pytorch_model.bin is a pickle, not read unless asked: --checkpoint "
                f"{os.path.join(folder, 'pytorch_model.bin')} loads it with torch.load(weights_only=True))")
    if names:
        return f" ({names[0]}, ... are pickled shards, not read: torchdiag loads sharded weights from *.safetensors only)"
    return ""


DEFAULT_IMAGE = 224


def _hf_inputs(config, path: str, source: Source, cls=None) -> None:
    """Pixels for a vision config (image_size), else token ids (their range comes from the embedding
    that reads them, i.e. the config's vocabulary; an encoder-decoder gets decoder ids as well). A
    causal LM also gets labels = its input ids, so it is trained with its own loss (output['loss'])."""
    from . import hf_inputs

    model_cls = _model_class(cls, config)
    if model_cls is not None and hf_inputs.needs_candidates(model_cls, config):
        tries = list(_pixels_with_tokens(model_cls, config)) + hf_inputs.candidates(model_cls, config)
        if tries:
            main, required = hf_inputs.forward_names(model_cls)
            if required and main not in hf_inputs.forward_params(model_cls):
                main = required[0]      # what it reads: a class attribute can name an input its forward lacks
            source.inputs, source.alternatives = tries[0], tuple(tries[1:])
            source.input_source = (f"hf:{path} default ({model_cls.__name__} reads {main}: inputs from its forward's "
                                   "signature and the config's sizes, the layout found by a probe forward)")
            return
    # a config class that does not check its types gives no size; a sub-config's counts only for a forward that
    # reads pixels (a vision-language model keeps its vision tower's size in vision_config, and reads ids first)
    reads_pixels = model_cls is not None and hf_inputs.forward_names(model_cls)[0] == "pixel_values"
    image = hf_inputs.image_of(config, nested=reads_pixels)
    # a vision-language model that reads ids first keeps its vocabulary in text_config (Fuyu, MiniCPM-V)
    vocab = getattr(config, "vocab_size", None) or (
        getattr(getattr(config, "text_config", None), "vocab_size", None) if next(iter(list(hf_inputs.forward_params(model_cls))[1:]), None) == "input_ids" else None)
    if image and not vocab or reads_pixels:
        # a forward that reads pixel_values gets an image even when no config names its size (DETR's convolutional
        # backbone takes any): 224 x 224, ImageNet's
        c, h, w = image or (3, DEFAULT_IMAGE, DEFAULT_IMAGE)
        source.inputs = (f"1x{c}x{h}x{w}",)
        source.input_source = f"hf:{path} default (" + (f"config image_size {h}x{w})" if image else
                                                       f"{model_cls.__name__} reads pixel_values; no image_size in "
                                                       f"its config: {h}x{w})")
        if image is None:   # a keypoint matcher reads a pair of images (batch, 2, C, H, W) of any size: tried
            # when one image does not run (a config that names its image size is not probed: no extra forward)
            source.alternatives += ((f"1x2x{c}x{h}x{w}",),)
        ids = _ids_beside_pixels(model_cls, config)
        if ids:   # a prompted segmenter or a grounding model refuses pixels alone: tried after them
            source.alternatives += ((source.inputs[0], ids),)
            source.input_source = source.input_source[:-1] + f"; with {ids.split(':')[0].replace('=', ' ')} when " \
                                                             "pixels alone do not run)"
        return
    # a dual tower keeps its text sizes in text_config
    text = config if _positions(config) else getattr(config, "text_config", None) or config
    limit = _positions(text)
    length = min([TEXT_LENGTH] + limit)
    source.inputs = (f"1x{length}:int64",)
    if limit and length == min(limit):
        source.alternatives = tuple((f"1x{n}:int64",) for n in _shorter(length, getattr(text, "pad_token_id", None)))
    pixels = _pixels_beside_ids(model_cls, config)
    if pixels:    # a dual tower (CLIP-style: text and image encoders compared) refuses ids alone: tried after them
        source.alternatives += tuple(specs + (pixels,) for specs in ((source.inputs[0],),) + source.alternatives)
        extra = f"; with {pixels.split(':')[0].replace('=', ' ')} from the config when ids alone do not run"
    else:
        extra = ""
    boxes = _boxes(model_cls, source.inputs[0])
    if boxes:     # a layout model that refuses ids without their boxes (Bros, UDOP): tried after the ids alone
        source.alternatives += boxes
        extra += "; with a box per token (bbox) when ids alone do not run"
    images = _image_with_tokens(model_cls, config, source.inputs[0])
    if images:    # a vision-language model: its image path first, ids alone when that does not run
        source.inputs, source.alternatives = images[0], images[1:] + (source.inputs,) + source.alternatives
        extra = (f"; first with an image ({' '.join(s.split(':')[0].replace('=', ' ') for s in images[0][1:-1])}) and "
                 "its placeholder tokens in the ids, as its processor writes them" + extra)
    streams = hf_inputs.codebook_layouts(model_cls, config, f"1x{length}:int64") if model_cls is not None else ()
    if streams:   # ids of parallel codebook streams (an audio codec's tokens): tried when the layouts above do not run
        source.alternatives += streams
        extra += "; with a codebook axis on the ids when plain ids do not run"
    crossed = hf_inputs.images_per_sample(model_cls, config, f"1x{length}:int64") if model_cls is not None else ()
    if crossed:   # images a sample beside a mask of which tokens see them (IDEFICS-style cross-attention)
        source.alternatives += crossed
        extra += "; with images a sample and their image_attention_mask when those do not run"
    source.input_source = f"hf:{path} default (token ids, length {length}" + (f", vocab {vocab}" if vocab else "") + extra + ")"
    if vocab and _lm_head(cls):
        source.labels_from_ids = True
        source.input_source += f"; {LABELS_FROM_IDS} (the model's own loss)"
    elif vocab:
        source.head_labels = _head_labels(cls, config)


def _head_labels(cls, config) -> tuple[str, int] | None:
    """("token", C) for a token-classification head, ("multi_label", C) or ("regression", C) for a sequence classifier
    whose config says multi_label_classification or regression: random labels of that kind are given and the model's own loss is trained (a sweep:
    a token classifier's (N, T, C) logits got mse against random reals, a multi-label one softmax cross-entropy,
    where transformers computes a cross-entropy per token and a binary one per label). None otherwise: a sequence
    classifier's (N, C) logits get the auto cross-entropy, which is its own single-label loss."""
    from transformers.models.auto import modeling_auto as auto

    name, classes = getattr(cls, "__name__", ""), getattr(config, "num_labels", None)
    if not isinstance(classes, int) or classes < 1:
        return None

    def mapped(mapping: str, auto_name: str) -> bool:
        names = getattr(auto, mapping, {}).values()
        return name == auto_name or any(name == n or (isinstance(n, (tuple, list)) and name in n) for n in names)

    if classes >= 2 and mapped("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "AutoModelForTokenClassification"):
        return ("token", classes)
    # one label and no problem_type is a regression to transformers (it infers it from num_labels; a sweep:
    # num_labels=1 got the auto mse on the logits, not its own loss as the docs say)
    said = getattr(config, "problem_type", None)
    kind = {"multi_label_classification": "multi_label", "regression": "regression"}.get(said or "") if said or \
        classes >= 2 else "regression"
    if kind != "regression" and classes < 2:
        return None
    if kind and mapped("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForSequenceClassification"):
        return (kind, classes)   # (a regression of C outputs: its mse, not the auto cross-entropy: a review)
    return None


def _positions(config) -> list[int]:
    """The position-table lengths a config names."""
    found = [getattr(config, k, None) for k in ("max_position_embeddings", "n_positions", "max_seq_len")]
    return [v for v in found if isinstance(v, int) and v > 0]


def _pixels_beside_ids(model_cls, config) -> str | None:
    """`pixel_values=...` for a forward that reads token ids first and takes pixels too, sized from the config
    or its vision sub-config (224 x 224 when none names a size); None for a forward without pixel_values."""
    from . import hf_inputs

    if "pixel_values" not in hf_inputs.forward_params(model_cls):
        return None
    c, h, w = hf_inputs.image_of(config, nested=True) or (3, DEFAULT_IMAGE, DEFAULT_IMAGE)
    frames = hf_inputs.frames_of(config, nested=True)      # a video tower (X-CLIP: num_frames in its vision config)
    return f"pixel_values=1x{frames}x{c}x{h}x{w}:float32" if frames else f"pixel_values=1x{c}x{h}x{w}:float32"


PROMPT_LENGTH = 16   # token ids given beside an image: a short prompt
TILES = 5            # views of one image given to a tiling forward: the base view and up to 2 x 2 tiles


def _image_with_tokens(model_cls, config, ids: str) -> tuple[tuple[str, ...], ...]:
    """Layouts (ids, pixels..., `image-tokens=token:ID`) for a forward that reads ids and pixels and a config that
    names an image placeholder id (core.image_tokens puts the measured count of them into the ids): packed
    patches beside an `image_grid_thw` (Qwen2-VL-style), else one image as (C, H, W), then with its `image_sizes`
    where the forward takes them (at most DEFAULT_IMAGE a side: Pixtral; LLaVA's forward takes them too, and fails
    on them) and as TILES views (LLaVA-NeXT), then as (images, C, H, W) a sample (Idefics-style). () otherwise."""
    from . import hf_inputs, image_tokens

    token = image_tokens.token_of(config)
    params = hf_inputs.forward_params(model_cls)
    if token is None or "pixel_values" not in params:
        return ()
    tail = f"{image_tokens.SPEC}=token:{token}"
    if "image_grid_thw" in params:
        patches = hf_inputs.packed_patches("pixel_values", "image_grid_thw", getattr(config, "vision_config", None) or config)
        return ((ids, *patches, tail),) if patches else ()
    c, h, w = hf_inputs.image_of(config, nested=True) or (3, DEFAULT_IMAGE, DEFAULT_IMAGE)
    image = f"pixel_values=1x{c}x{h}x{w}:float32"
    # a forward told each image's size takes any size up to the config's (Pixtral's 1540 is a maximum): a small one
    side = _small_side(min(h, w), config)
    sizes = f"image_sizes=1x2:int64~each={h},{w}"
    # tiles of one image (LLaVA-NeXT: the base view and its grid's tiles, as many as the image's size asks for of
    # the TILES given, the rest unread)
    sized = ((ids, f"pixel_values=1x{c}x{side}x{side}:float32", f"image_sizes=1x2:int64~each={side},{side}", tail),
             (ids, f"pixel_values=1x{TILES}x{c}x{h}x{w}:float32", sizes, tail)) if "image_sizes" in params else ()
    return ((ids, image, tail),) + sized + ((ids, f"pixel_values=1x1x{c}x{h}x{w}:float32", tail),)




def _boxes(model_cls, ids: str) -> tuple[tuple[str, ...], ...]:
    """Layouts with one box per token, the tokens laid out as lines of text (hf_inputs' `~boxes` fill), as integers
    (LayoutLM's 0..1000 grid) then as floats (Bros' normalised corners), for a forward that takes a `bbox`; ()
    otherwise."""
    from . import hf_inputs

    if "bbox" not in hf_inputs.forward_params(model_cls):
        return ()
    length = ids.split(":")[0].split("x")[-1]
    return tuple((ids, f"bbox=1x{length}x4:{dtype}~boxes") for dtype in ("int64", "float32"))


def _small_side(side: int, config) -> int:
    """DEFAULT_IMAGE or less, a whole number of the vision config's patches (merged ones where it merges them)."""
    from . import hf_inputs

    vision = getattr(config, "vision_config", None) or config
    patch = hf_inputs.patch_of(vision) * hf_inputs.merge_of(config)   # whole merged patches (Mistral3: 2 x 2)
    small = min(side, DEFAULT_IMAGE)
    return max(patch, small // patch * patch)


def _pixels_with_tokens(model_cls, config) -> tuple[tuple[str, ...], ...]:
    """A layout for a forward that reads pixels first and a language model's `input_ids` too, whose config names an
    image placeholder id (BLIP-2, InstructBLIP: one token per query the Q-Former hands over): the image, ids of a
    short prompt that core.image_tokens gives their placeholders, and any other ids the forward requires (a
    Q-Former's prompt). () otherwise."""
    from . import hf_inputs, image_tokens

    token = image_tokens.token_of(config)
    params = hf_inputs.forward_params(model_cls)
    main, required = hf_inputs.forward_names(model_cls)
    if token is None or main != "pixel_values" or "input_ids" not in params:
        return ()
    c, h, w = hf_inputs.image_of(config, nested=True) or (3, DEFAULT_IMAGE, DEFAULT_IMAGE)
    # a prompt of distinct ids from 2 (zeros would all be a padding id: a Q-Former's embedding got no gradient)
    others = [f"{n}=1x{PROMPT_LENGTH}:int64~arange=2" for n in required if n.endswith("_ids") and n != "input_ids"]
    rest = (f"input_ids=1x{PROMPT_LENGTH}:int64", *others, f"{image_tokens.SPEC}=token:{token}")
    # then as frames of a video (InstructBLIP-Video: its placeholders take each frame's queries)
    t = hf_inputs.frames_of(config) or hf_inputs.frames_of(config, nested=True) or hf_inputs.VIDEO_FRAMES
    return ((f"1x{c}x{h}x{w}:float32", *rest), (f"1x{t}x{c}x{h}x{w}:float32", *rest))


def _ids_beside_pixels(model_cls, config) -> str | None:
    """`input_ids=...` (a short prompt) for a forward that reads pixels first and takes token ids too (SAM3's text
    prompt, Kosmos-2's caption); None for a forward without input_ids."""
    from . import hf_inputs

    if "input_ids" not in hf_inputs.forward_params(model_cls):
        return None
    text = getattr(config, "text_config", None) or config
    length = min([PROMPT_LENGTH] + _positions(text))
    return f"input_ids=1x{length}:int64"


def _shorter(length: int, pad) -> list[int]:
    """Lengths to try when a text model's whole position table does not run (the probe picks the first that does):
    the table less the positions before padding_idx + 1 where a model numbers its positions from there (RoBERTa,
    CamemBERT, data2vec-text: only max_position_embeddings - pad - 1 fit), then half the table."""
    out = [length - pad - 1] if type(pad) is int and 0 <= pad < length - 1 else []
    return [n for n in dict.fromkeys(out + [length // 2]) if 0 < n < length]


def _model_class(cls, config):
    """The model class an Auto class builds for this config (its forward says what it reads)."""
    mapping = getattr(cls, "_model_mapping", None)
    if mapping is None:
        return cls
    try:
        return mapping[type(config)]
    except Exception:   # noqa: BLE001 - no class for this config: the token-id default stands
        return None


def _lm_head(cls) -> bool:
    """The class built is a causal-LM, seq2seq-LM or image-text-to-text head (the Auto class, or a class in
    its mapping): trained on labels with its own loss (a causal LM shifts them; a seq2seq LM feeds them shifted
    right to its decoder; a vision-language model is a causal LM over its text, placeholders left out)."""
    from transformers.models.auto import modeling_auto as auto

    name = getattr(cls, "__name__", "")
    vlm = getattr(auto, "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", {})
    return name in ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForImageTextToText") or \
        name in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() or \
        name in auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.values() or name in vlm.values()


def samples(command: str) -> int:
    from ..commands import BY_NAME

    return BY_NAME[command].samples if command in BY_NAME else 1


def trains(command: str) -> bool:
    from ..commands import BY_NAME

    return command in BY_NAME and BY_NAME[command].trains is not None


def batched(specs: tuple[str, ...], batch: int) -> tuple[str, ...]:
    """-i specs with their leading (batch) dimension set to `batch` (a source's defaults lead with 1)."""
    out = []
    for s in specs:
        name, eq, s = s.partition("=") if "=" in s else ("", "", s)
        dims, colon, dtype = s.partition(":")
        first, x, rest = dims.partition("x")
        out.append(name + eq + (f"{batch}{x}{rest}{colon}{dtype}" if first == "1" and (x or eq) else s))
    return tuple(out)


def for_samples(loaded, samples: int) -> None:
    """A source model's default inputs at `samples` for a command whose result one sample makes empty (embeddings'
    projector: a new user got one point at defaults). A user's own -i or example_inputs are never changed."""
    if loaded.default_inputs and samples > 1:
        wider = batched(tuple(loaded.default_inputs), samples)
        if getattr(loaded, "input_alternatives", ()):
            loaded.input_alternatives = tuple(batched(a, samples) for a in loaded.input_alternatives)
        if wider != tuple(loaded.default_inputs):
            loaded.default_inputs = wider
            loaded.input_source += f"; batch {samples}: the command compares samples, and one says nothing"


def for_training(loaded, command: str = "") -> None:
    """A source model's default inputs at TRAIN_BATCH, for a command that runs train mode (in place on
    the LoadedModel; said in its input_source). A user's own -i or example_inputs are never changed.
    `profile` runs inference unless asked to train: its reason says so (a sweep read "the command runs train
    mode" above "mode: inference")."""
    loaded.trains = True
    if loaded.default_inputs:
        norm = _batch_statistics(loaded.model)
        batch = BATCH_NORM_BATCH if norm else TRAIN_BATCH
        if getattr(loaded, "input_alternatives", ()):
            loaded.input_alternatives = tuple(batched(a, batch) for a in loaded.input_alternatives)
        wider = batched(tuple(loaded.default_inputs), batch)
        if wider != tuple(loaded.default_inputs):
            loaded.default_inputs = wider
            runs = "the command can run train mode (--mode train)" if command == "profile" else "the command runs train mode"
            # said as it applies: a sweep read "where BatchNorm needs" on GPT-2, which has none (and edgenext)
            why = ("where its BatchNorm needs more than one sample, and two, once mean-pooled, come out of it as exact negatives"
                   if norm else "where one sample is an edge case of its own (a squeezed batch dimension, batch statistics in functions)")
            loaded.input_source += f"; batch {batch} (1 for commands that do not train): {runs}, {why}"
    elif getattr(loaded.module, "example_inputs", None) is _one_image:
        loaded.module.example_inputs = _two_images
        loaded.input_source += (f"; {TRAIN_BATCH} images with targets (boxes, labels, masks, keypoints): the command "
                                "runs train mode, where a detection model takes targets and returns its losses")


def _batch_statistics(model) -> bool:
    from torch.nn.modules.batchnorm import _BatchNorm

    return any(isinstance(m, _BatchNorm) for m in model.modules())


def example_module(spec: str, source: Source) -> types.ModuleType:
    """A stand-in for the user's module (inputs and loss rules look there for example_inputs)."""
    module = types.ModuleType(spec)
    if source.example_inputs is not None:
        module.example_inputs = source.example_inputs
    return module


def check_room(source: Source, spec: str, device, seed: int | None, run=None) -> None:
    """Before the weights are built: the same builder on meta (no weights: a fraction of a second for a model of
    billions of parameters), its tensors against the memory available for `run` (core.resources.room_for_model).
    A builder that cannot build on meta is left to the real build, which says what is wrong."""
    import torch

    try:
        with torch.random.fork_rng(devices=[]), no_downloads(source.label):
            model, _ = _build(source, torch.device("meta"), seed)
    except Exception:   # noqa: BLE001 - the real build raises it again, with its own message
        return
    room_for_model(model, spec, device, run)


def build(source: Source, device, seed: int | None, spec: str = ""):
    """Call the source's builder as load_model calls a factory: seeded, on meta when asked, no downloads."""
    try:
        with no_downloads(source.label):
            model, built_on = _build(source, device, seed)
    except TypeError as exc:
        if not source.kwargs:   # no --arg given: the builder's own TypeError, not the user's values (a config's None)
            raise ModelError(f"building {source.label} raised {one_line(exc)}") from exc
        raise UsageError(f"{source.label} does not accept these --arg values: {one_line(exc)}",
                         hint="--arg values go to the model's constructor (hf: to its config)") from exc
    except UsageError:
        raise
    except Exception as exc:
        if host_out_of_memory(exc):
            raise ran_out_building(spec or source.label, exc) from exc
        given = f" (built with --arg {', '.join(f'{k}={v!r}' for k, v in source.kwargs.items())})" if source.kwargs else ""
        raise ModelError(f"building {source.label}{given} raised {one_line(exc)}") from exc
    return model, built_on


def _build(source: Source, device, seed: int | None):
    import torch

    from .meta import build_on_meta

    built_on = ""
    if seed is not None:
        torch.manual_seed(seed)
    if device is not None and device.type == "meta":
        return build_on_meta(source.build, source.kwargs)
    return source.build(**source.kwargs), built_on


@contextlib.contextmanager
def said_once(libraries=("transformers",)):
    """Around sizing a model on meta and building it: each line a library logs said once, not once per build (a
    config read twice: BERT's `If you want to use BertLMHeadModel as a standalone` came twice). A filter on the
    handlers of those libraries' loggers and of the root logger, for their records only (a review: the user's own
    lines were folded too); removed afterwards. A record whose message cannot be formatted passes, for logging to
    report as it does (a review: the filter's own error failed the build)."""
    import logging

    def once():   # one per handler: a record two handlers show is one line for each
        seen: set = set()

        def first(record) -> bool:
            if record.name.split(".")[0] not in libraries:
                return True
            try:
                key = (record.name, record.levelno, record.getMessage())
            except Exception:   # noqa: BLE001 - a malformed call: logging's own handler reports it
                return True
            if key in seen:
                return False
            seen.add(key)
            return True

        return first

    filters = {h: once() for name in (*libraries, None) for h in logging.getLogger(name).handlers}
    for h, f in filters.items():
        h.addFilter(f)
    try:
        yield
    finally:
        for h, f in filters.items():
            h.removeFilter(f)


@contextlib.contextmanager
def no_downloads(label: str):
    """While a model is built: torch.hub downloads raise, and the Hugging Face Hub is offline."""
    import torch.hub

    def refuse(url, *args, **kwargs):
        raise UsageError(f"building {label} tried to download {url}; {NO_NETWORK}",
                         hint="pass the weights as --checkpoint FILE; --arg values that ask for pretrained weights are refused")

    saved = {n: getattr(torch.hub, n) for n in ("load_state_dict_from_url", "download_url_to_file")}
    env = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update({k: "1" for k in env})
    for n in saved:
        setattr(torch.hub, n, refuse)
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.hub, n, f)
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
