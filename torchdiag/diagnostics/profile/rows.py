"""Profiler events → table rows: operators, CUDA kernels, modules (forward and backward), train phases."""
from __future__ import annotations

from ...results import Column, Table
from .labels import PHASE_PREFIX, ROOT_LABEL, is_ours, module_label

BACKWARD_NODE = "autograd::engine::evaluate_function:"


def _is_cpu_side(evt) -> bool:
    from torch.autograd import DeviceType

    return getattr(evt, "device_type", DeviceType.CPU) == DeviceType.CPU


# ----------------------------------------------------------------------------------------- operators

def operator_rows(averages, on_cuda: bool, shapes: bool, memory: bool) -> list[dict]:
    """One row per CPU-side operator (per input-shape group with --record-shapes)."""
    rows = []
    for e in averages:
        if is_ours(e.key) or not _is_cpu_side(e):
            continue
        r = {"op": e.key, "calls": int(e.count),
             "self_cpu_time_us": float(e.self_cpu_time_total), "cpu_time_us": float(e.cpu_time_total)}
        if on_cuda:
            r["self_cuda_time_us"] = float(e.self_device_time_total)
            r["cuda_time_us"] = float(e.device_time_total)
        if shapes:
            r["input_shapes"] = [list(s) if isinstance(s, (list, tuple)) else s for s in (e.input_shapes or [])]
            shown = list(r["input_shapes"])
            while shown and not shown[-1]:      # trailing non-tensor arguments (stride, padding, flags)
                shown.pop()
            r["_shapes"] = ", ".join("x".join(str(d) for d in s) if s else "·" for s in shown) or "·"
        if memory:
            r["self_cpu_memory_bytes"] = int(e.self_cpu_memory_usage)
            r["cpu_memory_bytes"] = int(e.cpu_memory_usage)
            if on_cuda:
                r["self_cuda_memory_bytes"] = int(e.self_device_memory_usage)
        rows.append(r)
    return rows


def kernel_rows(averages) -> list[dict]:
    rows = [{"kernel": e.key, "calls": int(e.count), "cuda_time_us": float(e.self_device_time_total)}
            for e in averages if not _is_cpu_side(e)]
    rows.sort(key=lambda r: -r["cuda_time_us"])
    return rows


def operator_table(rows, on_cuda: bool, opts, total: int) -> Table:
    cols = [Column("op", "operator")]
    if opts.record_shapes:
        cols.append(Column("_shapes", "input shapes"))
    cols += [Column("calls", "calls", "count"), Column("self_cpu_time_us", "self CPU", "float", "µs"),
             Column("self_cpu_share", "%", "pct"), Column("cpu_time_us", "total CPU", "float", "µs")]
    if on_cuda:
        cols += [Column("self_cuda_time_us", "self CUDA", "float", "µs"),
                 Column("cuda_time_us", "total CUDA", "float", "µs")]
    if opts.memory:
        cols += [Column("self_cpu_memory_bytes", "self CPU mem", "bytes"),
                 Column("cpu_memory_bytes", "CPU mem", "bytes")]
        if on_cuda:
            cols.append(Column("self_cuda_memory_bytes", "self CUDA mem", "bytes"))
    by = "self CUDA" if on_cuda else "self CPU"
    title = f"Top {len(rows)} of {total} operators by {by} time" if len(rows) < total else f"Operators by {by} time"
    note = f"totals over {opts.active} active step(s); % = share of all operators' self CPU time"
    if opts.memory:
        note += "; memory = bytes allocated minus freed inside the op (negative: freed more than allocated)"
    return Table("operators", title, cols, rows, note=note)


def kernel_table(rows) -> Table:
    return Table("kernels", "Top CUDA kernels by time", [
        Column("kernel", "kernel"), Column("calls", "calls", "count"),
        Column("cuda_time_us", "CUDA time", "float", "µs")], rows)


# ----------------------------------------------------------------------------------------- modules

def module_rows(events, types: dict, on_cuda: bool, train: bool, memory: bool) -> list[dict]:
    """Per-module rollup from the `module::` ranges (forward), plus backward time attributed through
    autograd sequence numbers (the forward op that created a backward node → its innermost module)."""
    fwd, order = _forward_rollup(events, on_cuda, memory)
    bwd = _backward_rollup(events, on_cuda) if train else {}
    _add_containers(fwd, order)
    rows = []
    for name in order:
        r = fwd[name]
        children = [c for c in order if _is_child(c, name)]
        row = {"name": name, "type": types.get(name, "?"), "calls": r["calls"],
               "cpu_time_us": r["cpu"],
               "self_cpu_time_us": r["cpu"] - sum(fwd[c]["cpu"] for c in children)}
        if on_cuda:
            row["cuda_time_us"] = r["cuda"]
        if train:
            inside = [n for n in bwd if n == name or _is_under(n, name)]
            row["backward_cpu_time_us"] = sum(bwd[n]["cpu"] for n in inside)
            if on_cuda:
                row["backward_cuda_time_us"] = sum(bwd[n]["cuda"] for n in inside)
        if memory:
            row["cpu_memory_bytes"] = int(r["mem"])
        row["depth"] = name.count(".") + 1 if name else 0
        if r.get("container"):
            row["_style"] = "dim"
        rows.append(row)
    rank = {name: i for i, name in enumerate(types)}
    rows.sort(key=lambda r: rank.get(r["name"], len(rank)))
    return rows


def _forward_rollup(events, on_cuda: bool, memory: bool) -> tuple[dict[str, dict], list[str]]:
    """Calls, CPU/CUDA time and net memory per `module::` range, in first-call order."""
    fwd: dict[str, dict] = {}
    order: list[str] = []
    for e in events:
        name = module_label(e.name)
        if name is None:
            continue
        r = fwd.get(name)
        if r is None:
            r = fwd[name] = {"calls": 0, "cpu": 0.0, "cuda": 0.0, "mem": 0}
            order.append(name)
        r["calls"] += 1
        r["cpu"] += e.cpu_time_total
        if on_cuda:
            r["cuda"] += e.device_time_total
        if memory:
            r["mem"] += e.cpu_memory_usage
    return fwd, order


def _backward_rollup(events, on_cuda: bool) -> dict[str, dict]:
    """Backward node time per module whose forward created the node."""
    # Every forward op records the autograd sequence number current at dispatch; the counter
    # only moves when an op creates a backward node. So among forward ops sharing a number the
    # node's creator is the last to start (earlier ones made no node, e.g. a frozen Linear).
    fwd_ops = [e for e in events if e.sequence_nr is not None and e.sequence_nr >= 0
               and not is_ours(e.name) and not e.name.startswith("autograd::")
               and not _is_backward_side(e)]
    fwd_ops.sort(key=lambda e: e.time_range.start)
    seq_owner = {(e.thread, e.sequence_nr): _innermost_module(e) for e in fwd_ops}
    bwd: dict[str, dict] = {}
    for e in events:
        if not e.name.startswith(BACKWARD_NODE):
            continue
        owner = seq_owner.get((getattr(e, "fwd_thread", e.thread), e.sequence_nr))
        if owner is None:
            continue
        b = bwd.setdefault(owner, {"cpu": 0.0, "cuda": 0.0})
        b["cpu"] += e.cpu_time_total
        if on_cuda:
            b["cuda"] += e.device_time_total
    return bwd


def _add_containers(fwd: dict[str, dict], order: list[str]) -> None:
    """Containers that are never called themselves (ModuleList, ModuleDict) get a row summing their
    direct submodules, so the tree has no holes."""
    missing = set()
    for name in order:
        parts = name.split(".") if name else []
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent not in fwd:
                missing.add(parent)
    if order and "" not in fwd:
        missing.add("")
    for name in sorted(missing, key=lambda n: -(n.count(".") + 1 if n else 0)):
        kids = [c for c in fwd if _is_child(c, name)]
        fwd[name] = {"calls": 0, "cpu": sum(fwd[c]["cpu"] for c in kids), "cuda": sum(fwd[c]["cuda"] for c in kids),
                     "mem": sum(fwd[c]["mem"] for c in kids), "container": True}
        order.append(name)


def _is_backward_side(evt) -> bool:
    fwd_thread = getattr(evt, "fwd_thread", None)
    if fwd_thread not in (0, None) and fwd_thread != evt.thread:
        return True
    p = evt
    while p is not None:  # CPU backward runs on the calling thread: look for the engine's range
        if p.name.startswith(BACKWARD_NODE):
            return True
        p = p.cpu_parent
    return False


def _innermost_module(evt) -> str | None:
    p = evt.cpu_parent
    while p is not None:
        name = module_label(p.name)
        if name is not None:
            return name
        p = p.cpu_parent
    return None


def _is_under(name: str, parent: str) -> bool:
    return parent == "" and name != "" or name.startswith(parent + ".")


def _is_child(name: str, parent: str) -> bool:
    if not _is_under(name, parent):
        return False
    rest = name if parent == "" else name[len(parent) + 1:]
    return "." not in rest


def module_table(rows, opts, on_cuda: bool) -> Table:
    for r in rows:
        d = r["depth"]
        r["_label"] = ROOT_LABEL if d == 0 else ("  " * (d - 1) + r["name"].rsplit(".", 1)[-1] if d > 1 else r["name"])
    shown = [r for r in rows if r["depth"] <= opts.depth]
    cols = [Column("_label", "module"), Column("type", "type"), Column("calls", "calls", "count"),
            Column("cpu_time_us", "fwd CPU", "float", "µs"), Column("share", "%", "pct"),
            Column("self_cpu_time_us", "self", "float", "µs")]
    if on_cuda:
        cols.append(Column("cuda_time_us", "fwd CUDA", "float", "µs"))
    if opts.mode == "train":
        cols.append(Column("backward_cpu_time_us", "bwd CPU", "float", "µs"))
        if on_cuda:
            cols.append(Column("backward_cuda_time_us", "bwd CUDA", "float", "µs"))
    if opts.memory:
        cols.append(Column("cpu_memory_bytes", "net CPU alloc", "bytes"))
    return Table("modules", "Time per module", cols, shown,
                 note=f"depth ≤ {opts.depth}; fwd includes submodules, self excludes them; % = fwd / summed step time"
                      + ("; dim rows: containers never called themselves (sum of their submodules)"
                         if any(r.get("_style") for r in shown) else "")
                      + ("; bwd = backward nodes created in the module's forward" if opts.mode == "train" else ""))


# ----------------------------------------------------------------------------------------- phases

def phase_rows(events) -> list[dict]:
    acc: dict[str, dict] = {}
    for e in events:
        if e.name.startswith(PHASE_PREFIX):
            r = acc.setdefault(e.name[len(PHASE_PREFIX):], {"cpu_time_us": 0.0, "cuda_time_us": 0.0})
            r["cpu_time_us"] += e.cpu_time_total
            r["cuda_time_us"] += e.device_time_total
    return [{"phase": k, **v} for k, v in acc.items()]


def phase_table(rows, on_cuda: bool) -> Table:
    return Table("phases", "Where a train step goes", [
        Column("phase", "phase"), Column("cpu_time_us", "CPU time", "float", "µs"),
        Column("share", "% of steps", "pct")] + (
        [Column("cuda_time_us", "CUDA time", "float", "µs")] if on_cuda else []), rows)


# ----------------------------------------------------------------------------------------- display

def round_and_display(table: Table) -> None:
    """Floats kept to 3 decimals (shares unrounded); JSON keeps microseconds (`*_us`), people read
    milliseconds (display-only `_` keys)."""
    for r in table.rows:
        for k, v in r.items():
            if isinstance(v, float) and not k.endswith("share"):
                r[k] = round(v, 3)
    for col in table.columns:
        if col.unit != "µs":
            continue
        key = col.key
        for r in table.rows:
            v = r.get(key)
            r["_" + key] = None if v is None else v / 1e3
        col.key, col.unit = "_" + key, "ms"
