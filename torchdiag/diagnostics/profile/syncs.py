"""profile --syncs: the places in the user's code that made the host wait for the device, in one step.

One extra step (after the profiled ones: steady state, not recorded by the profiler) runs under
core.syncs.SyncCounter with Python frames; each sync is attributed to the innermost frame of the
user's code (outside torch, torchdiag, the standard library and, when possible, installed
packages). Syncs with no such frame are torchdiag's own (the loss rule checking its target) or the
optimizer's: counted apart, never listed. On CUDA, `torch.cuda.set_sync_debug_mode("warn")` runs
too (the ground truth: it sees syncs inside C++ code no dispatch-level rule knows), and its warnings
are attributed the same way; reads of CPU tensors (an optimizer's step counters) are dropped there.
On the CPU every tensor is on the CPU, so `.cpu()` / `.to("cpu")` are listed as the copies they
become once the model runs on a GPU."""
from __future__ import annotations

import contextlib
import linecache
import os
import re
from collections import Counter

from ...core.syncs import TO_DEVICE, SyncCounter, library_dirs, python_stack, user_site
from ...results import Column, Table

CUDA_WARNING = "called a synchronizing CUDA operation"
CUDA_OP = "synchronizing CUDA call"
_KINDS = {"aten::_local_scalar_dense": "scalar read", "aten::nonzero": "nonzero",
          "aten::masked_select": "masked_select", "aten::index": "boolean-mask indexing",
          "aten::index_put": "boolean-mask indexing", "aten::index_put_": "boolean-mask indexing",
          "aten::_index_put_impl_": "boolean-mask indexing", "aten::equal": "torch.equal",
          "aten::repeat_interleave": "repeat_interleave", "aten::_to_copy": '.cpu() / .to("cpu")',
          "aten::copy_": "copy to the CPU", "Tensor.tolist": ".tolist()", "Tensor.cpu": ".cpu()",
          "Tensor.to": '.to("cpu")', TO_DEVICE: '.to("cpu")'}
_HINTS = {
    "scalar read": "keep the value a tensor (torch.clamp/torch.where instead of Python arithmetic), "
                   "or read it every N steps",
    "bool()": "a Python `if`/`while`/`and` on a tensor waits for the device: use torch.where, or check "
              "outside the step",
    "boolean-mask indexing": "the result's size depends on the values: keep the shape with "
                             "torch.where(mask, x, 0) or masked_fill",
    "nonzero": "the result's size depends on the values: keep a mask, or torch.nonzero_static(size=...)",
    "copy": "a copy to the host waits for the device: copy once after the loop, or non_blocking=True into "
            "pinned memory",
    "print": "printing or .tolist() reads every value: log every N steps",
}


def kind(op: str, via: str | None) -> str:
    """What the user wrote: the Python call when one was seen, else the op's name."""
    if via is not None:
        return via
    if op.startswith("aten::_unique") or op.startswith("aten::unique"):
        return "unique"
    return _KINDS.get(op, op)


def hint(k: str) -> str:
    if k in (".item()", "float()", "int()", "format(tensor)", "scalar read"):
        return _HINTS["scalar read"]
    if k in (".cpu()", '.to("cpu")', '.cpu() / .to("cpu")', "copy to the CPU"):
        return _HINTS["copy"]
    if k in ("print(tensor)", ".tolist()"):
        return _HINTS["print"]
    return _HINTS.get(k, "its result depends on the values: find a shape-stable or tensor-only form")


@contextlib.contextmanager
def cuda_sync_warnings(base: int):
    """torch.cuda.set_sync_debug_mode("warn") for the block; yields the list of the Python stacks
    (outermost first, deeper than `base` frames) at which CUDA reported a synchronizing call."""
    import warnings

    import torch

    stacks: list[tuple] = []
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.filterwarnings("always", message=CUDA_WARNING)
        shown = warnings.showwarning

        def capture(message, category, filename, lineno, file=None, line=None):
            if str(message).startswith(CUDA_WARNING):
                stacks.append(python_stack(1)[base:])     # called synchronously: the user's frames are below
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = capture
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield stacks
        finally:
            torch.cuda.set_sync_debug_mode(previous)


def detect(step, ctx) -> dict:
    """Run `step()` once under sync detection: {"rows": [...], "outside": n, "detection": str}."""
    base = len(python_stack(1))                   # frames of this call and its callers: not the step's
    cuda = cuda_sync_warnings(base) if ctx.on_cuda else contextlib.nullcontext([])
    with SyncCounter(frames=True, host_copies=not ctx.on_cuda) as counter, cuda as warned:
        step()
    libraries = library_dirs()
    sites: Counter = Counter()
    outside = 0
    for e in counter.events:
        if ctx.on_cuda and e.device == "cpu":
            continue                         # a CPU tensor read: no device to wait for
        site = user_site(e.frames[base:], libraries)
        if e.op in ("Tensor.to", TO_DEVICE) and not _writes_cpu(site):
            outside += site is None and e.op == "Tensor.to"   # torch's own `.to("cpu")`: counted as before
            continue
        if site is None:
            outside += 1
        else:
            sites[(site[0], site[1], site[2], kind(e.op, e.via), e.op)] += 1
    seen = {s[:2] for s in sites}
    for stack in warned:                     # CUDA saw a sync the dispatch-level rules did not
        site = user_site(stack, libraries)
        if site is not None and site[:2] not in seen:
            sites[(site[0], site[1], site[2], CUDA_OP, CUDA_OP)] += 1
    detection = "dispatch-level counter + torch.cuda.set_sync_debug_mode" if ctx.on_cuda else "dispatch-level counter"
    return {"rows": [_row(*key, n) for key, n in sorted(sites.items(), key=lambda kv: (kv[0][0], kv[0][1]))],
            "outside": outside, "detection": detection}


def _writes_cpu(site) -> bool:
    """The user's statement writes the CPU as the target: a "cpu" string (`.to("cpu")`, `torch.device("cpu:0")`), on
    any of its lines (a review: `h.to(` with `"cpu")` on the next line was dropped). A device held in a variable or
    taken from a tensor (`.to(w.device)`, `.to(DEV)` with DEV "cuda" where there is one) is that device on a GPU, no
    copy (a review)."""
    if site is None:
        return False
    code = statement_text(site[0], site[1]) or ""
    return re.search(r"""["']cpu(:\d+)?["']""", code) is not None


def statement_text(file: str, line: int) -> str | None:
    """The statement holding `line`, its lines joined without their comments (None when the source is not readable)."""
    first, last = _statement_lines(file, line)
    return " ".join(filter(None, (code_text(file, n) for n in range(first, last + 1)))) or None


def _statement_lines(file: str, line: int) -> tuple[int, int]:
    """(first, last) line of the innermost simple statement holding `line`; (line, line) where the file cannot be
    parsed."""
    import ast

    tree = _parsed(file)
    best = (line, line)
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.stmt) and not hasattr(node, "body") and node.lineno <= line <= (node.end_lineno or 0):
            if best == (line, line) or node.end_lineno - node.lineno < best[1] - best[0]:
                best = (node.lineno, node.end_lineno)
    return best


def _parsed(file: str):
    import ast

    text = "".join(linecache.getlines(file))
    if not text:
        return None
    key = (file, hash(text))
    if key not in _TREES:
        try:
            _TREES[key] = ast.parse(text)
        except (SyntaxError, ValueError):
            _TREES[key] = None
    return _TREES[key]


_TREES: dict = {}   # a file's parsed source, per run (one parse per file the sync sites are in)


def _row(file: str, line: int, function: str, k: str, op: str, count: int) -> dict:
    try:
        shown = os.path.relpath(file)
        shown = file if shown.startswith("..") else shown
    except ValueError:                       # another drive (Windows)
        shown = file
    return {"site": f"{shown}:{line}", "file": file, "line": line, "function": function, "op": k,
            "detected_op": op, "count": count, "code": _shortened(statement_text(file, line))}


def _shortened(code: str | None, most: int = 100) -> str | None:
    return code if code is None or len(code) <= most else code[:most - 1] + "…"


def code_text(file: str, line: int) -> str | None:
    """The source line, without its trailing comment (None when the source is not readable)."""
    import io
    import tokenize

    text = linecache.getline(file, line)
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                text = text[: tok.start[1]]
                break
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass                                  # a line inside a multi-line statement: kept whole
    return text.strip() or None


def report(result, found: dict, opts) -> None:
    """The `syncs` table, one `host-sync` warning per site, the data keys and a summary line."""
    rows = found["rows"]
    total = sum(r["count"] for r in rows)
    step = "forward" if opts.mode == "inference" else "forward + loss + backward + optimizer step"
    result.data["syncs_per_step"] = total
    result.data["syncs_outside_user_code"] = found["outside"]
    result.data["sync_detection"] = found["detection"]
    result.tables.append(Table("syncs", "Host syncs in your code (one step)", [
        Column("site", "file:line"), Column("op", "op"), Column("count", "per step", "count"),
        Column("code", "code")], rows,
        note=f"one {step}, after the profiled steps (not timed)" + (
            f"; {found['outside']} more outside your code (torchdiag's loss rule, the optimizer) not listed"
            if found["outside"] else "")))
    for r in rows:
        result.add("host-sync", "warning", r["site"],
                   f"{r['op']} in {r['function']}() makes the host wait for the device, {r['count']}× per step",
                   hint=hint(r["op"]))
    result.summary.append(("Host syncs", f"{total} per step in your code at {len(rows)} place(s)" if rows
                           else "none in your code"))
