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
from collections import Counter

from ...core.syncs import (
    TO_DEVICE,
    SyncCounter,
    call_span,
    library_dirs,
    python_stack,
    user_site,
)
from ...results import Column, Table
from .target import writes_cpu

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
    spans: dict = {}
    outside = 0
    for e in counter.events:
        if ctx.on_cuda and e.device == "cpu":
            continue                         # a CPU tensor read: no device to wait for
        frames = e.frames[base:]
        site = user_site(frames, libraries)
        span = _span(site, frames, e.calls[base:])
        if e.op in ("Tensor.to", TO_DEVICE) and not writes_cpu(site, span, e.op == TO_DEVICE):
            outside += site is None and e.op == "Tensor.to"   # torch's own `.to("cpu")`: counted as before
            continue
        if site is None:
            outside += 1
        else:
            key = (site[0], site[1], site[2], kind(e.op, e.via), e.op)
            sites[key] += 1
            spans.setdefault(key, span)
    seen = {s[:2] for s in sites}
    for stack in warned:                     # CUDA saw a sync the dispatch-level rules did not
        site = user_site(stack, libraries)
        if site is not None and site[:2] not in seen:
            sites[(site[0], site[1], site[2], CUDA_OP, CUDA_OP)] += 1
    detection = "dispatch-level counter + torch.cuda.set_sync_debug_mode" if ctx.on_cuda else "dispatch-level counter"
    return {"rows": [_row(*key, n, spans.get(key)) for key, n in sorted(sites.items(), key=lambda kv: (kv[0][0], kv[0][1]))],
            "outside": outside, "detection": detection}


def _span(site, frames: tuple, calls: tuple) -> tuple | None:
    """The source span (core/syncs.call_span) of the call the user's frame was in when it synced."""
    if site is None or len(calls) != len(frames):
        return None
    at = next((i for i, f in enumerate(frames) if f is site), None)
    return call_span(calls[at]) if at is not None else None


def _row(file: str, line: int, function: str, k: str, op: str, count: int, span: tuple | None = None) -> dict:
    try:
        shown = os.path.relpath(file)
        shown = file if shown.startswith("..") else shown
    except ValueError:                       # another drive (Windows)
        shown = file
    first, last = (span[0], span[1]) if span is not None and span[0] <= line <= span[1] else (line, line)
    code = " ".join(filter(None, (code_text(file, n) for n in range(first, last + 1)))) or None
    return {"site": f"{shown}:{line}", "file": file, "line": line, "function": function, "op": k,
            "detected_op": op, "count": count, "code": _shortened(code)}


def _shortened(code: str | None, most: int = 100) -> str | None:
    """A call written over many lines, shown on one, cut at `most` characters."""
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
