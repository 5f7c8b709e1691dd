"""`--checkpoint FILE`: weights into the model torchdiag built, without ever running code from the file.

- `.safetensors` through the safetensors library; a `*.safetensors.index.json` (sharded) through its shards;
- `.pt/.pth/.bin/.ckpt` through `torch.load(weights_only=True)` only. Globals beyond its allow-list outside
  the tensors (a Lightning .ckpt's hyper_parameters: argparse.Namespace, AttributeDict, the user's classes;
  callbacks, loops) are read as inert stand-ins of ours, so nothing from the file's world is imported or
  called; a file whose tensors need them, or that names code-running globals (os.system, exec, Popen),
  is refused with one line that says why and how to convert it, and never executed;
- a Lightning `.ckpt` (or any dict with a `state_dict`/`model_state_dict`/`model`/`module` entry, or one entry
  that holds the tensors): that entry, with prefixes the model does not have (`model.`, `module.`, `_orig_mod.`,
  stacked as DDP around a compiled model saves them) stripped;
- on `--device meta` a safetensors file is read up to its header only (shapes and dtypes), a torch.save
  file up to its pickle and zip directory (mmap, map_location meta): the data of a 70B model is never read.

Keys that do not fit (missing, unexpected, other shape): `strict` stops the run (exit 2, one line);
not strict loads what fits and reports each of the rest as a finding (exit 1)."""
from __future__ import annotations

import json
import os
import struct
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..errors import ModelError, UsageError, one_line
from .lazy import is_uninitialised
from .limits import json_depth, read_text, regular_file, safetensors_entries

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
NESTED_KEYS = ("state_dict", "model_state_dict", "model", "module")   # Lightning, training loops, DeepSpeed
STRIP_PREFIXES = ("model.", "module.", "_orig_mod.", "net.")
SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "U16": "uint16", "U32": "uint32", "U64": "uint64", "C64": "complex64", "F8_E8M0": "float8_e8m0fnu",
}
MAX_HEADER = 100 * 2**20       # safetensors' own limit on the JSON header
SHOW_KEYS = 6                   # keys named in the one-line strict error
# Globals that exist to run code or reach the system. Stand-ins would never call them; a pickle that names
# one is hostile, not a checkpoint, and is refused saying so (torch itself blocks os, posix, nt and sys).
HOSTILE_MODULES = {"os", "posix", "nt", "sys", "subprocess", "_posixsubprocess", "shutil", "socket", "pty", "signal",
                   "importlib", "runpy", "ctypes", "pickle", "_pickle", "marshal", "code", "codeop", "io", "_io",
                   "webbrowser", "multiprocessing", "pydoc", "timeit", "tempfile", "urllib", "ftplib", "smtplib",
                   "asyncio", "_thread", "pdb", "bdb", "cProfile", "ensurepip", "pip", "setuptools", "distutils"}
# (stdlib names a project's own module may also have, `profile`, `trace`, `site`, `platform`, are left out: a
# checkpoint whose hyperparameters name `profile.Config` is no hostile file; stand-ins never call what it names)
HOSTILE_BUILTINS = {"exec", "eval", "compile", "__import__", "open", "getattr", "setattr", "delattr", "globals",
                    "locals", "vars", "breakpoint", "input", "exit", "quit", "help", "__build_class__"}


@dataclass
class Report:
    """What loading a checkpoint did; findings for the keys that did not fit (not strict)."""

    path: str
    loaded: int = 0
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, tuple, tuple]] = field(default_factory=list)   # key, checkpoint shape, model shape
    stripped: str = ""
    added: str = ""            # a prefix the file's keys lack: a base model's weights into a model with a head
    header_only: bool = False
    tied: list[tuple[str, str]] = field(default_factory=list)   # (kept, dropped): one tensor in the model, two in the file
    cast: dict[str, int] = field(default_factory=dict)          # "bfloat16 → float32": tensors the copy cast
    converted: bool = False    # read by transformers' loader into its in-memory layout (transformers_layout)
    entry: str = ""            # the trainer dict's entry read, where another held weights too (an EMA copy)
    not_saved: list[str] = field(default_factory=list)   # the file's values of buffers the model does not save
    new_head: list[str] = field(default_factory=list)   # hf --arg task: keys only the new head has (initialised)
    old_head: list[str] = field(default_factory=list)   # ... and the file's keys only the saved head had (dropped)

    @property
    def fits(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def describe(self) -> str:
        parts = [f"{self.path}: {self.loaded} tensor{'' if self.loaded == 1 else 's'} loaded"]
        if self.entry:
            parts.append(self.entry)
        if self.not_saved:
            parts.append(f"{len(self.not_saved)} value(s) of buffers the model makes itself and does not save left "
                         f"out ({', '.join(self.not_saved[:3])}{' …' if len(self.not_saved) > 3 else ''})")
        if self.stripped:
            parts.append(f"prefix '{self.stripped}' stripped")
        if self.added:
            parts.append(f"prefix '{self.added}' added (the file holds the model's {self.added.rstrip('.')})")
        if self.header_only:
            parts.append("header only (meta: shapes and dtypes, no data read)")
        if self.converted:
            parts.append("converted by transformers' own loader to the layout the model keeps in memory")
        parts += [f"{n} cast {how}" for how, n in self.cast.items()]
        if self.new_head or self.old_head:
            parts.append(f"another head (--arg task): {len(self.new_head)} tensor(s) newly initialised"
                         + (f", {len(self.old_head)} of the file's dropped" if self.old_head else ""))
        if not self.fits:   # a few names each: every key is a finding of its own (add_findings), and a wrong
            parts.append(self.mismatch_summary(limit=3))   # checkpoint's hundreds flooded the header (a review)
        return ", ".join(parts)

    def mismatch_summary(self, limit: int | None = None) -> str:
        def names(keys):
            shown = keys if limit is None else keys[:limit]
            more = len(keys) - len(shown)
            return ", ".join(shown) + (f" and {more} more" if more else "")

        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} missing ({names(self.missing)})")
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} unexpected ({names(self.unexpected)})")
        if self.mismatched:
            parts.append(f"{len(self.mismatched)} of another shape ("
                         + names([f"{k}: checkpoint {_shape(a)}, model {_shape(b)}" for k, a, b in self.mismatched]) + ")")
        return "; ".join(parts)

    def add_findings(self, result) -> None:
        """Each key that did not fit, as an error finding (the run went on with --no-strict); another head's, once."""
        if self.new_head or self.old_head:
            new, old = self.new_head, self.old_head
            dropped = f" and {len(old)} of the file's own dropped ({_some(old)})" if old else ""
            result.add("checkpoint-new-head", "info", "", f"--arg task put another head on the model {self.path} "
                       f"holds: {len(new)} tensor(s) only it has are newly initialised ({_some(new)}){dropped}, as "
                       "from_pretrained does", hint="the new head's weights are random: a fine-tuning run starts "
                       "from them", members=new + old if len(new + old) > 1 else None)
        for key in self.missing:
            result.add("checkpoint-missing-key", "error", key, f"{key} is not in {self.path}: it keeps its random initialisation",
                       hint="the checkpoint is for another model or another version of it")
        for key in self.unexpected:
            result.add("checkpoint-unexpected-key", "error", key, f"{self.path} holds {key}, which the model does not have",
                       hint="the checkpoint is for another model or another version of it")
        for key, theirs, ours in self.mismatched:
            result.add("checkpoint-shape-mismatch", "error", key,
                       f"{key} is {_shape(theirs)} in {self.path} but {_shape(ours)} in the model: not loaded",
                       hint="the model was built with other sizes (--arg) than the checkpoint's")
        for kept, dropped in self.tied:
            result.add("checkpoint-tied-differ", "warning", dropped, f"{kept} and {dropped} are one tensor in the model "
                       f"(tied) but differ in {self.path}: the model holds {kept}'s values, {dropped}'s were dropped",
                       hint="the checkpoint is of a model that does not tie them (tie_word_embeddings off): build the "
                            "model untied, or check which of the two it should hold")
        if not self.fits and getattr(result, "failed", None) is False:
            result.failed = True


def _some(keys: list[str]) -> str:
    return ", ".join(keys[:4]) + (" …" if len(keys) > 4 else "")


def _shape(shape) -> str:
    return "x".join(str(d) for d in shape) if len(shape) else "scalar"


# ---- reading -----------------------------------------------------------------------------------------

def read_state(path: str, device) -> tuple[dict[str, Any], bool]:
    """(state dict, header_only). On meta a safetensors file gives meta tensors from its header."""
    if not os.path.exists(path):
        if os.path.islink(path):   # a dangling link or a loop of links: said as such, not "not found" (a review)
            regular_file(path, "--checkpoint", hint="point the link at the checkpoint file")
        raise UsageError(f"checkpoint not found: {path}", hint="check the path given to --checkpoint")
    if os.path.isdir(path):
        raise UsageError(f"--checkpoint {path} is a folder",
                         hint="name the file: model.safetensors, model.safetensors.index.json, weights.pt, last.ckpt")
    regular_file(path, "--checkpoint", hint="name a checkpoint file on disk (a device, FIFO or socket is never read)")
    meta = device is not None and device.type == "meta"
    kind = _kind(path)
    if kind == "index":
        return _read_index(path, meta), meta
    if kind == "safetensors":
        return (_read_header(path) if meta else _read_safetensors(path)), meta
    if kind == "torch":
        obj, made = _torch_load(path, meta)
        return _unwrap(obj, path, made, meta), meta and _is_zip(path)
    raise UsageError(f"--checkpoint {path}: unknown kind of file",
                     hint="torchdiag reads .safetensors, .safetensors.index.json, .pt, .pth, .bin and Lightning .ckpt "
                          "(another name where its first bytes are a torch.save zip or pickle, or a safetensors header)")


def _kind(path: str) -> str | None:
    """"index", "safetensors" or "torch" by the name's ending in any case; else by the first bytes, as torch.load
    itself goes (timm's and pytorch/examples' model_best.pth.tar, a file named `weights`: a sweep, refused)."""
    low = path.lower()
    if low.endswith(".index.json"):
        return "index"
    if low.endswith(".safetensors"):
        return "safetensors"
    if low.endswith(TORCH_SUFFIXES):
        return "torch"
    return _sniffed(path)


def _sniffed(path: str) -> str | None:
    """"torch" (a zip, or a pickle of protocol 2+: 0x80), "safetensors" (its header's length, then '{'), or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return None
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":
        return "torch"
    if len(head) == 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= os.path.getsize(path):
        return "safetensors"
    return None


def header(path: str, data_read: bool = True) -> dict[str, Any]:
    """The JSON header of a safetensors file: 8 bytes of length, then that many bytes. Nothing else is read.
    Its entries must lie inside the file when the data will be read (on meta only their shapes count)."""
    regular_file(path, "checkpoint")
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ValueError("shorter than its 8-byte header length")
            (size,) = struct.unpack("<Q", raw)
            if size > MAX_HEADER:
                raise ValueError(f"header length {size} is not plausible")
            text = f.read(size)
        if len(text) < size:
            raise ValueError("the header is cut short")
        json_depth(text)   # before json.loads recurses
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("the header is not a JSON object")
        safetensors_entries(doc, os.path.getsize(path) - 8 - size if data_read else None)
        return doc
    except (OSError, ValueError, UnicodeDecodeError, UsageError) as exc:
        raise UsageError(f"{path} is not a safetensors file: {exc.message if isinstance(exc, UsageError) else one_line(exc)}",
                         hint="safetensors files are written by safetensors.torch.save_file or save_pretrained") from exc


def _read_header(path: str) -> dict[str, Any]:
    import torch

    state = {}
    for key, entry in header(path, data_read=False).items():
        if key == "__metadata__":
            continue
        kind = entry.get("dtype") if isinstance(entry, dict) else None
        if isinstance(kind, str) and kind.isupper() and not hasattr(torch, SAFETENSORS_DTYPES.get(kind, "?")):
            raise UsageError(f"{path}: tensor {key} is of safetensors dtype {kind}, which this torch "
                             f"({torch.__version__}) has no dtype for", hint="a newer torch may have it; the file itself may be fine")
        try:
            dtype = getattr(torch, SAFETENSORS_DTYPES[entry["dtype"]])
            state[key] = torch.empty(tuple(entry["shape"]), dtype=dtype, device="meta")
        except (KeyError, TypeError, AttributeError) as exc:
            raise UsageError(f"{path}: header entry {key} is not understood ({one_line(exc)})",
                             hint="the file may be damaged; check it with safetensors.safe_open") from exc
    return state


def _read_safetensors(path: str) -> dict[str, Any]:
    try:
        from safetensors.torch import load_file
    except ModuleNotFoundError as exc:
        raise UsageError("safetensors is not installed: pip install safetensors",
                         hint="it reads .safetensors checkpoints; .pt files work without it") from exc
    header(path)   # a file that is not safetensors at all: said so before the library's own words
    try:
        if not _utf8(path):   # the library takes UTF-8 paths only (a sweep: a Latin-1 folder name was "damaged")
            from safetensors.torch import load

            with open(path, "rb") as f:
                return load(f.read())
        return load_file(path, device="cpu")
    except Exception as exc:  # SafetensorError, OSError: a damaged or truncated file
        raise UsageError(f"cannot read {path}: {one_line(exc)}", hint="the file may be damaged or cut short") from exc


def _utf8(path: str) -> bool:
    try:
        path.encode("utf-8")
        return True
    except UnicodeEncodeError:   # bytes Python could not decode, kept as surrogates
        return False


def _read_index(path: str, meta: bool) -> dict[str, Any]:
    """A sharded checkpoint: `weight_map` names the shard of every key."""
    try:
        text = read_text(path, "--checkpoint")
        json_depth(text)
        weight_map = json.loads(text)["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"{path} is not a safetensors index: {one_line(exc)}",
                         hint="an index is a JSON object with a weight_map of key → shard file") from exc
    folder = os.path.dirname(path)
    state: dict[str, Any] = {}
    for shard in shards:
        if not isinstance(shard, str) or os.path.isabs(shard) or os.pardir in shard.replace("\\", "/").split("/"):
            raise UsageError(f"{path} names shard {shard!r}, outside the index's folder",   # a review: /etc/hostname
                             hint="an index names its shards by file name, next to it")
        file = os.path.join(folder, shard)
        if not os.path.lexists(file):
            raise UsageError(f"{path} names shard {shard}, which is not in {folder or '.'}",
                             hint="torchdiag never downloads: put every shard next to the index")
        regular_file(file, f"{path}: shard", hint="every shard is a .safetensors file on disk")
        part = _read_header(file) if meta else _read_safetensors(file)
        strays = sorted(k for k, v in weight_map.items() if v == shard and k not in part)
        if strays:   # the index and its shards disagree: the map is what a loader trusts
            raise UsageError(f"{path} maps {len(strays)} key(s) to {shard} that it does not hold ({strays[0]}…)",
                             hint="the index does not belong to these shards: save them again with save_pretrained")
        state.update(part)
    return state


def _torch_load(path: str, meta: bool) -> tuple[Any, dict]:
    """(the unpickled object, what stand-ins made). A torch.save file whose pickle names globals beyond
    weights_only's allow-list (found by torch's static scan, before any tensor is read) is read once with
    each mapped to an inert stand-in (`_StandIns`), or refused; any other file through weights_only alone."""
    zipped = _is_zip(path)
    # meta: mmap maps the file and nothing touches the data records (older torch read them for map_location meta)
    where = {"map_location": "meta" if meta else "cpu", "mmap": meta and zipped}
    # the legacy (non-zip) format, which torch's scan does not read: our own static scan of its pickles (a sweep: an
    # old Lightning .ckpt's argparse.Namespace refused where the same checkpoint zipped loaded)
    names = _globals_beyond_weights(path) if zipped else unsafe_globals(path)
    if not names:
        return _weights_only(path, where), {}
    hostile = _hostile_refusal(path, names)
    if hostile:
        raise hostile
    stand_ins = _StandIns(names)
    try:
        return stand_ins.load(path, where), stand_ins.made
    except Exception as exc:  # torch needed the real class: a tensor subclass, a list subclass, ...
        raise _refusal(path, f"it stores {', '.join(names[:3])}, which only their own code can rebuild") from exc


def _weights_only(path: str, where: dict):
    """torch.load(weights_only=True); its refusal said in our words, naming what the pickle would import."""
    import pickle

    import torch

    try:
        with warnings.catch_warnings():   # torch's notes on the pickle protocol: not the user's business
            warnings.simplefilter("ignore")
            return torch.load(path, weights_only=True, **where)
    except pickle.UnpicklingError as exc:
        found = unsafe_globals(path)
        if found:
            raise _hostile_refusal(path, found) or _refusal(path, f"it stores {', '.join(found[:3])}") from exc
        # no importable object in the stream: a damaged or foreign file, not a dangerous one. torch's own words
        # point at weights_only=False, which would not read a file that is no pickle at all (a sweep)
        foreign = _foreign(path)
        # torch's own words, cut at 120 characters, said less than this (a review)
        raise UsageError(f"cannot read {path}: " + (foreign or "a pickle that torch.load(weights_only=True) does not "
                         "read as torch.save's: written by pickle.dump, or cut short"),
                         hint="rename it to .safetensors" if foreign and "safetensors" in foreign else
                         "torchdiag reads files written by torch.save (or a Lightning .ckpt)") from exc
    except Exception as exc:  # not a torch file, truncated, ...
        why = _unreadable(path, exc)
        raise UsageError(f"cannot read {path}: {why}", hint=(
            f"convert it once in Python: torch.save({{k: torch.from_numpy(v) for k, v in numpy.load({path!r}).items()}}"
            ", 'weights.pt') and pass --checkpoint weights.pt" if NPZ in why else
            "torchdiag reads files written by torch.save (or a Lightning .ckpt)")) from exc


def _unreadable(path: str, exc: Exception) -> str:
    """Why torch.load could not read a file, in words: an empty file, or one that is neither torch.save's zip nor a
    pickle (a hostile review: a text file said "KeyError: 101", an empty one "EOFError"); else torch's own."""
    import os
    import zipfile

    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError:
        return one_line(exc)
    if size == 0:
        return "the file is empty"
    if head == b"PK" and not zipfile.is_zipfile(path):   # a zip's first bytes without its end: a copy cut short
        return f"a zip archive without its end ({size:,} bytes: cut short?): {one_line(exc, 120)}"
    if head != b"PK" and head[:1] != b"\x80":   # neither torch.save's zip nor a pickle's PROTO opcode
        return f"not a file torch.save wrote (neither its zip archive nor a pickle; {size:,} bytes)"
    if head == b"PK":
        return _other_zip(path) or one_line(exc)
    return one_line(exc)


NPZ = "a NumPy .npz: "


def _other_zip(path: str) -> str | None:
    """A zip archive that is not torch.save's (no data.pkl under one folder): what it holds, in words (a sweep: a
    NumPy .npz said torch's "[enforce fail at inline_container.cc:180] file in archive is not in a subdirectory")."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (OSError, zipfile.BadZipFile):
        return None
    if any(n.endswith("/data.pkl") for n in names):
        return None
    npz = names and all(n.endswith(".npy") for n in names)
    shown = ", ".join(names[:3]) + (f" … (+{len(names) - 3})" if len(names) > 3 else "")
    return f"a zip archive that torch.save did not write ({NPZ if npz else ''}it holds {shown or 'nothing'})"


def _refusal(path: str, why: str, hint: str | None = None) -> UsageError:
    return UsageError(f"{path} needs arbitrary unpickling ({why}), which could run code, so torchdiag will not load it",
                      hint=hint or "if you trust the file, convert it once in Python: "
                                   f"obj = torch.load('{path}', weights_only=False); "
                                   "torch.save(obj['state_dict'] if 'state_dict' in obj else obj.state_dict(), 'weights.pt') "
                                   "and pass --checkpoint weights.pt")


def _hostile_refusal(path: str, names: list[str]) -> UsageError | None:
    """Stand-ins would never call a code-running global, but no checkpoint has a reason to name one: the
    refusal says so, and its hint does not suggest opening the file with weights_only=False."""
    hostile = [h for h in map(_hostile, names) if h]
    if not hostile:
        return None
    return _refusal(path, f"it would call {', '.join(hostile[:3])}",
                    hint=f"no checkpoint needs to call {hostile[0]}: do not open this file with "
                         "torch.load(weights_only=False); ask its author for .safetensors or a saved state_dict")


def _foreign(path: str) -> str | None:
    """What a file torch.load could not read is, where its first bytes say it is not torch.save's: neither a zip
    nor a pickle (protocol 2+ opens with 0x80). A safetensors file opens with its header's length, then '{'."""
    kind = _sniffed(path)
    if kind == "torch":
        return None
    if kind == "safetensors":
        return "it is a safetensors file, not one written by torch.save"
    # a pickle of protocol 0 or 1 (torch.save(..., pickle_protocol=1)) opens otherwise too: weights_only reads neither
    return ("it begins with neither a zip nor a pickle protocol 2+ header: another kind of file, or a pickle too old "
            "for torch.load(weights_only=True)")


def _is_zip(path: str) -> bool:
    """A torch.save file of the zip format (every torch since 1.6), the only one mmap and the scan read."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def _globals_beyond_weights(path: str) -> list[str]:
    """The globals the pickle names beyond weights_only's allow-list, read statically by torch (nothing is
    imported). Empty when this torch has no such scan (older torch): such files are refused as before."""
    import torch

    scan = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    if scan is None or not hasattr(torch.serialization, "safe_globals"):
        return []
    try:
        return sorted(scan(path))
    except Exception:  # opcodes the static scan does not know (pickle protocol > 2): weights_only decides
        return []


def _hostile(name: str) -> str | None:
    """The code-running global the standard unpickler would import for `name`, else None. Python 2 names
    are mapped as pickle maps them (`commands.Popen` is subprocess.Popen, `__builtin__.exec` is exec)."""
    from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING

    module, _, attr = name.rpartition(".")
    module, attr = NAME_MAPPING.get((module, attr), (IMPORT_MAPPING.get(module, module), attr))
    if module.split(".")[0] in HOSTILE_MODULES or (module == "builtins" and attr in HOSTILE_BUILTINS):
        return f"{module}.{attr}"
    return _method(name)


def _method(name: str) -> str | None:
    """A class's method named as a global (protocol 4's `pathlib.Path.touch`): a checkpoint stores classes and
    values, never a method to call. The last name a function's (lower case), the one before it a class's (a
    review: a user package `Models.net.Cfg` was read as a method)."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[-1][:1].islower() and parts[-2][:1].isupper() and not parts[-1].startswith("__"):
        return name
    return None


class _StandIns:
    """Inert stand-ins for the globals a checkpoint names beyond tensors: a Lightning .ckpt's
    hyper_parameters (argparse.Namespace, AttributeDict, the user's own classes), callbacks, loops.
    Each name maps to a class of ours whose every construction (NEWOBJ, REDUCE) returns a new empty
    OrderedDict: the one type torch's weights-only unpickler lets both SETITEMS (dict subclasses) and
    BUILD (an object's state) fill. Nothing from the file's world is imported, nothing it names is called."""

    def __init__(self, names: list[str]):
        self.made: dict[int, tuple[str, Any]] = {}   # id -> (name stood in for, object), kept alive: ids stay unique
        self.pairs = [(self._class_for(name), name) for name in names]

    def _class_for(self, name: str) -> type:
        from collections import OrderedDict

        made = self.made

        def __new__(cls, *args, **kwargs):
            obj = OrderedDict()
            made[id(obj)] = (name, obj)
            return obj

        cls = type(f"StandIn[{name}]", (), {"__new__": __new__, "__module__": __name__})
        made[id(cls)] = (name, cls)   # the class itself may be a value (Lightning's hparams_type)
        return cls

    def load(self, path: str, where: dict):
        import torch

        # registered for this call only and removed on exit: the user's own torch.load never sees them
        with torch.serialization.safe_globals(self.pairs), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, weights_only=True, **where)


def _stood_for(value, made: dict) -> str | None:
    """The name a value stands in for (made by a stand-in, or a stand-in class), else None."""
    entry = made.get(id(value))
    return entry[0] if entry is not None and entry[1] is value else None


def unsafe_globals(path: str) -> list[str]:
    """The classes/functions a torch.save file's pickle would import, other than torch's own and the
    few containers weights_only allows. Found by reading the opcodes (pickletools), never by unpickling."""
    import io
    import pickletools
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            name = next(n for n in z.namelist() if n.endswith("data.pkl"))
            data = z.read(name)
    except Exception:
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_HEADER)
        except OSError:
            return []
    found, strings, stream = [], [], io.BytesIO(data)
    for _ in range(5):   # the legacy torch.save format is pickles in a row: magic, protocol, info, the object
        memo: dict[int, Any] = {}   # a string said twice is fetched from the memo (`timeit.timeit`: one object)
        last: Any = None
        try:
            for op, arg, _ in pickletools.genops(stream):
                if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
                    strings.append(arg)
                    last = arg
                    continue
                if op.name == "MEMOIZE":
                    memo[len(memo)] = last
                elif op.name in ("BINPUT", "LONG_BINPUT", "PUT"):
                    memo[int(arg)] = last
                elif op.name in ("BINGET", "LONG_BINGET", "GET") and isinstance(memo.get(int(arg)), str):
                    strings.append(memo[int(arg)])
                elif op.name == "GLOBAL":
                    found.append(arg.replace(" ", "."))
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                    found.append(f"{strings[-2]}.{strings[-1]}")
                last = memo.get(int(arg)) if op.name in ("BINGET", "LONG_BINGET", "GET") else None
        except Exception:  # a damaged stream, or the raw storage bytes after the pickles: what was found so far
            break
        if stream.tell() >= len(data):
            break
    safe = ("torch.", "collections.OrderedDict", "builtins.set", "builtins.frozenset", "_codecs.encode")
    return list(dict.fromkeys(g for g in found if not g.startswith(safe)))


def _unwrap(obj, path: str, made: dict | None = None, meta: bool = False) -> dict[str, Any]:
    """The state dict in what was unpickled (a Lightning/trainer dict around it is opened); `made` names
    what stand-ins built: one where a tensor should be means the tensors need arbitrary unpickling."""
    import torch

    made = made or {}
    top, path_in, left = obj, [], []
    for _ in range(3):   # a Lightning/trainer dict around the state dict ({'checkpoint': {'model': …}} too)
        if isinstance(obj, dict) and _around(obj):
            inner = _inner(obj)
            path_in += [k for k, v in dict.items(obj) if v is inner][:1]
            # another state dict of about its size (an EMA copy), not a callback's few scores
            left += [f"'{k}'" for k, v in dict.items(obj) if v is not inner and isinstance(v, dict)
                     and _tensors(v, 1) >= max(1, _tensors(inner, 1) // 2)]
            obj = inner
    if not isinstance(obj, dict) or not _is_state(obj):
        raise UsageError(f"{path} holds no state dict (found: {_found(top, made)})",
                         hint="save one with torch.save(model.state_dict(), 'weights.pt')")
    # dict's own methods: an unpickled OrderedDict may carry instance attributes (`items`) from the file
    foreign = [(k, _stood_for(v, made)) for k, v in dict.items(obj) if _stood_for(v, made)]
    if foreign:
        raise _refusal(path, f"its tensor {foreign[0][0]} is a {foreign[0][1]}")
    state = Unwrapped((k, v) for k, v in dict.items(obj) if isinstance(v, torch.Tensor) or k.endswith(EXTRA_STATE))
    for key, value in state.items():
        _plain_tensor(key, value, path, meta)
    if left:   # an EMA copy beside the model: which one was read (a sweep: nothing said)
        state.entry = f"entry {'/'.join(repr(k) for k in path_in)} read ({', '.join(left)} holding weights too: not read)"
    return state


class Unwrapped(dict):
    """A state dict taken from inside a trainer's checkpoint; `entry`: which one, where another held weights too."""

    entry = ""


EXTRA_STATE = "_extra_state"   # torch's suffix for get_extra_state(): plain containers under weights_only


def _around(obj: dict) -> bool:
    """A trainer's dict around the weights: no state dict itself, or one whose few tensors (pytorch/examples'
    tensor `best_acc1`, an `epoch` tensor) sit beside an entry holding more (a sweep: "0 tensors loaded, 8
    missing, 1 unexpected (best_acc1)", and --no-strict-checkpoint ran on random weights)."""
    inner = _inner(obj)
    return inner is not None and (not _is_state(obj) or _tensors(inner, 3) > _tensors(obj, 1))


def _inner(obj: dict):
    """The dict a trainer's checkpoint holds the weights in: a NESTED_KEYS entry holding tensors, else its one entry
    that is a dict holding tensors somewhere inside (an EMA copy beside the model is two: not guessed; a `model`
    entry holding the model's config beside `weights` is not it: a sweep)."""
    named = next((dict.get(obj, k) for k in NESTED_KEYS
                  if isinstance(dict.get(obj, k), dict) and _holds_tensors(dict.get(obj, k), 3)), None)
    if named is not None:
        return named
    inside = [v for v in dict.values(obj) if isinstance(v, dict) and _holds_tensors(v, 3)]
    return inside[0] if len(inside) == 1 else None


def _tensors(obj, depth: int) -> int:
    """The tensors in a dict and in its dicts, `depth` levels down."""
    import torch

    if depth <= 0 or not isinstance(obj, dict):
        return 0
    return sum(1 if isinstance(v, torch.Tensor) else _tensors(v, depth - 1) for v in dict.values(obj))


def _holds_tensors(obj, depth: int) -> bool:
    import torch

    if depth <= 0 or not isinstance(obj, dict):
        return False
    return any(isinstance(v, torch.Tensor) or _holds_tensors(v, depth - 1) for v in dict.values(obj))


def _plain_tensor(key: str, t, path: str, meta: bool) -> None:
    """A dense strided tensor: sparse, quantized, nested tensors, tensor subclasses and meta tensors (on a
    real device) cannot be copied into a parameter or buffer."""
    import torch

    if not isinstance(t, torch.Tensor):   # an extra state: the module's own set_extra_state takes it as it is
        return
    kind = ("sparse" if t.layout != torch.strided else "quantized" if t.is_quantized else "nested" if t.is_nested
            else f"a {type(t).__name__}" if type(t) not in (torch.Tensor, torch.nn.Parameter)
            else "meta (it has no values)" if t.is_meta and not meta else "")
    if kind:
        raise UsageError(f"{path}: tensor {key} is {kind}; torchdiag loads dense tensors only",
                         hint="save the plain weights: torch.save({k: v.to_dense() if v.is_sparse else v.dequantize() "
                              "if v.is_quantized else v for k, v in sd.items()}, 'weights.pt')")


def _found(obj, made: dict) -> str:
    """What a file holds instead of a state dict, in a few words (a pickled object by its class name)."""
    name = _stood_for(obj, made)
    if name:
        return f"a pickled {name}"
    if isinstance(obj, dict):
        return ", ".join(str(k) + (f" (a pickled {_stood_for(v, made)})" if _stood_for(v, made) else "")
                         for k in list(obj)[:6] for v in [obj[k]]) or "an empty dict"
    return type(obj).__name__


def _is_state(obj: dict) -> bool:
    import torch

    return bool(obj) and all(isinstance(k, str) for k in obj) and any(isinstance(v, torch.Tensor) for v in dict.values(obj))


# ---- loading -----------------------------------------------------------------------------------------

def strip_prefix(state: dict[str, Any], model_keys: set[str], path: str = "") -> tuple[dict[str, Any], str]:
    """Strip a prefix the model's keys do not have (`model.` of a LightningModule, `module.` of DDP,
    `_orig_mod.` of torch.compile, or any first name all keys share) when that makes more keys fit."""
    done, entry = "", ""
    for _ in range(3):   # stacked: DDP around a compiled model saves `module._orig_mod.` (a review)
        state, prefix = _strip_once(state, model_keys, path)
        entry = getattr(state, "entry", "") or entry
        if not prefix:
            break
        done += prefix
    if entry and not getattr(state, "entry", ""):   # said in the report (load), whichever strip found it
        state = Unwrapped(state)
        state.entry = entry
    return state, done


def _strip_once(state: dict[str, Any], model_keys: set[str], path: str) -> tuple[dict[str, Any], str]:
    firsts = {k.split(".", 1)[0] + "." for k in state if "." in k}
    shared = _shared_head(list(state))   # every key's leading names: `module._orig_mod.` stripped as one
    heads = {".".join(shared[:i]) + "." for i in range(2, len(shared) + 1)}
    candidates = list(STRIP_PREFIXES) + sorted((firsts | heads) - set(STRIP_PREFIXES))
    tried = {twice: {k[len(twice):] if k.startswith(twice) else k: v for k, v in state.items()}
             for prefix in candidates for twice in (prefix, prefix * 2)}
    return _best_fit(state, tried, model_keys, path, "stripped")


def add_prefix(state: dict[str, Any], model_keys: set[str], path: str = "") -> tuple[dict[str, Any], str]:
    """Put a prefix in front of every key when that makes more keys fit: a base model saved alone (BertModel's
    `embeddings.…`) loaded into one with a head that holds it (BertForMaskedLM's `bert.embeddings.…`), as
    transformers' from_pretrained does (a sweep: 44 missing and 39 unexpected keys, no word of the prefix)."""
    tried = {prefix: {prefix + k: v for k, v in state.items()}
             for prefix in sorted({k.split(".", 1)[0] + "." for k in model_keys if "." in k})}
    return _best_fit(state, tried, model_keys, path, "added")


def _best_fit(state: dict, tried: dict[str, dict], model_keys: set[str], path: str, how: str) -> tuple[dict, str]:
    """The first of the `tried` renamings that fits the most keys, more than `state` as it is; ("", state) when
    none does. Two that fit as many keys with other tensors (a GAN's `generator.` and `discriminator.`, a
    teacher and a student of one class) are not guessed between (a sweep: the alphabetically first was loaded)."""
    base = len(model_keys & state.keys())
    hits = {p: len(model_keys & t.keys()) for p, t in tried.items()}
    top = max(hits.values(), default=0)
    if top <= base:
        return state, ""
    fits: dict[frozenset, str] = {}
    for p in (p for p, h in hits.items() if h == top):   # in order: the first of those alike is the one said
        fits.setdefault(frozenset((k, id(v)) for k, v in tried[p].items() if k in model_keys), p)
    usual = [p for p in fits.values() if p in STRIP_PREFIXES or p[:len(p) // 2] in STRIP_PREFIXES]
    kept = (_beside(state, usual[0], [p for p in fits.values() if p != usual[0]])
            if len(fits) > 1 and len(usual) == 1 and how == "stripped" else None)
    if kept is not None:   # a wrapper's own name (Lightning's `model.` beside its `ema_model.`)
        return kept, usual[0]
    if len(fits) > 1:
        a, b = list(fits.values())[:2]
        if how == "stripped":
            part = f"keys under '{a}' or under '{b}'"
            hint = f"save the part you mean alone: torch.save({{k[len('{a}'):]: v for k, v in sd.items() " \
                   f"if k.startswith('{a}')}}, 'part.pt')"
        else:
            part = f"keys with the prefix '{a}' added or with '{b}'"
            hint = "load the file into the part you mean: a factory that returns that submodule"
        raise UsageError(f"--checkpoint {path}: {top} of the model's keys fit the file's {part}: which part is "
                         "meant is not known", hint=hint)
    best = next(iter(fits.values()))
    return tried[best], best


def _beside(state: dict, prefix: str, others: list[str]) -> Unwrapped | None:
    """The wrapper's copy (`prefix` stripped), the other copies' keys left out and said (a sweep: Lightning's `model.`
    beside its `ema_model.` loaded, then failed strict loading on the EMA's keys as unexpected). None where a stripped
    key is also a key of the file as it is (a model holding an `ema_model` of its own: `model.ema_model.x` beside the
    EMA's `ema_model.x`, a review): which one is meant is not known."""
    ours = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    rest = {k: v for k, v in state.items() if not k.startswith(prefix) and not k.startswith(tuple(others))}
    if ours.keys() & rest.keys() or any(k.startswith(tuple(others)) for k in ours):
        return None
    kept = Unwrapped({**ours, **rest})
    names = " and ".join(f"'{p}'" for p in others)
    kept.entry = f"the file's other copy under {names} left out ({len(state) - len(kept)} tensors)"
    return kept


def _shared_head(keys: list[str]) -> list[str]:
    """The dotted names every key starts with, short of the last (a key's own name is not a prefix)."""
    from os.path import commonprefix

    parts = [k.split(".")[:-1] for k in keys]
    return commonprefix(parts) if parts else []


def load(model, path: str, device, strict: bool = True, off: str = "--no-strict-checkpoint",
         saved: frozenset[str] | None = None) -> Report:
    """Read `path` and load what fits into `model` (in place: torchdiag built it). `off` is how the
    caller turns strictness off (the flag, or strict_checkpoint=False). `saved`: the keys of the head the file was
    saved with, where the model is another (other_head)."""
    state, header_only = read_state(path, device)
    entry = getattr(state, "entry", "")
    ours = model.state_dict(keep_vars=True)
    state, stripped = strip_prefix(state, set(ours), path)
    entry = "; ".join(e for e in dict.fromkeys((entry, getattr(state, "entry", ""))) if e)
    state, added = add_prefix(state, set(ours), path) if not stripped else (state, "")
    report = Report(path, stripped=stripped, added=added, header_only=header_only, entry=entry)
    meta = device is not None and device.type == "meta"
    fitting = _sort(model, state, ours, report, meta)
    other_head(report, saved, model, set(ours))
    if not report.fits and not header_only:
        layout = transformers_layout(model, path, saved)
        if layout is not None:
            report = Report(path, header_only=header_only, converted=True)
            fitting = _sort(model, layout[0], ours, report, meta)
            report.unexpected += layout[1]   # the saved head's, which transformers' loader left out
            other_head(report, saved, model, set(ours))
    if strict and not report.fits:
        raise UsageError(f"checkpoint {path} does not fit the model: "
                         + (f"with the prefix '{added}' added to its keys, " if added else "")
                         + report.mismatch_summary(SHOW_KEYS),
                         hint=_shard_hint(path, report) + ("the model was built with other sizes than the file's: "
                               "give its factory the file's (--arg, e.g. num_classes=5); " if report.mismatched else "")
                         + f"{off} loads the tensors that fit and reports each other key as a finding (exit 1)")
    # on meta the checkpoint's tensors replace the model's (its dtypes count); elsewhere values are copied in
    try:
        model.load_state_dict(fitting, strict=False, assign=meta)
    except Exception as exc:  # the model's own _load_from_state_dict / set_extra_state / load hooks
        raise ModelError(f"loading {path} into the model raised {one_line(exc)}",
                         hint="the model's own state-dict loading code (_load_from_state_dict, set_extra_state or "
                              "a load hook) failed; run model.load_state_dict in Python to see the traceback") from exc
    report.loaded = len(fitting)
    if not meta:
        report.tied = _tied_apart(ours, fitting)
        report.cast = _casts(ours, fitting)
    return report


def _shard_hint(path: str, report: Report) -> str:
    """A shard read alone (`model-00001-of-00006.safetensors`) holds a part of the weights: its index names them all
    (a sweep: the line blamed the model)."""
    import re

    found = re.search(r"-\d+-of-(\d+)\.safetensors$", os.path.basename(path))
    if not found or not report.missing:
        return ""
    index = os.path.join(os.path.dirname(path), "model.safetensors.index.json")
    return f"this is one shard of {int(found.group(1))}: " + (
        f"give --checkpoint its index, {index}, which names every shard; " if os.path.isfile(index) else
        "their index, model.safetensors.index.json, which names every shard, is not beside it: copy it there; ")


def other_head(report: Report, saved: frozenset[str] | None, model, ours: set[str]) -> None:
    """hf --arg task on weights saved with another head: a key the model lacks that the saved class has is its old
    head's (dropped), a key the model has that the saved class lacks is the new head's (initialised), as
    from_pretrained has them. A key both have and the file lacks stays missing: a partial checkpoint (a review: all
    missing keys excused let a file without an encoder layer pass)."""
    if saved is None:
        return
    # as the model names them, and as the file does (transformers' loader says a key it left out by the file's name)
    saved = saved | _as_model_names(saved, model, ours, (report.stripped, report.added))
    report.new_head = [k for k in report.missing if k not in saved]
    report.old_head = [k for k in report.unexpected if k in saved]
    report.missing = [k for k in report.missing if k in saved]
    report.unexpected = [k for k in report.unexpected if k not in saved]


def _as_model_names(saved: frozenset[str], model, ours: set[str], prefixes=()) -> frozenset[str]:
    """The saved class's keys named as the model names its own: as they are, or with the base model's prefix (`bert.`),
    or one the file's keys were stripped of or given, taken off or put on: whichever names most of the model's keys
    (an MLM's `bert.encoder…` is the base model's `encoder…`: a missing layer there is missing, not a new head's)."""
    base = getattr(model, "base_model_prefix", "")
    options = [saved]
    for p in dict.fromkeys([*prefixes, base + "." if base else ""]):
        if p:
            options.append(frozenset(k[len(p):] if k.startswith(p) else k for k in saved))
            options.append(frozenset(p + k for k in saved))
    return max(options, key=lambda s: len(s & ours))


def _sort(model, state: dict, ours: dict, report: Report, meta: bool) -> dict:
    """The file's tensors that fit the model; the report gets the keys that do not."""
    fitting = {}
    transient = _not_saved(model)
    for key, t in state.items():
        if key not in ours and key in transient:
            report.not_saved.append(key)   # a legacy file's value of a buffer the model now makes itself
        elif key not in ours:
            report.unexpected.append(key)
        elif key.endswith(EXTRA_STATE) and not hasattr(ours[key], "shape"):
            fitting[key] = t   # get_extra_state()'s own value: the module's set_extra_state takes it
        elif is_uninitialised(ours[key]) and hasattr(t, "shape"):
            fitting[key] = t   # a lazy module's: torch's load hook gives it the checkpoint's shape (a review: exit 4)
        elif not hasattr(t, "shape") or tuple(t.shape) != tuple(ours[key].shape):
            report.mismatched.append((key, tuple(getattr(t, "shape", ())), tuple(ours[key].shape)))
        else:
            fitting[key] = _cast_on_meta(t, ours[key]) if meta else t
    report.missing = [k for k in _missing(ours, state, fitting) if k not in _counts_torch_fills(model)]
    return fitting


def _not_saved(model) -> set[str]:
    """The model's non-persistent buffers (`register_buffer(..., persistent=False)`): values it computes itself and
    leaves out of its state dict. A file saved before it did so holds them (BERT's `embeddings.position_ids`, in every
    pre-4.31 transformers checkpoint: a sweep's `--checkpoint pytorch_model.bin` was refused for it)."""
    return {f"{name}.{b}" if name else b for name, m in model.named_modules()
            for b in getattr(m, "_non_persistent_buffers_set", ())}


def transformers_layout(model, path: str, saved: frozenset[str] | None = None) -> tuple[dict, list[str]] | None:
    """The file's weights in the layout a transformers model keeps in memory, read by transformers' own loader, and the
    file's keys it left out; or None. transformers >= 5 fuses some on loading (a MoE's experts into one tensor, saved
    one per expert: every Mixtral folder save_pretrained writes failed with 13 unexpected keys, a sweep; ViT's
    attention, a review). Safetensors only (no code runs), and only when that loader found every key of the model and
    used every key of the folder, but for another head's (`saved`: the saved class's keys): the
    keys only the new head has are left out (ours stay, other_head says them) and those only the old one had are
    returned; only for the folder's own weights (model.safetensors, or its index for shards), the files
    from_pretrained reads."""
    import sys

    # only the file from_pretrained itself reads from that folder (a review: another file in it, a step's or a wrong
    # one, was replaced by the folder's model.safetensors and called converted)
    folder = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    # an index beside a model.safetensors (save_pretrained twice into one folder) is not what from_pretrained reads
    if name not in ("model.safetensors", "model.safetensors.index.json") or "transformers" not in sys.modules or (
            name.endswith(".json") and os.path.exists(os.path.join(folder, "model.safetensors"))):
        return None
    from transformers import PreTrainedModel
    from transformers.utils import logging as hf_logging

    if not isinstance(model, PreTrainedModel):
        return None
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        twin, info = type(model).from_pretrained(folder, config=model.config,
                                                 local_files_only=True, use_safetensors=True, trust_remote_code=False,
                                                 output_loading_info=True)
    except Exception:   # noqa: BLE001 - not its layout either: the keys that do not fit are said as they are
        return None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    missing, unexpected = list(info.get("missing_keys") or []), list(info.get("unexpected_keys") or [])
    if info.get("mismatched_keys") or info.get("error_msgs") or (missing or unexpected) and saved is None:
        return None
    if saved is not None:   # the saved class's keys as it names them (the file's) and as the model does
        named = saved | _as_model_names(saved, model, set(model.state_dict()))
        if any(k in named for k in missing) or any(k not in named for k in unexpected):
            return None   # a key both heads have that the file lacks, or one neither has: not another head's
    state = twin.state_dict()
    for key in missing:
        state.pop(key, None)
    return state, unexpected


def _tied_apart(ours: dict[str, Any], fitting: dict[str, Any]) -> list[tuple[str, str]]:
    """Keys that are one tensor in the model (tied: an output layer sharing the embedding) whose values differ in the
    file: loading kept one and dropped the other without a word (a sweep: an untied checkpoint into a tied LLaMA).
    (kept, dropped), the kept one the key whose values the model holds now."""
    import torch

    groups: dict[int, list[str]] = {}
    for k in fitting:
        if isinstance(ours[k], torch.Tensor):
            groups.setdefault(id(ours[k]), []).append(k)
    out = []
    for keys in (g for g in groups.values() if len(g) > 1):
        now = ours[keys[0]].detach()
        same = [k for k in keys if _same(fitting[k], now)]
        kept = same[0] if same else keys[0]
        out += [(kept, k) for k in keys if k != kept and not _same(fitting[k], now)]
    return out


def _same(t, now) -> bool:
    """The file's tensor holds the model's values, NaN where NaN is (a review: torch.equal calls NaN unequal)."""
    import torch

    a = t.to(now.device, now.dtype)
    if not now.is_floating_point():
        return bool(torch.equal(a, now))
    return bool(torch.equal(a.isnan(), now.isnan()) and torch.equal(a.nan_to_num(0.0), now.nan_to_num(0.0)))


def _casts(ours: dict[str, Any], fitting: dict[str, Any]) -> dict[str, int]:
    """How many tensors the copy into the model cast, per pair of dtypes (bfloat16 → float32; int8 → float32, a
    quantized weight saved without its scale; complex64 → float32, its imaginary part dropped: a sweep saw these
    loaded unsaid)."""
    out: dict[str, int] = {}
    for k, t in fitting.items():
        if hasattr(t, "dtype") and hasattr(ours[k], "dtype") and t.dtype != ours[k].dtype:
            how = f"{str(t.dtype).replace('torch.', '')} → {str(ours[k].dtype).replace('torch.', '')}"
            out[how] = out.get(how, 0) + 1
    return out


def _counts_torch_fills(model) -> set[str]:
    """The batch counts torch's BatchNorm load fills with 0 when a state dict lacks them (one saved before the count
    existed, or without its version metadata, as every dict handed to load_state_dict here is): a legacy checkpoint
    that torch's strict load takes was refused as missing a key (a review)."""
    from torch.nn.modules.batchnorm import _BatchNorm

    return {f"{n}.num_batches_tracked" if n else "num_batches_tracked" for n, m in model.named_modules()
            if isinstance(m, _BatchNorm) and m.track_running_stats}


def _missing(ours: dict[str, Any], state: dict[str, Any], fitting: dict[str, Any]) -> list[str]:
    """Model keys the checkpoint does not have (a key of another shape is reported as that); a key tied to a loaded one (the same tensor, e.g. an
    output layer sharing the embedding, which save_pretrained writes once) is filled by it."""
    loaded_ids = {id(ours[k]) for k in fitting}
    return [k for k, t in ours.items() if k not in state and id(t) not in loaded_ids]


def _cast_on_meta(t, ours):
    """On meta the checkpoint's tensor replaces the parameter: an integer tensor for a float one takes the
    model's dtype, as the copy off meta would (a parameter of integers cannot take gradients)."""
    import torch

    if isinstance(t, torch.Tensor) and isinstance(ours, torch.Tensor) and (ours.is_floating_point() or ours.is_complex()) \
            and not (t.is_floating_point() or t.is_complex()):
        return t.to(ours.dtype)
    return t
