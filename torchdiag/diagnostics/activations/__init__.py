"""activations: what every module produces in one forward pass (eval mode, no grad).

Per module: output shape, mean, std, min, max, fraction of exact zeros, fraction saturated (for
bounded activations: Sigmoid/Hardsigmoid within `eps` of 0 or 1, Tanh/Softsign within `eps` of
±1, Hardtanh/ReLU6 at their clip values, a clip at 0 being a ReLU's zero; other modules have no saturation and
show "—"). An all-zero output is said at its origin (activation_zeros.py). A module
called several times is pooled over its calls. Statistics are computed in float64 inside the
forward hook, so no output is kept unless a picture of it was asked for.

Pictures (`--layer NAME`, `--images DIR`, `--tb DIR`): a grid of the layer's feature maps for
sample 0 (one tile per channel, on one colour scale), and for conv layers a grid of the filters
(first-layer RGB filters in colour, one tile per output filter; otherwise one gray tile per
(output, input) channel pair). They are data: `result.artefacts["drawings"]` holds what each picture
shows (float planes, the grid, the enlargement) in the order of `result.data["images"]`, whose entries
give the sizes; render/activations.py draws them and writes them."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...core.device import wide_float
from ...core.guard import leave_no_trace
from ...core.run import flag, number
from ...core.tracking import (
    ForwardHooks,
    ModuleTracker,
    first_tensor,
    forward_error,
    nested_shape,
)
from ...errors import UsageError
from ...pictures import grid_figure_size, tile_scale
from ...results import Column, Result, Table
from .fresh_stats import with_batch_statistics
from .zeros import (
    DEAD,
    detached,
    origins,
    reached,
    reads_input,
    zero_gate,
    zero_parameters,
)

MAX_MAPS = 64          # feature-map tiles per layer
MAX_FILTER_TILES = 256
HIST_SAMPLES = 200_000  # values per module kept for TensorBoard histograms
NEEDS_VALUES = True


@dataclass
class Options:
    layers: list[str] = field(default_factory=list)
    images: bool = False           # PNG files of the pictures (render/activations.py draws them)
    tb: bool = False               # also fill result.histograms / result.images
    eps: float = 0.01              # saturation margin
    depth: int = 100

    def __post_init__(self):
        self.layers = [self.layers] if isinstance(self.layers, str) else list(self.layers or [])
        flag("images", self.images, "torchdiag.render.activations.write_images")
        flag("tb", self.tb, "torchdiag.render.tensorboard.write_result")
        number("eps", self.eps, low=0, high=0.5)
        number("depth", self.depth, low=0, integer=True)


@dataclass
class Stats:
    name: str
    type: str
    shape: str = ""
    dtype: str = ""
    calls: int = 0
    n: int = 0
    total: float = 0.0
    total_sq: float = 0.0
    lo: float = math.inf
    hi: float = -math.inf
    zeros: int = 0
    saturated: int | None = None
    nonfinite: int = 0
    nan: int = 0
    values: list = field(default_factory=list)


def saturation_bounds(module, eps: float):
    """(low, high) thresholds for a bounded activation, or None. A value ≤ low or ≥ high is saturated."""
    from torch import nn

    if isinstance(module, (nn.Sigmoid, nn.Hardsigmoid)):
        return eps, 1 - eps
    if isinstance(module, (nn.Tanh, nn.Softsign)):
        return -1 + eps, 1 - eps
    # a lower clip at 0 is a ReLU's zero, counted under zeros (half of ReLU6's outputs are 0 in a healthy
    # MobileNetV2: a sweep found every one of its 51 ReLU6 called 50% saturated)
    if isinstance(module, nn.Hardtanh):   # ReLU6 too
        return (-math.inf if module.min_val == 0 else module.min_val), module.max_val
    return None


class Recorder(ForwardHooks):
    """A forward hook on every module: running statistics of its first floating output. A pre-hook reads, before
    the forward (an in-place ReLU overwrites its input), whether the call's floating inputs were zero."""

    pre_kwargs = True

    def __init__(self, model, opts: Options, keep: set[str]):
        super().__init__(model)
        self.opts, self.keep = opts, keep
        self.stats: dict[str, Stats] = {}
        self.kept: dict[str, object] = {}   # name -> first output (detached, cpu) for pictures
        self.order: list[str] = []
        self._bounds: dict[int, tuple | None] = {}
        self._inputs: dict[int, list] = {}          # id(module) -> stack of (zeros of its inputs, their count, kwargs)
        self.made_zeros: dict[str, tuple] = {}      # (module, args, kwargs) of its first zero output from non-zero input

    def __enter__(self):
        self._bounds = {id(m): saturation_bounds(m, self.opts.eps) for m in self.model.modules()}
        return super().__enter__()

    def _pre(self, module, args, kwargs):
        import torch
        from torch.utils._pytree import tree_flatten

        floats = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.is_floating_point()
                  and t.numel() and t.device.type != "meta" and not getattr(t, "is_nested", False)]
        zeros = sum((t == 0).sum() for t in floats) if floats else None   # a device scalar: read with the output's
        self._inputs.setdefault(id(module), []).append((zeros, sum(t.numel() for t in floats), kwargs))

    def _post(self, module, args, output):
        import torch

        stack = self._inputs.get(id(module))
        zeros_in, count_in, kwargs = stack.pop() if stack else (None, 0, {})
        name = self.names.get(id(module)) or "(model)"
        bounds = self._bounds.get(id(module))
        t = first_tensor(output)
        if t is None or not t.is_floating_point() or t.device.type == "meta":
            return
        nested = getattr(t, "is_nested", False)   # a fast-path output: no single shape, statistics of its values
        s = self.stats.get(name)
        if s is None:
            shape = nested_shape(t) if nested else "x".join(map(str, t.shape))
            s = self.stats[name] = Stats(name, type(module).__name__, shape, str(t.dtype).replace("torch.", ""))
            self.order.append(name)
        x = t.detach()
        if nested:
            parts = [c.reshape(-1) for c in x.unbind()]
            x = torch.cat(parts) if parts else x.new_zeros(0)
        s.calls += 1
        if x.numel() == 0:
            return
        wide = wide_float(x.device)   # float32 on mps (no float64 there)
        if bool(torch.isfinite(x).all()):
            xf, nf = x.to(wide), 0
        else:
            finite = torch.isfinite(x)
            nf = int((~finite).sum())
            s.nan += int(torch.isnan(x).sum())
            xf = x[finite].to(wide)
        s.nonfinite += nf
        s.n += xf.numel()
        parts = [(x == 0).sum().to(wide)]
        if xf.numel():
            parts += [xf.sum(), (xf * xf).sum(), xf.min(), xf.max()]
        if bounds is not None:
            lo, hi = bounds
            parts.append(((xf <= lo) | (xf >= hi)).sum().to(wide))
        if zeros_in is not None:
            parts.append(zeros_in.to(x.device, wide))
        vals = torch.stack(parts).tolist()   # one device→host transfer per call
        came_zero = zeros_in is not None and vals.pop() >= DEAD * count_in
        s.zeros += int(vals[0])
        if xf.numel():
            s.total += vals[1]
            s.total_sq += vals[2]
            s.lo = min(s.lo, vals[3])
            s.hi = max(s.hi, vals[4])
        if bounds is not None:
            s.saturated = (s.saturated or 0) + int(vals[-1])
        # a zero output made here, from inputs that were not zero: asked later where its zeros come from
        if vals[0] >= DEAD * x.numel() and not came_zero and name not in self.made_zeros:
            self.made_zeros[name] = (module, detached(args), detached(kwargs))
        if self.opts.tb and len(s.values) == 0 and xf.numel():
            flat = xf.flatten()
            step = max(1, flat.numel() // HIST_SAMPLES)
            s.values.append(flat[::step].to("cpu", torch.float32, copy=True).numpy())
        if name in self.keep and name not in self.kept and not nested:
            self.kept[name] = x.detach().to("cpu", torch.float32, copy=True)   # an in-place op after it (ReLU) must not change it


def _resolve_layers(model, names: list[str]) -> list[str]:
    import difflib

    known = dict(model.named_modules())
    out = []
    for n in names:
        if n not in known:
            close = difflib.get_close_matches(n, [k for k in known if k], n=3, cutoff=0.5)
            raise UsageError(f"no module named '{n}' in the model",
                             hint=(f"did you mean {', '.join(close)}? " if close else "") +
                             "module names are the paths printed by `torchdiag summary` (e.g. features.0)")
        out.append(n)
    return out


def default_layers(model) -> list[str]:
    from torch import nn

    return [n for n, m in model.named_modules() if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d))][:16]


def row_of(s: Stats) -> dict:
    n = s.n
    mean = s.total / n if n else None
    var = max(s.total_sq / n - mean * mean, 0.0) if n else None
    count = n + s.nonfinite
    return {
        "name": s.name, "type": s.type, "shape": s.shape, "dtype": s.dtype, "calls": s.calls,
        "mean": mean, "std": math.sqrt(var) if var is not None else None,
        "min": s.lo if n else None, "max": s.hi if n else None,
        "zero_fraction": s.zeros / count if count else None,
        "saturated_fraction": (s.saturated / count if count else None) if s.saturated is not None else None,
        "nonfinite": s.nonfinite, "nan": s.nan, "elements": count,
    }


def feature_map_planes(t) -> tuple[list, int]:
    """What the picture of one layer output (sample 0) shows, as float arrays: 4-D → one plane per channel
    (≤ MAX_MAPS), 5-D → middle depth slice per channel, 3-D → one tokens×features plane, 2-D →
    batch×features; (planes, channels)."""
    x = t.numpy()
    if x.ndim == 5:
        x = x[:, :, x.shape[2] // 2]
    if x.ndim == 4:
        return list(x[0][:MAX_MAPS]), x.shape[1]
    if x.ndim == 3:
        return [x[0]], 1
    if x.ndim == 2:
        return [x], 1
    if x.ndim == 1:
        return [x[None, :]], 1
    return [], 0


def filter_planes(weight) -> tuple[list, int | None, str]:
    """Conv filters as values in [0, 1] (w / 2·max|w| + 0.5: whole-tensor symmetric scaling so tiles
    compare): out×3×k×k → one k×k×3 colour plane per output filter; out×1×k×k (grayscale input,
    depthwise) → one gray plane per filter in a square grid; otherwise gray planes per (out, in) pair,
    one row per output filter (≤ 16 input channels, ≤ 256 tiles). (planes, columns or None, rgb|gray,
    max|w|: the weight that 0 and 1 stand for is ∓ it)."""
    np = __import__("numpy")
    w = weight.detach().float().cpu().numpy()
    if w.ndim == 5:
        w = w[:, :, w.shape[2] // 2]
    if w.ndim == 3:  # conv1d: out×in×k → out×in×1×k
        w = w[:, :, None, :]
    out_c, in_c = w.shape[:2]
    m = float(np.abs(w).max()) or 1.0
    if in_c == 3:
        return [w[o].transpose(1, 2, 0) / (2 * m) + 0.5 for o in range(min(out_c, MAX_FILTER_TILES))], None, "rgb", m
    if in_c == 1:  # grayscale first layer or depthwise conv: one tile per filter, square grid
        return [w[o, 0] / (2 * m) + 0.5 for o in range(min(out_c, MAX_FILTER_TILES))], None, "gray", m
    cols = min(in_c, 16)
    rows = max(1, min(out_c, MAX_FILTER_TILES // cols))
    return [w[o, i] / (2 * m) + 0.5 for o in range(rows) for i in range(cols)], cols, "gray", m


def run(model, inputs, opts: Options, ctx) -> Result:
    import torch

    result = Result("activations", header={"mode": "eval, no grad (one forward pass)"})
    pictures = opts.images or opts.tb
    layers = _resolve_layers(model, opts.layers) if opts.layers else (default_layers(model) if pictures else [])
    keep = set(layers)
    tracker = ModuleTracker(model, record_shapes=False)
    rec = Recorder(model, opts, keep)
    with leave_no_trace(model):
        model.eval()
        with torch.no_grad(), ctx.autocast(), tracker, rec:   # --amp: outputs in the dtype training sees
            try:
                inputs.call(model)
            except Exception as exc:
                raise forward_error(exc, tracker) from exc

    rows = [row_of(rec.stats[n]) for n in rec.order]
    for r in rows:
        r["_label"] = r["name"]
        if r["nonfinite"]:
            r["_style"] = "red"
    _findings(result, rows, opts, rec, lambda names: reached(model, inputs, names, ctx),
              lambda: ctx.fills(training=False),   # its pass runs in eval mode
              lambda names: with_batch_statistics(model, inputs, names, opts, ctx))
    cols = [Column("_label", "module"), Column("type", "type"), Column("shape", "output shape"),
            Column("mean", "mean", "float"), Column("std", "std", "float"), Column("min", "min", "float"),
            Column("max", "max", "float"), Column("zero_fraction", "zeros", "pct"),
            Column("saturated_fraction", "saturated", "pct")]
    result.tables.append(Table("modules", "Module outputs (execution order)", cols, rows,
                               note=f"zeros: exact 0.0; saturated: bounded activations within {opts.eps} of their limits "
                                    "(Sigmoid, Tanh, Softsign, Hardtanh, ReLU6; a clip at 0 counts as a zero); "
                                    "— = not a bounded activation"))
    result.data["modules_recorded"] = len(rows)
    result.data["eps"] = opts.eps
    if opts.tb:
        for n in rec.order:
            vals = rec.stats[n].values
            if vals:
                result.histograms[f"activations/{n}"] = vals[0]

    drawn = []
    if pictures:   # drawn by render/activations.py: for TensorBoard (tb) and/or PNG files (images)
        result.artefacts.update(drawings=[], tb=opts.tb, images=opts.images)
    for name in layers if pictures else []:
        if name not in rec.kept:
            result.notes.append(f"layer {name} did not run in forward (or gave no float tensor): no picture")
            continue
        drawn += _pictures(model, name, rec.kept[name], result)
    result.data["layers"] = layers
    result.data["images"] = drawn
    if layers and not pictures:
        result.notes.append("pass --images DIR (or --tb DIR) to write feature-map and filter pictures"
                            if ctx.spec.caller == "cli" else
                            "pass images=True (or tb=True) to draw feature-map and filter pictures")
    result.summary.append(("Modules recorded", str(len(rows))))
    return result


def _picture(layer: str, suffix: str, kind: str, planes: list, cols, scale: int, entry: dict,
             **facts) -> tuple[dict, dict]:
    """One picture described for render/activations.py (which draws it) and its entry in data["images"],
    with the size it will have: tiles of the planes enlarged `scale` times in a grid of `cols` columns,
    labelled and framed (pictures.grid_figure_size). `facts`: what the picture's words say (caption,
    tile labels, the weight scale of filters)."""
    h, w = planes[0].shape[:2]
    height, width = grid_figure_size(len(planes), h * scale, w * scale, cols, colorbar=kind != "rgb")
    drawing = {"layer": layer, "suffix": suffix, "kind": kind, "planes": planes, "cols": cols, "scale": scale, **facts}
    return drawing, {"layer": layer, "kind": entry.pop("kind", kind), "tiles": len(planes), **entry,
                     "height": height, "width": width}


def _pictures(model, name, output, result) -> list[dict]:
    from torch import nn

    out = []
    planes, channels = feature_map_planes(output)
    if planes:
        h, w = planes[0].shape
        if output.dim() >= 4:
            caption = f"sample 0: {len(planes)} of {channels} channels, {h}×{w} each" if channels > len(planes) \
                else f"sample 0: {channels} channels, {h}×{w} each"
            caption += ", middle depth slice" if output.dim() == 5 else ""
            labels = [f"ch {c}" for c in range(len(planes))]
        else:
            caption, labels = f"{'sample 0' if output.dim() == 3 else 'batch'}: {h}×{w} (rows × features)", [""]
        drawing, entry = _picture(name, "features", "feature_maps", planes, None, tile_scale(h, w),
                                  {"channels": channels}, caption=caption, labels=labels)
        result.artefacts["drawings"].append(drawing)
        out.append(entry)
        if channels > len(planes) and output.dim() >= 4:
            result.notes.append(f"{name}: first {len(planes)} of {channels} channels shown")
    mod = model.get_submodule(name)
    if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        fplanes, cols, kind, wmax = filter_planes(mod.weight)
        kh, kw = fplanes[0].shape[:2]
        out_c, in_c = mod.weight.shape[:2]
        shown_out, shown_in = (len(fplanes), in_c) if cols is None else (len(fplanes) // cols, cols)
        drawing, entry = _picture(name, "filters", kind, fplanes, cols, tile_scale(kh, kw, 40), {"kind": f"filters_{kind}"},
                                  caption=_filter_caption(mod.weight.shape, kind, cols, shown_out, shown_in),
                                  labels=[str(o) for o in range(len(fplanes) if cols is None else shown_out)], wmax=wmax)
        if shown_out < out_c or shown_in < in_c:
            result.notes.append(f"{name}: filters of the first {shown_out} of {out_c} output channels"
                                + (f" × first {shown_in} of {in_c} input channels" if shown_in < in_c else "") + " shown")
        result.artefacts["drawings"].append(drawing)
        out.append(entry)
    return out


def _filter_caption(shape, kind: str, cols, shown_out: int, shown_in: int) -> str:
    """What a filter picture shows, in words: how many filters of which size, and how the grid reads."""
    out_c, in_c = shape[:2]
    k = "×".join(map(str, shape[2:]))
    text = (f"{shown_out} of {out_c}" if shown_out < out_c else f"{out_c}") + f" filters of size {k}"
    if kind == "rgb":
        return text + ", the 3 input channels as RGB"
    if cols is not None:
        return text + ", rows: output filter, columns: input channel" + (f" (first {shown_in} of {in_c})" if shown_in < in_c else "")
    return text + ", one input channel each"


def _passed_on(origin: str, passed: list[str], its: str) -> str:
    """The other zero outputs an origin accounts for: its submodules, called inside it (a sweep: XCodec2's
    attention, whose q/k/v projections ran before it returned, were said to pass its zeros on), and the rest."""
    inside = [n for n in passed if origin and n.startswith(origin + ".")]
    rest = [n for n in passed if n not in inside]
    return (f"; {len(inside)} module(s) inside it output zeros too ({_listed(inside)})" if inside else "") + \
        (f"; {len(rest)} module(s) pass {its} zeros on ({_listed(rest)})" if rest else "")


def _findings(result, rows, opts, rec, trains, fills, batch_saturation) -> None:
    for r in rows:
        if r["nonfinite"] and not r["nan"] and fills().only_fills:   # core/fills.py: -inf written as a mask
            result.add("inf-fill", "info", r["name"], f"{r['nonfinite']:,} of {r['elements']:,} output values are "
                       f"±Inf: constants {fills().describe()}, and no op of its forward computed a "
                       "non-finite value: masked positions, by design")
        elif r["nonfinite"]:
            result.add("non-finite-activation", "error", r["name"],
                       f"{r['nonfinite']:,} of {r['elements']:,} output values are NaN or Inf",
                       hint="run `torchdiag nancheck` to find the first module that produced them")
    gated: dict[tuple, list] = {}   # (the origin's type, its gate's names) -> the origins it gates
    found = origins(rows, set(rec.made_zeros))
    asked = {r["name"]: rec.made_zeros[r["name"]] for r, _ in found if r["name"] in rec.made_zeros}
    zero = [f"{n}.{p}" for n, (m, _, _) in asked.items() for p in zero_parameters(m)]
    moved = trains(zero) if zero else set()   # one backward of the model, only when a zero parameter is there
    for r, passed in found:
        module, args, kwargs = asked.get(r["name"], (None, None, None))
        mine = {p for p in zero_parameters(module) if f"{r['name']}.{p}" in moved} if module is not None else set()
        gate = zero_gate(module, args, kwargs, mine) if mine else []
        if gate:
            gated.setdefault((r["type"], tuple(gate), reads_input(args, kwargs)), []).append((r, passed))
            continue
        after = _passed_on(r["name"], passed, "its")
        result.add("dead-activations", "warning", r["name"],
                   f"{r['zero_fraction']:.1%} of the output values are exactly zero{after}",
                   hint="dead ReLUs: check the initialisation, learning rate, or use LeakyReLU/GELU")
    for (kind, gate, reads), found in gated.items():
        names = [r["name"] for r, _ in found]
        passed = [n for _, p in found for n in p]
        which = (f"{len(names)} {kind} modules ({_listed(names)}) output exactly zero because their" if len(names) > 1
                 else f"{found[0][0]['zero_fraction']:.1%} of the output values are exactly zero because its")
        after = _passed_on(names[0] if len(names) == 1 else "", passed, "the")
        result.add("zero-init", "info", names[0] if len(names) == 1 else _common(names),
                   f"{which} {_listed(list(gate))} {'is' if len(gate) == 1 else 'are'} zero at initialisation: a "
                   f"zero-initialised gate, by design. It gets a gradient, so training moves it; drawn at random "
                   f"instead (on a copy), "
                   + ("the same input gives an output that is not zero and follows the input (a residual branch's last "
                      "norm, as in timm's zero-init residual)" if reads else "the output is not zero (the module "
                      "reads no input: a learned table, as Swin's relative position bias)") + after,
                   members=names)
    sat = [r for r in rows if r["name"] != "(model)" and r["saturated_fraction"] is not None
           and r["saturated_fraction"] >= 0.5]
    batch = batch_saturation([r["name"] for r in sat]) if sat else {}
    for r in sat:
        said = f"{r['saturated_fraction']:.1%} of the output values are saturated (within {opts.eps} of the limits)"
        if batch.get(r["name"], 1.0) < 0.5:
            result.add("saturated-activations", "info", r["name"], f"{said} in eval mode only: the model's BatchNorm "
                       "statistics are as initialised (no batch tracked), and with the batch's own statistics "
                       f"{batch[r['name']]:.1%} are; training and a model whose statistics are fitted see the latter")
            continue
        result.add("saturated-activations", "warning", r["name"], said,
                   hint="gradients vanish through saturated units: normalise the inputs or rescale the preceding layer")


def _common(names: list[str]) -> str:
    """The longest dotted path all names start with ("(model)" when none)."""
    parts = [n.split(".") for n in names]
    common = []
    for level in zip(*parts):
        if len(set(level)) > 1:
            break
        common.append(level[0])
    return ".".join(common) or "(model)"


def _listed(names: list[str], most: int = 4) -> str:
    more = f" … (+{len(names) - most} more)" if len(names) > most else ""
    return ", ".join(names[:most]) + more
