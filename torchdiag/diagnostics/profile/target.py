"""Is a `.to()` / `.cpu()` a copy to the host once the model runs on a GPU? Read, on the CPU run, from the source of
the call that made it (profile --syncs: on the CPU every tensor is already there). The call's span comes from the
frame's code positions (core/syncs.call_span); its target is a "cpu" string among the call's arguments, read with the
conditionals a GPU machine would take the other way left out."""
from __future__ import annotations

import linecache
import re


def writes_cpu(site, span, devices_only: bool = False) -> bool:
    """The user's call writes the CPU as the target: a "cpu" string (`.to("cpu")`, `torch.device("cpu:0")`) among the
    source of the call the frame was in, on any of its lines (a review: `h.to(` with `"cpu")` on the next line was
    dropped; the whole statement read instead listed `h.to(DEV) if DEV else h.to("cpu")`). A device held in a
    variable or taken from a tensor (`.to(w.device)`, `.to(DEV)` with DEV "cuda" where there is one) is that device on a
    GPU, no copy (a review). Where the columns are not kept, the frame's line is read. `devices_only`: the run passed
    a torch.device, which a plain string in a conditional's branch cannot have been."""
    if site is None:
        return False
    text = _source(site[0], span) if span is not None else linecache.getline(site[0], site[1])
    target = target_strings(text or "", devices_only)
    return any(_CPU.fullmatch(v) for v in (target if target is not None else _strings(text or "")))


def target_strings(text: str, devices_only: bool = False) -> list[str] | None:
    """The string literals that can be the target of the call `text` is (`recv.to(...)`, `recv.cpu()`): in its
    positional arguments and its `device=` (a review: `non_blocking=DEV.type != "cpu"` was read as the target), not in
    the receiver (`torch.zeros(8, device="cpu").to(x.device)`, a copy to the GPU there), nor under a conditional on the
    machine (`"cuda" if torch.cuda.is_available() else "cpu"`: on a GPU the other branch runs). A conditional on the
    user's own flag takes the same branch on a GPU and counts, except a plain string branch where the run passed a
    torch.device (`"cpu" if OFFLOAD else h.device`, the flag off: a review). None where `text` is not one call."""
    import ast

    try:
        node = ast.parse("(" + text + ")", mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Call):
        return None
    out: list[str] = []

    def walk(n, direct: bool, branch: bool = False) -> None:
        # `direct`: the argument itself or an alternative of it; `branch`: one of several alternatives (a conditional's
        # branch, an `and`/`or` operand), whose plain string cannot have made a torch.device the run passed. Inside a
        # call (torch.device("cpu" if … else …)) a string makes the device (a review)
        if isinstance(n, ast.IfExp):
            if not on_machine(n.test):   # on the machine: a GPU takes the other branch
                walk(n.body, direct, branch or direct)
                walk(n.orelse, direct, branch or direct)
            return
        if isinstance(n, ast.BoolOp):   # `A and "cpu" or h.device`: alternatives too (a review)
            for v in n.values:
                walk(v, direct, branch or direct)
            return
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and not (branch and devices_only):
            out.append(n.value)
        inside = isinstance(n, ast.Call)
        for child in ast.iter_child_nodes(n):
            walk(child, direct and not inside, branch and not inside)
    for arg in [*node.args, *(k.value for k in node.keywords if k.arg == "device")]:
        walk(arg, True)
    return out


def on_machine(test) -> bool:
    """Does a condition read the machine (`torch.cuda.is_available()`, a `HAS_CUDA` flag)? By its names' words, not
    substrings (a review: `SAVE_TIMESTAMPS` held "mps", `accelerator.is_main_process` "accelerator")."""
    import ast

    words: set[str] = set()
    for n in ast.walk(test):
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
        if name:   # snake_case and camelCase words, a plural's stem too (useCuda, num_gpus: a review)
            parts = [w.lower() for w in re.findall(r"[A-Z]+s(?![a-z])|[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", name)]
            words |= set(parts) | {w[:-1] for w in parts if w.endswith("s")} | {name.lower()}
    return bool(words & _MACHINE_WORDS)


_CPU = re.compile(r"cpu(:\d+)?")
# the words of a condition that differs between a CPU and a GPU machine (`torch.cuda.is_available()`, a HAS_CUDA
# flag): a user's own flag (`"cpu" if OFFLOAD else "cuda"`) takes the same branch on both (a review: dropped)
_MACHINE_WORDS = {"cuda", "mps", "xpu", "gpu", "is_available", "device_count"}


def _source(file: str, span: tuple) -> str | None:
    """The source between a span's columns (byte offsets, as Python keeps them)."""
    first, last, col, end = span
    lines = [linecache.getline(file, n).encode() for n in range(first, last + 1)]
    if not all(lines):
        return None
    lines[-1] = lines[-1][:end]
    lines[0] = lines[0][col:]
    return b"".join(lines).decode(errors="replace")


def _strings(text: str) -> list[str]:
    """The string literals' values in a piece of source (comments and names left out)."""
    import ast
    import io
    import tokenize

    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.STRING:
                try:
                    value = ast.literal_eval(tok.string)
                except (ValueError, SyntaxError):
                    continue
                if isinstance(value, str):
                    out.append(value)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass   # a piece cut mid-expression: the strings read until then count
    return out
