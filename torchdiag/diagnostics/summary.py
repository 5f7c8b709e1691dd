"""summary: layers, output shapes, parameters (trainable, frozen, shared), sizes.

Per-module parameter counts come from torchinfo's layer listing; the totals are ours, because
torchinfo 1.8.0 counts a tensor shared by two modules (tied embeddings) once per module. The
forward pass runs with torchdiag's own hooks (eval mode, no grad): they give full module
paths, outputs of any structure (dicts, tuples), modules that never ran, and name the module
that raised."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ..core.guard import leave_no_trace
from ..core.run import number
from ..core.tracking import CONTAINERS, ModuleTracker, describe, forward_error
from ..errors import one_line
from ..results import Column, Result, Table


@dataclass
class Options:
    depth: int = 3
    graph: bool = False     # also trace the model graph for TensorBoard (artefacts["tb_graph"])

    def __post_init__(self):
        number("depth", self.depth, low=0, integer=True)


def unique_params(model):
    return list({id(p): p for p in model.parameters()}.values())


def shared_groups(model) -> list[list[str]]:
    """Names of each parameter tensor registered under more than one name (ties)."""
    groups: dict[int, list[str]] = defaultdict(list)
    for name, p in model.named_parameters(remove_duplicate=False):
        groups[id(p)].append(name)
    return [names for names in groups.values() if len(names) > 1]


def dtype_bytes(model) -> list[dict]:
    rows: dict[str, dict] = {}
    for kind, tensors in (("param", unique_params(model)),
                          ("buffer", list({id(b): b for b in model.buffers()}.values()))):
        for t in tensors:
            key = str(t.dtype).replace("torch.", "")
            row = rows.setdefault(key, {"dtype": key, "params": 0, "param_bytes": 0, "buffers": 0, "buffer_bytes": 0})
            row[f"{kind}s"] += t.numel()
            row[f"{kind}_bytes"] += t.numel() * t.element_size()
    return sorted(rows.values(), key=lambda r: -(r["param_bytes"] + r["buffer_bytes"]))


def torchinfo_listing(model):
    """torchinfo's static layer list (no forward): {module id: LayerInfo}, and its total."""
    import torchinfo

    try:
        stats = torchinfo.summary(model, depth=10_000, verbose=0)
    except Exception:  # torchinfo is a helper here: without it, rows use torchdiag's own counts
        return {}, None
    by_id = {}
    for info in stats.summary_list:
        by_id.setdefault(id(info.module), info)
    return by_id, int(stats.total_params)


def _subtree_params(module) -> tuple[int, str]:
    ps = list({id(p): p for p in module.parameters()}.values())
    n = sum(p.numel() for p in ps)
    t = sum(p.numel() for p in ps if p.requires_grad)
    return n, ("—" if n == 0 else "yes" if t == n else "no" if t == 0 else "partial")


def _rows(model, tracker, depth: int, listing) -> tuple[list[dict], list[str]]:
    first: dict = {}
    count: dict[str, int] = defaultdict(int)
    shapes: dict[str, list] = defaultdict(list)   # each call's output, distinct, in order (a pool used twice)
    for call in tracker.calls:
        first.setdefault(call.name, call)
        count[call.name] += 1
        if call.done and call.output not in shapes[call.name]:
            shapes[call.name].append(call.output)
    called = set(first)
    rows, uncalled = [], []
    for name, mod in model.named_modules():
        if not name:
            continue
        kind = type(mod).__name__
        # a holder whose children ran though it did not: a ModuleList, or a Sequential a loop iterates (a sweep: HF
        # cvt's stages said "never ran in forward", their 1, 2 and 10 layers all run)
        # (one holding parameters or buffers of its own is no holder: its forward, skipped, would have read them: a
        # review's block whose children were called directly, its own gain dead)
        children = [f"{name}.{c}" for c, _ in mod.named_children()]
        holder = bool(children) and not any(True for _ in mod.parameters(recurse=False)) and \
            not any(True for _ in mod.buffers(recurse=False))
        ran = name in called or (kind in CONTAINERS and any(c.startswith(name + ".") for c in called)) or (
            holder and all(c in called or any(k.startswith(c + ".") for k in called) for c in children))
        if not ran:
            uncalled.append(name)
        d = name.count(".") + 1
        if d > depth:
            continue
        info = listing.get(id(mod)) if listing else None
        if info is not None:
            params, trainable = int(info.num_params), info.trainable
            trainable = {"True": "yes", "False": "no", "--": "—", "Partial": "partial"}.get(trainable, trainable)
        else:
            params, trainable = _subtree_params(mod)
        call = first.get(name)
        shape = (call.output if call and call.done else "(raised)" if call
                 else "(container)" if ran else "(not called)")
        rows.append({
            "name": name, "type": kind, "depth": d, "output_shape": shape,
            "params": params, "trainable": trainable, "calls": count.get(name, 0),
            "_style": None if ran else "dim", "_shape": _calls_shape(shape, shapes.get(name, []), count.get(name, 0)),
        })
        if count.get(name, 0) > 1:
            rows[-1]["output_shapes"] = shapes[name]
    return rows, uncalled


def _calls_shape(shape: str, seen: list, calls: int) -> str:
    """The shape column: the first call's output, and for a module called more than once the count of calls and
    the other shapes they gave (up to three in all)."""
    if calls < 2:
        return shape
    listed = ", ".join(seen[:3]) + (", …" if len(seen) > 3 else "") if seen else shape
    return f"{listed} ({calls} calls)"


def run(model, inputs, opts: Options, ctx) -> Result:
    import torch

    result = Result("summary", header={"mode": "eval, no grad (one forward pass)"})
    tracker = ModuleTracker(model)
    with leave_no_trace(model):
        model.eval()
        with torch.no_grad(), ctx.autocast(), tracker:   # --amp: the forward as it trains
            try:
                output = inputs.call(model)
            except Exception as exc:
                rows, _ = _rows(model, tracker, opts.depth, torchinfo_listing(model)[0])
                partial = Result("summary", header=result.header)
                partial.tables.append(_layer_table([r for r in rows if r["calls"]], opts.depth,
                                                   "Modules that ran before the error"))
                raise forward_error(exc, tracker, partial=partial) from exc

    # after the forward: lazy modules (nn.LazyLinear …) only have their parameters from then on
    listing, torchinfo_total = torchinfo_listing(model)
    rows, uncalled = _rows(model, tracker, opts.depth, listing)
    params = unique_params(model)
    total = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    by_dtype = dtype_bytes(model)
    shared = shared_groups(model)
    param_bytes = sum(r["param_bytes"] for r in by_dtype)
    buffer_bytes = sum(r["buffer_bytes"] for r in by_dtype)

    result.data.update({
        "total_params": total, "trainable_params": trainable, "frozen_params": total - trainable,
        "param_bytes": param_bytes, "buffer_bytes": buffer_bytes, "output_shape": describe(output),
        "shared": shared, "uncalled": uncalled, "torchinfo_total_params": torchinfo_total,
    })
    result.tables.append(_layer_table(rows, opts.depth, "Layers"))
    result.tables.append(Table("bytes_by_dtype", "Parameter and buffer memory by dtype", [
        Column("dtype", "dtype"), Column("params", "params", "count"), Column("param_bytes", "param bytes", "bytes"),
        Column("buffers", "buffer elems", "count"), Column("buffer_bytes", "buffer bytes", "bytes")], by_dtype))
    if shared:
        tie_rows = [{"tensor": g[0], "shared_with": g[1:], "params": _numel(model, g[0])} for g in shared]
        result.tables.append(Table("ties", "Shared parameters (counted once)", [
            Column("tensor", "parameter"), Column("shared_with", "also registered as"), Column("params", "params", "count")],
            tie_rows, show=True))
    result.summary += [
        ("Total params", f"{total:,}"), ("Trainable params", f"{trainable:,}"),
        ("Frozen params", f"{total - trainable:,}"),
        ("Param memory", _hb(param_bytes)), ("Buffer memory", _hb(buffer_bytes)),
        ("Model output", describe(output)),
    ]
    if opts.graph:
        graph, note = model_graph(model, inputs)
        if graph is not None:
            result.artefacts["tb_graph"] = graph
        result.notes.append(note)
    if torchinfo_total is not None and torchinfo_total != total:
        why = (f"it counts each of {len(shared)} shared tensor(s) once per module using it; " if shared else "")
        result.notes.append(f"torchinfo 1.8.0 reports {torchinfo_total:,} params: {why}"
                            f"torchdiag counts each tensor once ({total:,}).")
    other = other_state(model)
    if other:
        count, nbytes = sum(t.numel() for _, t in other), sum(t.numel() * t.element_size() for _, t in other)
        result.data["other_state"] = {"tensors": len(other), "values": count, "bytes": nbytes}
        result.summary.append(("Other state", f"{count:,} values in {len(other)} tensor(s) of the state_dict that are "
                               f"neither parameters nor buffers ({', '.join(k for k, _ in other[:3])}"
                               f"{' …' if len(other) > 3 else ''}: packed or quantized weights), {_hb(nbytes)}"))
    if uncalled:
        top = [n for n in uncalled if not any(n.startswith(u + ".") for u in uncalled)]
        modules = dict(model.named_modules())
        held = sum(any(True for _ in modules[n].parameters()) for n in top if n in modules)
        result.notes.append(f"{len(uncalled)} module(s) never ran in forward: " + ", ".join(top[:10]) +
                            (" …" if len(top) > 10 else "") +
                            (f" ({held} of them hold parameters, still counted)" if held else ""))
    return result


def other_state(model) -> list:
    """(key, tensor) of the state_dict's tensors that are neither parameters nor buffers: a dynamically quantized
    Linear's packed int8 weight and bias (a sweep: summary said 0 params for such a model, and called its packed
    params unused). A state_dict that cannot be made (a module's hook raising) gives none."""
    import torch

    known = {id(t) for t in model.parameters()} | {id(t) for t in model.buffers()}
    out = []
    try:
        state = model.state_dict(keep_vars=True)
    except Exception:   # noqa: BLE001 - an extra line only
        return []
    for key, value in state.items():
        values = value if isinstance(value, (tuple, list)) else [value]
        for i, t in enumerate(values):
            if isinstance(t, torch.Tensor) and id(t) not in known:
                out.append((key if len(values) == 1 else f"{key}[{i}]", t))
    return out


def _layer_table(rows, depth, title) -> Table:
    for r in rows:
        r["_label"] = "  " * (r["depth"] - 1) + r["name"].rsplit(".", 1)[-1] if r["depth"] > 1 else r["name"]
    cols = [Column("_label", "module"), Column("type", "type"), Column("_shape", "output shape"),
            Column("params", "params", "count"), Column("trainable", "trainable")]
    # said where a row is dim (a sweep: the footnote under a table with none)
    note = f"depth ≤ {depth}; params of a module include its submodules" + (
        "; dim rows never ran in forward" if any(r.get("_style") == "dim" for r in rows) else "")
    table = Table("layers", title, cols, rows, note=note, tb_scalars=("params",))
    return table


def _numel(model, name: str) -> int:
    return model.get_parameter(name).numel()


def _hb(n) -> str:
    from ..fmt import human_bytes

    return f"{human_bytes(n)} ({n:,} bytes)"


def model_graph(model, inputs):
    """(the model graph for TensorBoard's Graphs tab as (GraphDef, RunMetadata), a sentence for the
    notes). torch.jit.trace as SummaryWriter.add_graph does it; render/tensorboard.py writes it.
    Never fails the command: an untraceable model gets (None, a plain sentence saying why)."""
    import contextlib
    import io
    import warnings

    import torch

    if inputs.kwargs:
        return None, "model graph not written: add_graph traces positional inputs only and this model takes keyword inputs"
    if any(t.is_meta for _, t in inputs.tensors()):
        return None, "model graph not written: a meta-device model cannot be traced"
    from torch.utils.tensorboard._pytorch_graph import graph

    try:
        # the tracer print()s its error (with tensor values) to stdout: that would break --json
        with leave_no_trace(model), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            model.eval()
            with torch.no_grad():
                traced = graph(model, tuple(inputs.args), False, False)
        return traced, "model graph written (TensorBoard → Graphs)"
    except Exception as exc:
        # "Tracer cannot infer type of {<values>}\n:Dictionary inputs ... Found Tensor and str": the
        # last line says why; the first holds tensor values
        lines = [ln.strip(" :") for ln in str(exc).splitlines() if ln.strip(" :")]
        why = lines[-1] if lines and lines[0].startswith("Tracer cannot infer type") else one_line(exc, 160)
        return None, ("model graph not written: the tracer could not follow this model "
                      f"(dict outputs and non-tensor values defeat it): {why[:160]}")
