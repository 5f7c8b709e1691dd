"""MODEL_SPEC (`path/to/file.py:factory` or `dotted.module:factory`) → an nn.Module."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ..errors import ModelError, UsageError, host_out_of_memory, one_line
from . import sources
from .distributed import refuse_sharded
from .resources import ran_out_building
from .spec_check import file_not_found, no_factory

SPEC_FORMS = "path/to/file.py:factory, dotted.module:factory, torchvision:NAME, timm:NAME, hf:PATH or hf:ORG/NAME"


@dataclass
class LoadedModel:
    model: Any               # nn.Module
    spec: str
    module: ModuleType       # the user's module (example_inputs, batch functions live here)
    factory: str             # its name, as written in the spec
    kwargs: dict[str, Any]
    built_on: str = ""       # how a meta model was built, for the header
    factory_fn: Any = None   # the callable itself (doctor rebuilds the model on meta with it)
    default_inputs: tuple[str, ...] = ()   # -i specs a source form (torchvision:, timm:, hf:) takes by default
    input_source: str = ""                 # how those were chosen, for the header
    weights: tuple[str, ...] = ()          # checkpoint files found with the spec (hf: *.safetensors)
    header: dict[str, Any] = field(default_factory=dict)
    labels_from_ids: bool = False          # hf: causal LM: the default inputs pass labels = the input ids
    input_alternatives: tuple[tuple[str, ...], ...] = ()   # hf: other default inputs, tried when these do not run
    trains: bool = False                   # the default inputs are for a command that trains (sources.for_training)
    saved_keys: frozenset[str] | None = None   # hf --arg task: the keys of the head its weights were saved with
    head_labels: tuple[str, int] | None = None   # hf: a classification head's (kind, classes): random labels given
    normalisation: tuple | None = None     # (mean, std, where from): the weights' input normalisation (gradcam)


def split_spec(spec: str) -> tuple[str, str]:
    """Split on the LAST colon (so `C:/x/model.py:build` style paths keep theirs)."""
    if ":" not in spec:
        raise UsageError(f"MODEL_SPEC '{spec}' has no ':factory' part", hint=f"write it as {SPEC_FORMS}")
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise UsageError(f"MODEL_SPEC '{spec}' is incomplete", hint=f"write it as {SPEC_FORMS}")
    return where, name


def parse_args(pairs: list[str] | None, option: str = "--arg") -> dict[str, Any]:
    """`--arg key=value`: the value as a Python literal when it parses, `true`/`false` (any case: a shell's, TOML's
    spelling) as a bool, else the string (a sweep: batch_first=false reached the factory as "false", truthy).
    `option`: the flag the pairs came with, for the error."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise UsageError(f"malformed {option} '{pair}'", hint=f"write {option} key=value, e.g. {option} depth=50")
        try:
            out[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):  # deep nesting: a string too
            out[key] = {"true": True, "false": False}.get(raw.strip().lower(), raw)
    return out


def _is_path(where: str) -> bool:
    return where.endswith(".py") or os.sep in where or "/" in where


def import_module(where: str, what: str = "model file") -> ModuleType:
    """Import a file path or a dotted module; the user's import errors exit 3, missing ones 2 (`what` the
    file is, for that message: model file, loss file, batch file)."""
    if os.path.isdir(where) and not os.path.isfile(os.path.join(where, "__init__.py")) or (
            _is_path(where) and os.path.isdir(where)):
        raise UsageError(f"'{where}' is a folder, not a Python file",
                         hint="name the file that defines the factory, e.g. models/net.py:build")
    if os.path.isfile(where) and not where.endswith(".py"):
        raise UsageError(f"'{where}' is not a Python file",
                         hint="MODEL_SPEC names a .py file (or a dotted module) and the factory in it, e.g. models/net.py:build")
    if _is_path(where):
        path = os.path.abspath(where)
        if not os.path.isfile(path):
            if os.path.exists(path):   # a device or FIFO (/dev/null): said as what it is (a sweep: "not found")
                from .limits import regular_file

                regular_file(where, f"{what}", hint="name the .py file that defines the factory")
            raise file_not_found(where, what)
        name = "_torchdiag_user_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
        folder = os.path.dirname(path)
        if folder not in sys.path:  # sibling imports inside the user's file keep working
            sys.path.insert(0, folder)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise ModelError(f"importing {where} raised {one_line(exc)}",
                             hint="run `python " + where + "` to see the full error") from exc
        return module
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as exc:
        if exc.name and (where == exc.name or where.startswith(exc.name + ".")):
            raise UsageError(f"module '{where}' not found", hint="check the name, or give a file path like models/net.py:build") from exc
        raise ModelError(f"importing {where} raised {one_line(exc)}") from exc
    except Exception as exc:
        raise ModelError(f"importing {where} raised {one_line(exc)}") from exc


def find_factory(module: ModuleType, name: str, where: str):
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise no_factory(where, name, [n for n in dir(module) if not n.startswith("_")
                                           and callable(getattr(module, n, None))])
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"'{where}:{name}' is a {type(obj).__name__}, not a function or class",
                         hint="point the spec at a function or class that returns an nn.Module")
    return obj


def load_model(spec: str, arg_pairs: list[str] | None = None, device=None, seed: int | None = 0,
               download: str | None = None, run=None) -> LoadedModel:
    """Import, call the factory (on meta when device is meta), check it made an nn.Module. `download`
    ("config", --download) lets an hf:NAME missing from the Hugging Face cache fetch its config.json. `run` (the
    core.run.RunSpec) says what the command needs beside the weights: a source form (torchvision:, timm:, hf:) is
    first built on meta and refused when that does not fit (core.resources.room_for_model).

    The factory runs with the global RNG seeded, so the same seed gives the same random weights:
    runs are reproducible, and a CI gate does not flake."""
    import torch
    from torch import nn

    from .meta import build_on_meta, refuse_meta_tensors

    kwargs = parse_args(arg_pairs)
    if sources.is_source(spec):
        return _load_source(spec, kwargs, device, seed, download, run)
    where, name = split_spec(spec)
    module = import_module(where)
    factory = find_factory(module, name, where)
    built_on = ""
    try:
        # As a script would: `torch.manual_seed(seed); model = build()`. The RNG stays where the
        # factory left it (diagnostics restore it to that point), so the same seed gives the same weights.
        if seed is not None:
            torch.manual_seed(seed)
        if device is not None and device.type == "meta":
            model, built_on = build_on_meta(factory, kwargs)
        else:
            model = factory(**kwargs)
    except TypeError as exc:
        if _is_call_mismatch(factory, kwargs):
            raise UsageError(f"{name}() does not accept these --arg values: {one_line(exc)}",
                             hint=f"its signature is {name}{_signature(factory)}") from exc
        raise ModelError(f"{name}() raised {one_line(exc)}") from exc
    except Exception as exc:
        if host_out_of_memory(exc):
            raise ran_out_building(spec, exc) from exc
        raise ModelError(f"{name}() raised {one_line(exc)}", hint="the factory itself failed; run it in Python to see the traceback") from exc
    if not isinstance(model, nn.Module):
        raise UsageError(f"{name}() returned {type(model).__name__}, not a torch.nn.Module",
                         hint="the factory must return the model (an nn.Module instance)")
    refuse_scripted(model, f"{name}()")
    refuse_sharded(model, f"the model {name}() returned")
    if device is not None and device.type != "meta":
        refuse_meta_tensors(model, f"the model {name}() returned")
        model = model.to(device)
    return LoadedModel(model, spec, module, name, kwargs, built_on, factory)


def _load_source(spec: str, kwargs: dict[str, Any], device, seed: int | None, download: str | None = None,
                 run=None) -> LoadedModel:
    """`torchvision:NAME`, `timm:NAME`, `hf:PATH`, `hf:NAME` (core.sources)."""
    from .meta import refuse_meta_tensors

    source = sources.resolve(spec, kwargs, download)
    with sources.said_once():   # the meta build reads the config too
        if device is not None and device.type != "meta":
            sources.check_room(source, spec, device, seed, run)
        model, built_on = sources.build(source, device, seed, spec)
    if device is not None and device.type != "meta":
        refuse_meta_tensors(model, f"the model {source.label} built")
        model = model.to(device)
    return LoadedModel(model, spec, sources.example_module(spec, source), source.label, source.kwargs, built_on,
                       source.build, source.inputs, source.input_source, tuple(source.weights), dict(source.header),
                       source.labels_from_ids, source.alternatives, saved_keys=source.saved_keys,
                       head_labels=source.head_labels, normalisation=source.normalisation)


def compiled_root(model):
    """The module a torch.compile'd model wraps, or None when it is not one (no torch._dynamo loaded: nothing was
    compiled)."""
    import sys

    dynamo = sys.modules.get("torch._dynamo.eval_frame")
    wrapper = getattr(dynamo, "OptimizedModule", None)
    return model._orig_mod if wrapper is not None and isinstance(model, wrapper) else None


# the commands that run a torch.compile'd model compiled (commands.py `compiled`; core cannot import the registry,
# tests/test_default_batch.py keeps the two one list)
COMPILED_COMMANDS = ("profile",)


def eager(model, command: str, header: dict):
    """A torch.compile'd model, for a command that hooks its modules, is the module it wraps, run eagerly, and the
    header says so (summary exited 3 "has no forward() of its own": dynamo refused its hooks; profile timed a graph
    its labels broke into pieces, 16x slower). profile keeps it compiled."""
    inner = compiled_root(model)
    if inner is None or command in COMPILED_COMMANDS:
        return model
    inside = any(compiled_root(m) is not None for m in inner.modules())   # compiled parts of its own (a review)
    header["compiled"] = ("torch.compile: diagnosed as the module it wraps, run eagerly"
                          + ("; the compiled modules inside it stay compiled" if inside else ""))
    return inner


# the commands whose steps, norms and comparisons read gradients that must be dense (gradflow's re-check trains with
# Adam); memory and profile measure the model as it trains, sparse gradients its own (a review: memory reported the
# dense gradients of a 1M-row table it never makes)
DENSE_GRAD_COMMANDS = ("doctor", "overfit-batch", "nancheck", "lr-find", "gradflow", "check")


def dense_embeddings(model, header: dict) -> list:
    """Embeddings with sparse=True make sparse gradients, which Adam, norms and comparisons refuse (a sweep: a
    recommender's EmbeddingBag(sparse=True) exited 4 in doctor, overfit-batch and nancheck): for the run they make
    dense ones, said in the header. Returns the modules switched, for the caller to switch back."""
    from torch import nn

    switched = [m for m in model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse]
    for m in switched:
        m.sparse = False
    if switched:
        header["sparse_gradients"] = (f"{len(switched)} embedding(s) with sparse=True made dense gradients for this run "
                                      "(torchdiag's steps, norms and checks read dense ones)")
    return switched


def own_step_note(model, header: dict) -> None:
    """A model that brings its own training step (a LightningModule's training_step and configure_optimizers): the
    header says they are not run, so a verdict is not read as one on them (a sweep: a training_step that detached
    its logits passed gradflow, doctor and overfit-batch unsaid)."""
    # both methods on its class: Lightning's contract (a review: an attribute named training_step, a schedule's
    # lambda on a plain module, got the note)
    if all(callable(getattr(type(model), m, None)) for m in ("training_step", "configure_optimizers")):
        header["training_step"] = ("not run: torchdiag trains forward()'s output with --loss and an optimizer of its "
                                   "own, not the model's training_step or configure_optimizers")


def refuse_scripted(model, what: str) -> None:
    """TorchScript modules take no hooks, and every diagnostic hooks modules: a usage error, not a crash."""
    import torch

    if isinstance(model, torch.jit.ScriptModule) or any(isinstance(m, torch.jit.ScriptModule) for m in model.modules()):
        raise UsageError(f"{what} returned a TorchScript module (torch.jit.script or trace); torchdiag needs the eager "
                         "nn.Module, because it hooks every module",
                         hint="return the model before torch.jit.script/trace from the factory")


def _signature(fn) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(…)"


def _is_call_mismatch(fn, kwargs) -> bool:
    try:
        inspect.signature(fn).bind(**kwargs)
        return False
    except TypeError:
        return True
    except ValueError:
        return False
