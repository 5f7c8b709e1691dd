"""Files of `profile`: the Chrome/Perfetto trace (`--trace FILE`) and the profiler's own TensorBoard
trace (`--tb DIR`, under DIR/profile/), both from `result.artefacts["trace"]` (Chrome trace JSON bytes)."""
from __future__ import annotations

import gzip
from pathlib import Path

from ..errors import UsageError
from .output import atomic_write

VIEWER = "open in https://ui.perfetto.dev or chrome://tracing"
RANK_OUTPUTS = ("trace",)     # under torchrun every rank writes its own (write_rank_outputs), rank 0 none twice


def _trace_bytes(result, option: str, path) -> bytes:
    data = result.artefacts.get("trace")
    if not data:
        raise UsageError(f"{option} {path}: the trace could not be written: the profiler did not write it "
                         "(it reports that only in its own log)",
                         hint="give a file in a writable folder, e.g. --trace run.json" if option == "--trace"
                         else "give a writable folder, e.g. --tb runs/")
    if not _complete(data):
        raise UsageError(f"{option} {path}: the trace could not be written: the profiler wrote {len(data):,} bytes "
                         "that end before the trace does (a full disk or a file-size limit where it writes)",
                         hint="free space in the temporary folder (TMPDIR), or raise the limit (ulimit -f)")
    return data


def _complete(data: bytes) -> bool:
    """A whole Chrome trace: kineto ends it with its "traceName" key and the closing brace (checked in the tail, at no
    cost); else parsed whole. A sweep: under a file-size limit kineto's write was cut short unnoticed, and the
    truncated bytes replaced the user's previous trace, exit 0."""
    import json

    if data.rstrip().endswith(b"}") and b'"traceName"' in data[-4096:]:
        return True
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def rank_path(path, rank: int | None) -> str:
    """Under torchrun each rank writes its own trace: run.json -> run.rank0.json, run.json.gz ->
    run.rank0.json.gz, run -> run.rank0. No rank (plain run): the path as given."""
    if rank is None:
        return str(path)
    p = Path(path)
    gz = p.name.endswith(".gz")
    stem = p.name[:-3] if gz else p.name
    base, dot, ext = stem.rpartition(".")
    name = f"{base}.rank{rank}.{ext}" if dot and base else f"{stem}.rank{rank}"
    return str(p.with_name(name + (".gz" if gz else "")))


def _rank(result) -> int | None:
    """This process's rank under torchrun (set by the CLI on each rank's result), else None."""
    rank = result.artefacts.get("rank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


def write_trace(result, path) -> str:
    """The trace at `path` (gzip-compressed when the name ends in .gz, as torch.profiler does); under
    torchrun, this rank's own file (rank_path)."""
    data = _trace_bytes(result, "--trace", path)
    path = rank_path(path, _rank(result))
    if str(path).endswith(".gz"):
        data = gzip.compress(data)
    atomic_write(path, data, "--trace")
    return str(path)


def write_rank_outputs(result, outputs: dict, rank: int) -> dict[str, str]:
    """Under torchrun, on every rank before the gather (runner/ranks.py): this rank's own files among
    RANK_OUTPUTS (`--trace run.json` -> run.rank<N>.json). Returns kind -> path written."""
    result.artefacts["rank"] = rank
    return {"trace": write_trace(result, outputs["trace"])} if outputs.get("trace") is not None else {}


def write_tb_trace(result, path) -> str:
    """DIR/profile/<host>_<pid>.<ns>.pt.trace.json: the name torch's tensorboard_trace_handler gives,
    which TensorBoard's profiler plugin looks for."""
    import os
    import socket
    import time

    data = _trace_bytes(result, "--tb", path)
    out = Path(path) / "profile" / f"{socket.gethostname()}_{os.getpid()}.{time.time_ns()}.pt.trace.json"
    atomic_write(out, data, "--tb")
    return str(out)


def record(result, written: dict) -> None:
    """The CLI's render_extra: the paths written go into the JSON document and the summary (under
    torchrun every rank's trace: profile/ranks.py put them in data["traces"])."""
    traces = result.data.get("traces")
    if traces:
        result.summary.append(("Traces", f"{', '.join(traces)}  ({VIEWER})"))
    elif "trace" in written:
        result.data["trace"] = written["trace"]
        result.summary.append(("Trace", f"{written['trace']}  ({VIEWER})"))
    if "tb_trace" in written:
        result.data["tb_trace"] = written["tb_trace"]
        result.summary.append(("TB trace", written["tb_trace"]))


# the files this command writes, by the kind its caller asks for (RenderSpec.outputs)
WRITERS = {"trace": write_trace, "tb_trace": write_tb_trace}
