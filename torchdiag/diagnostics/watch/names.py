"""What the user's own code calls a trained model: with several (a GAN's generator and discriminator, both
`nn.Sequential`), their parameters are named after the variables or attributes the code holds them in
(`netG.0.weight`), not `Sequential#0.0.weight`. Looked up once per model, when it is first hooked, in the frames of
the code that called us; the frames of torch, of torchdiag and of the trainers are skipped."""
from __future__ import annotations

import dis
import functools
import inspect
import sys
from types import FrameType

# frames whose locals are not the user's names (a trainer's `model` is every model it is given)
LIBRARIES = frozenset({"torch", "torchdiag", "functools", "contextlib", "lightning", "pytorch_lightning",
                       "transformers", "accelerate"})
NOT_NAMES = frozenset({"self", "cls", "_"})
READS_LOCALS = frozenset({"locals", "vars", "exec", "eval"})   # a function naming these: its locals are not read


def user_names(root, same) -> list[str]:
    """The names the calling frames give `root` (`same(value)` says whether a value is it, or a wrapper of it):
    a local bound to it, or the attribute of a local module that holds it (`self.generator` in a LightningModule).
    The outermost frame's first: a helper's `model` argument is one word for every model it is given, while the
    script or `main()` that made the models holds the names the user chose."""
    import torch

    found: list[str] = []
    held: list[str] = []   # attributes of a module a trainer's frame holds: the user's names, where no frame of theirs
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        library = (frame.f_globals.get("__name__") or "").split(".")[0] in LIBRARIES
        here = []
        for name, value in _bindings(frame):
            if not isinstance(value, torch.nn.Module):
                continue
            if same(value) and name not in NOT_NAMES and not library:
                here.append(name)
            elif not same(value):
                here += [child for child, module in value.named_children() if same(module)]
        into = held if library else found
        into[:0] = [name for name in dict.fromkeys(here) if name.isidentifier() and name not in into]
        frame = frame.f_back
    # a LightningModule made inside `trainer.fit(M(), ...)` whose training_step calls self.body and self.head: by
    # the first optimizer step only Lightning's frames hold it (a sweep: `Sequential#0.0.weight` for `body.0.weight`)
    return found or held


def _bindings(frame) -> list:
    """A frame's locals, read without keeping them: before Python 3.13 a function's `f_locals` is a snapshot the
    frame keeps, which held every model the loop had bound (a model per task stayed alive, its optimizer's end was
    seen late and steps were miscounted). Its variables are taken out again after reading when nothing else holds it
    (the frame, our local and getrefcount's argument: 3); `locals()` and debuggers fill it anew before they read it.
    A function that names locals, vars, exec or eval is not read at all: a review's `config = locals()` was rewritten
    with every model (kept alive), and names exec put only in the snapshot were erased. A module's or class's locals
    are its real namespace: only read."""
    code = frame.f_code
    snapshots = sys.version_info < (3, 13) and code.co_flags & inspect.CO_OPTIMIZED
    if snapshots and _reads_locals_of(code):   # it may hold the snapshot, or exec names into it: not read
        return []
    try:
        snapshot = frame.f_locals
        items = list(snapshot.items())
        if snapshots and type(snapshot) is dict and sys.getrefcount(snapshot) <= 3:
            for name in (*code.co_varnames, *code.co_cellvars, *code.co_freevars):   # refilled at the next read
                snapshot.pop(name, None)
        return items
    except Exception:   # a frame's locals that cannot be read: no names from it
        return []


def _reads_locals_of(code) -> bool:
    try:
        return _reads_locals(code)
    except TypeError:   # a code object that does not hash: torch.compile's resume functions hold a dict constant
        return _reads_locals.__wrapped__(code)   # (a review: a compiled LBFGS step stopped watch there)


@functools.lru_cache(maxsize=256)
def _reads_locals(code) -> bool:
    """Does the function call locals, vars, exec or eval (a global or builtin load, not `model.eval()`)?"""
    return any(i.opname in ("LOAD_GLOBAL", "LOAD_NAME") and i.argval in READS_LOCALS for i in dis.get_instructions(code))


def label(candidates: list[str], taken: set[str], kind: str, order: int) -> str:
    """The first name no other model has. Every name taken (a model per fold, each bound to `model` in turn):
    `model#i`, its order among the models; no name at all: `Type#i`."""
    bases = {name.split("#")[0] for name in taken}   # `model#0` takes `model`: a third fold is `model#2`
    free = next((name for name in candidates if name not in bases), None)
    if free is not None:
        return free
    return f"{candidates[0] if candidates else kind}#{order}"
