"""--anomaly: the pass again under autograd anomaly detection, and the forward trace of the failing
backward op, reduced to the frames in the user's own code."""
from __future__ import annotations

import re

from ...errors import one_line
from ...results import Column, Result, Table


def anomaly_pass(model, inputs, loss_fn, autocast=None) -> dict:
    import contextlib
    import warnings

    import torch

    out = {"raised": False, "op": None, "message": None, "forward_trace": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autograd.detect_anomaly(check_nan=True):
            try:
                with autocast() if autocast is not None else contextlib.nullcontext():
                    loss = loss_fn(inputs.call(model))
                if loss.requires_grad:
                    loss.backward()
            except Exception as exc:  # RuntimeError from anomaly mode, or the model's own (the main pass ran it)
                out["raised"] = True
                out["message"] = one_line(exc)
    for w in caught:
        text = str(w.message)
        if "Traceback of forward call" in text:
            head, _, trace = text.partition("Traceback of forward call that caused the error:")
            out["op"] = head.replace("Error detected in", "").strip().rstrip(".")
            lines = [ln for ln in trace.splitlines() if ln.strip() and "Triggered internally" not in ln]
            out["forward_trace"] = lines
    return out


def report_anomaly(result: Result, a: dict) -> None:
    frames = parse_frames(a["forward_trace"])
    user = [f for f in frames if f["user"]]
    a = dict(a, user_frames=user)
    result.data["anomaly"] = a
    if not a["raised"]:
        result.notes.append("anomaly mode: no backward function returned NaN")
        return
    result.text["nancheck/anomaly"] = "```\n" + "\n".join(a["forward_trace"]) + "\n```"
    result.notes.append(f"anomaly mode stopped at {a['op'] or 'a backward function'}: {a['message']}")
    forward = result.data.get("forward")
    if forward or any(f.code in ("non-finite-input", "non-finite-param", "non-finite-loss") for f in result.findings):
        what = f"the forward NaN/Inf from {forward['module']}" if forward else "the non-finite values found above"
        result.notes.append(f"anomaly mode checks backward functions only: {a['op'] or 'the op it names'} is where "
                            f"{what} entered the backward, not where it was made")
    # torchdiag's own frames are never shown as the user's: without a user frame, torch's last ones
    shown = user or [f for f in frames if not _ours(f["file"]) and _in_torch(f["file"])][-3:]
    rows = [{"frame": f"{f['file']}:{f['line']} in {f['function']}", "code": f["code"]} for f in shown]
    note = "frames outside torch and torchdiag; the full trace is in JSON anomaly.forward_trace"
    if not user:
        in_loss = any(_ours(f["file"]) and f["file"].endswith("loss.py") for f in frames)
        note = ("no frame in your code: the op was created " + ("by torchdiag's loss (--loss)" if in_loss else "inside torch")
                + ("; torch's last frames shown" if rows else "") + "; the full trace is in JSON anomaly.forward_trace")
        if not rows:
            result.notes.append(note)
            return
    result.tables.append(Table("anomaly_frames", f"Anomaly mode: forward call that created {a['op'] or 'the failing op'}",
                               [Column("frame", "where (outermost first)"), Column("code", "code")], rows, note=note))


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>.+)$')


def _ours(path: str) -> bool:
    """A frame in torchdiag's own package."""
    import os

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.abspath(path).startswith(here + os.sep)


def _in_torch(path: str) -> bool:
    """A frame in torch itself (not whoever called torchdiag: a console script, typer/click, a test)."""
    return "/torch/" in path.replace("\\", "/")


def _internal(path: str) -> bool:
    norm = path.replace("\\", "/")
    return ("site-packages" in norm or "dist-packages" in norm or norm.startswith("<")
            or "/torchdiag/" in norm or "/torch/" in norm or norm.endswith("/runpy.py")
            or re.search(r"/(bin|Scripts)/torchdiag(\.exe|-script\.py)?$", norm) is not None)


def parse_frames(lines: list[str]) -> list[dict]:
    """Frames of a Python traceback text: file, line, function, code, and whether it is user code."""
    frames = []
    for i, ln in enumerate(lines):
        m = _FRAME.match(ln)
        if not m:
            continue
        code = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
        path = m.group("file")
        frames.append({"file": path, "line": int(m.group("line")), "function": m.group("fn"), "code": code,
                       "user": not _internal(path)})
    # frames above torchdiag's first frame are whoever called torchdiag (console script, a test, an
    # API user's script), not the code that created the op
    first = next((i for i, f in enumerate(frames) if "/torchdiag/" in f["file"].replace("\\", "/")), 0)
    for f in frames[:first]:
        f["user"] = False
    return frames
