"""flops: FLOPs and MACs per module and per operator, forward and (measured) backward.

Default engine: torch's dispatch-level counter (torch.utils.flop_counter), corrected so the
count does not depend on the device:
- the CPU attention kernel `_scaled_dot_product_flash_attention_for_cpu` (and its backward)
  has no formula upstream, so attention counted 0 on CPU; we give it the SDPA formula;
- attention backward is counted as the math path's four matmuls on every device (the fused
  kernels' recomputation of the scores, which upstream counts, is not counted);
- the fused nn.MultiheadAttention / TransformerEncoderLayer fast path (`_native_multi_head_attention`,
  taken under no_grad) hides the projections; we switch the fast path off while counting;
- nn.LSTM/GRU/RNN on CPU run as one oneDNN kernel (`mkldnn_rnn_layer`, no formula: an LSTM counted
  ~0), on CUDA as one cuDNN kernel (`_cudnn_rnn`, likewise); for models holding an RNN we switch
  those backends off while counting, so the recurrence runs as the per-step matmuls meta counts.
Every op that ran without a formula is listed with its call count. 1 MAC = 2 FLOPs; every
formula counted here is a multiply-add kernel, so MACs = FLOPs / 2.

`--engine fvcore` gives fvcore's traced count for comparison (its "flops" are MACs)."""
from __future__ import annotations

import contextlib
import math
import re
from collections import Counter
from dataclasses import dataclass

from ..core.guard import leave_no_trace
from ..core.run import choice, number
from ..core.tracking import CONTAINERS, forward_error
from ..errors import ModelError, OptionError, UsageError, one_line
from ..results import Column, Result, Table

# Ops that only move or view data: no arithmetic to count.
_REDUCING = re.compile(r"^(index_add_?|index_reduce_?|scatter_add_?|scatter_reduce.*|_scatter_reduce.*)$")
_MOVEMENT = re.compile(
    r"^(view|_unsafe_view|reshape|permute|transpose|t|expand|slice|select|unsqueeze|squeeze|cat|stack|clone|"
    r"copy_?|_to_copy|to|empty.*|zeros.*|ones.*|full.*|fill_?|new_.*|detach|alias|split.*|chunk|unbind|contiguous|"
    r"index.*|gather|scatter.*|embedding|arange|lift_fresh.*|as_strided.*|flatten|unflatten|_reshape_alias|"
    r"masked_fill_?|where|roll|flip|narrow|repeat.*|tril|triu|zero_|set_|resize_|lift|_local_scalar_dense|"
    r"_assert.*|sym_.*|randint|randn|rand|bernoulli_?|native_dropout|dropout|embedding_dense_backward|"
    r"masked_select|nonzero|item|diagonal|movedim|expand_as|view_as|type_as|select_backward|slice_backward|"
    r"detach_|where\..*|split_with_sizes|constant_pad_nd|pad)$")
# (ReLU's backward, threshold_backward, and softmax's are arithmetic per element as their forwards are: "not counted
# by convention" with them, not data movement: a new user's hour)
# Compute-heavy ops: missing a formula here makes a total materially low.
# (`mm` as a word of the name: mm, bmm, addmm, baddbmm, _int_mm, _scaled_mm; the scans cummax and cummin are no
# matrix product, and matched a bare `mm` on Grounding DINO)
_HEAVY = re.compile(r"(conv|(^|_)(add|b|addb|baddb)?mm(_|$)|matmul|linear|einsum|attention|lstm|gru|rnn|_cudnn|mkldnn|tensordot"
                    r"|fft|matrix_exp|matrix_power|linalg_(solve|inv|cholesky|eig|svd|qr|det|lstsq|lu|pinv)|cholesky|"
                    r"^(add)?mv$|^v?dot$)")   # FFTs and matrix functions: compute with no formula (a sweep)
# Interpolation is pointwise arithmetic per output element, not counted by convention (as torch and the published
# tables do not count activations): upsample_bilinear2d matched `linear` above and warned on DPT, PVT, SAM, RAFT.
_INTERPOLATION = re.compile(r"^_?(upsample_|grid_sampler)")


def op_kind(name: str) -> str:
    base = name.split(".")[0]
    if _REDUCING.match(base):   # adds into rows, elementwise arithmetic (a GNN's message passing), not a move
        return "not counted by convention"
    if _MOVEMENT.match(base):
        return "data movement"
    if _HEAVY.search(base) and not _INTERPOLATION.match(base):
        return "COMPUTE: total is low"
    return "not counted by convention"


ENGINES = ("torch", "fvcore")


@dataclass
class Options:
    """flops' own options, validated here (before any model is loaded) for every caller."""

    depth: int = 3
    backward: bool = False      # the loss comes from the run spec (ctx.loss())
    engine: str = "torch"       # torch | fvcore
    top: int = 20

    def __post_init__(self):
        number("depth", self.depth, low=0, integer=True)
        number("top", self.top, low=1, integer=True)
        self.engine = choice("engine", self.engine, ENGINES)
        if self.engine == "fvcore" and self.backward:
            raise OptionError("engine", "fvcore counts the forward pass only",
                              hint="count backward FLOPs with the torch engine, or drop backward")


def _extra_formulas():
    """Formulas torch's counter lacks, so CPU counts equal meta/CUDA counts."""
    import torch
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    extra = {}

    def cpu_flash(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return fc.sdpa_flop_count(query_shape, key_shape, value_shape)

    def attention_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        # The math path's four matmuls (dV, dP, dQ, dK) = 2 × forward. Upstream counts a fifth
        # for the fused kernels' recomputation of the scores; meta and the math backend do not
        # recompute, so counting it would make the number depend on the device.
        return 2 * fc.sdpa_flop_count(query_shape, key_shape, value_shape)

    def grouped_mm(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
        # a mixture of experts' matmul, one group per expert. 2-D x 2-D groups the contraction (G outputs of
        # m x n, k split among them); otherwise every output element is one k-long dot product. Rows past
        # offs[-1] (padding) count too: an upper bound there, since reading offs' values would cost a host sync
        # per call and meta has none
        if len(a_shape) == 2 and len(b_shape) == 2:
            return 2 * a_shape[0] * a_shape[1] * b_shape[1]
        return 2 * math.prod(out_shape) * a_shape[-1]

    def mv(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
        return 2 * a_shape[0] * a_shape[1]   # (m, n) @ (n,): m dot products of length n

    def addmv(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
        return mv(a_shape, b_shape)

    def dot(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
        return 2 * a_shape[0]

    def solve_triangular(a_shape, b_shape, *args, out_shape=None, unitriangular=False, **kwargs) -> int:
        # substitution, per right-hand side: row i takes i-1 multiply-adds and a division (none when the diagonal
        # is ones): n² FLOPs, n(n-1) unitriangular. A gated delta net's chunked scan (OLMo-Hybrid, Qwen3-Next)
        n = a_shape[-1]
        rhs = math.prod(out_shape) // n
        return rhs * n * (n - 1 if unitriangular else n)

    def fft(shape, dims, per_point: float) -> int:
        # FFTW's convention: a complex FFT of n points is 5·n·log2(n) real FLOPs, one of real data half that
        n = math.prod(shape[d] for d in dims) if dims else 1
        return int(math.prod(shape) // max(n, 1) * per_point * n * math.log2(n)) if n > 1 else 0

    def fft_r2c(x_shape, dim, *args, out_shape=None, **kwargs) -> int:
        return fft(x_shape, dim, 2.5)

    def fft_c2c(x_shape, dim, *args, out_shape=None, **kwargs) -> int:
        return fft(x_shape, dim, 5.0)

    def fft_c2r(x_shape, dim, *args, out_shape=None, **kwargs) -> int:
        return fft(out_shape, dim, 2.5)   # n is the real output's length

    # matrix-vector products, dot products and FFTs torch's counter has no formula for (spectral_norm's power
    # iteration, FNet's mixing: "not counted by convention" before, a sweep)
    extra.update({aten.mv: mv, aten.addmv: addmv, aten.dot: dot, aten.vdot: dot,
                  aten._fft_r2c: fft_r2c, aten._fft_c2c: fft_c2c, aten._fft_c2r: fft_c2r,
                  aten.linalg_solve_triangular: solve_triangular})
    def conv_backward(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                      _output_padding, _groups, output_mask, out_shape=None, **kwargs) -> int:
        # the input's gradient and the weight's are each one product over the forward's (input, weight, output)
        # triples: each as many FLOPs as the forward. torch's counts the weight's with every input channel, not those
        # of its group: `groups` times too many (a sweep: a depthwise convolution's backward 64x its closed form)
        return fc.conv_flop_count(x_shape, w_shape, grad_out_shape, transposed) * (bool(output_mask[0]) +
                                                                                  bool(output_mask[1]))

    extra[aten.convolution_backward] = conv_backward
    if hasattr(aten, "_grouped_mm"):
        extra[aten._grouped_mm] = grouped_mm
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        extra[aten._scaled_dot_product_flash_attention_for_cpu] = cpu_flash
    for name in ("_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_flash_attention_backward",
                 "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention_backward"):
        if hasattr(aten, name):
            extra[getattr(aten, name)] = attention_backward
    return extra


def _backward(model, out, loss_rule, counter, ctx) -> None:
    """One backward of ctx.loss() through the model. The loss, its seed and the loss's own backward down to
    the model's outputs are torchdiag's, not the model's: the loss is computed, paused, on detached copies of
    the outputs, and its gradients there fed back into the model's graph, counted. A loss the model returns
    itself (output['loss']) is one of those outputs: its backward is the model's."""
    import torch
    from torch.utils._pytree import tree_map

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise UsageError(f"{ctx.option('backward')}: the model has no trainable parameters")
    pairs = []

    def cut(t):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad:
            pairs.append((t, t.detach().requires_grad_()))
            return pairs[-1][1]
        return t

    counter.paused = True
    try:
        loss = loss_rule(tree_map(cut, out))
        if not loss.requires_grad:
            raise UsageError(f"{ctx.option('backward')}: the loss does not depend on any trainable parameter")
        grads = torch.autograd.grad(loss, [d for _, d in pairs], allow_unused=True) if pairs else ()
        used = [(t, g) for (t, _), g in zip(pairs, grads) if g is not None]
        seed = None if used else torch.ones_like(loss)   # an output the copies missed: the loss's graph as is
    finally:
        counter.paused = False
    if used:
        # from a scalar made of the outputs (its own backward has no counted op): given as the graph's roots, the
        # outputs' gradient hooks never fire, and the tracker charged the last module's backward to no module (a
        # sweep: a Linear head's backward 0, the total right)
        # (paused until the gradient reaches an output: the scalar's own backward, its seed, is torchdiag's)
        def resume(_grad):
            counter.paused = False

        counter.paused = True
        handles = [t.register_hook(resume) for t, _ in used]
        try:
            root = torch.stack([(t * g).sum() for t, g in used]).sum()
            torch.autograd.grad(root, params, allow_unused=True)
        finally:
            counter.paused = False
            for h in handles:
                h.remove()
    else:
        torch.autograd.grad(loss, params, grad_outputs=seed, allow_unused=True)


def _counter():
    """torch's FlopCounterMode that also counts calls of every op it saw (formula or not)."""
    from torch.utils.flop_counter import FlopCounterMode

    class CallCountingFlopCounter(FlopCounterMode):
        def __init__(self):
            super().__init__(display=False, custom_mapping=_extra_formulas())
            self.calls: Counter = Counter()
            self.paused = False   # torchdiag's own ops (the loss, its random target, the backward seed)
            self.value_sized: set[str] = set()   # ops whose output size the input's values set (VALUE_SIZED)

        def _count_flops(self, func_packet, out, args, kwargs):  # private hook, stable since torch 2.1
            if self.paused:
                return out
            self.calls[func_packet] += 1
            name = _op_name(func_packet).split(".")[0]
            if name in VALUE_SIZED or (name == "index" and _bool_index(args)):
                self.value_sized.add("boolean-mask indexing" if name == "index" else name)
            return super()._count_flops(func_packet, out, args, kwargs)

    counter = CallCountingFlopCounter()
    counter.mod_tracker = _forward_only_tracker(type(counter.mod_tracker))()
    return counter


def _bool_index(args) -> bool:
    import torch

    return any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for a in args[1:2] for t in (a or []))


def _forward_only_tracker(base):
    """torch's ModuleTracker, which hooks a module's tensors for the backward only while autograd records. Under
    no_grad a view of a parameter (CaiT's `cls_token.expand(...)` passed to a block) requires grad with no grad_fn,
    and its hook asserts; flops once retried with recording on, which keeps every activation (timm ViT-L in
    pe_video: out of memory)."""
    import torch
    from torch.utils._pytree import tree_flatten

    class ForwardOnly(base):
        def __init__(self):
            super().__init__()
            self._versions: dict[int, list] = {}   # per module, per open call: each input's version at the call
            self._open: dict[str, int] = {}       # backward: per module, its calls whose backward is running

        # torch's tracker keeps a set of names: a module called twice in a row (ALBERT's shared layer group) has its
        # second call's backward closed by the hook that opens its first's, on the same tensor, and its first call's
        # backward went uncounted (a review: 557,056 of 2,228,224). Backward calls are counted per name.
        def _maybe_set_engine_callback(self) -> None:
            if self._has_callback:
                return

            def callback() -> None:
                self.parents, self._open, self._has_callback = {"Global"}, {}, False

            torch.autograd.Variable._execution_engine.queue_callback(callback)
            self._has_callback = True

        def _get_append_fn(self, name, is_bw):
            if not is_bw:
                return super()._get_append_fn(name, is_bw)

            def opened(*_args) -> None:
                self._maybe_set_engine_callback()
                self._open[name] = self._open.get(name, 0) + 1
                self.parents.add(name)
            return opened

        def _get_pop_fn(self, name, is_bw):
            if not is_bw:
                return super()._get_pop_fn(name, is_bw)

            def closed(*_args) -> None:
                left = self._open.get(name, 0) - 1
                if left > 0:
                    self._open[name] = left
                else:
                    self._open.pop(name, None)
                    self.parents.discard(name)
            return closed

        def _fw_pre_hook(self, mod, input):
            if torch.is_grad_enabled():   # to tell an input returned untouched from one written in place
                self._versions.setdefault(id(mod), []).append(
                    {id(t): t._version for t in tree_flatten(input)[0] if isinstance(t, torch.Tensor)})
            return super()._fw_pre_hook(mod, input if torch.is_grad_enabled() else ())

        def _fw_post_hook(self, mod, input, output):
            if not torch.is_grad_enabled():
                return super()._fw_post_hook(mod, input, ())
            ins = [t for t in tree_flatten(input)[0] if isinstance(t, torch.Tensor)]
            stack = self._versions.get(id(mod))
            before = stack.pop() if stack else {}
            # an output that is its input, unwritten (an Identity, an eval Dropout), opens no backward of the module: its
            # input's hook, which would close it, fires first on the same tensor (a sweep: timm's `bn.drop` Identity kept
            # every later backward FLOP, 100% of the convolutions'); one written in place (`x += f(x)`) does (a review)
            same = {id(t) for t in ins if before.get(id(t)) == t._version}
            outs = tuple(t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and id(t) not in same)
            super()._fw_post_hook(mod, input, outs)
            params = [p for p in mod.parameters() if p.requires_grad]
            if params and not any(t.requires_grad for t in ins) and any(t.requires_grad for t in outs):
                # no input gradient ever comes back to close it (a projection of a constant map, xcit's
                # pos_embed): its backward ends with its parameters' gradients (tensor hooks: flops' backward is
                # autograd.grad, which leaves multi-grad hooks on leaves unsupported)
                self._hooks.extend(_closed_by_params(params, self._get_pop_fn(self._get_mod_name(mod), True)))

    return ForwardOnly


def _closed_by_params(params, pop) -> list:
    """Hooks on each parameter's gradient that call `pop` once all of them came (a parameter the backward does not
    reach leaves the module open, as before)."""
    left = [len(params)]

    def fired(_grad):
        left[0] -= 1
        if left[0] == 0:
            pop()

    return [p.register_hook(fired) for p in params]


def _op_name(packet) -> str:
    name = getattr(packet, "__name__", None) or str(packet)
    return str(packet).replace("aten.", "") if "aten." in str(packet) else name


def _module_flops(counts: dict, root_prefix: str) -> dict[str, int]:
    out = {}
    for key, ops in counts.items():
        if key == "Global":
            continue
        name = key[len(root_prefix) + 1:] if key.startswith(root_prefix + ".") else ("" if key == root_prefix else key)
        out[name] = sum(ops.values())
    return out


def _add_containers(model, flops: dict[str, int]) -> None:
    """ModuleList/ModuleDict never run forward themselves: give them their children's sum."""

    for name, mod in reversed(list(model.named_modules())):
        if name and type(mod).__name__ in CONTAINERS and name not in flops:
            flops[name] = sum(flops.get(f"{name}.{child}", 0) for child, _ in mod.named_children())


@contextlib.contextmanager
def _rnn_unfused(model):
    """Run nn.RNNBase modules as their per-step matmuls (what meta does) instead of one fused
    oneDNN/cuDNN kernel that has no FLOP formula. Only the `enabled` switches are touched, and
    only for models that hold an RNN (convolutions keep their fast kernels otherwise)."""
    import torch
    from torch import nn

    C = torch._C
    if not any(isinstance(m, nn.RNNBase) for m in model.modules()) or not hasattr(C, "_set_mkldnn_enabled"):
        yield
        return
    mkldnn, cudnn = C._get_mkldnn_enabled(), C._get_cudnn_enabled()
    C._set_mkldnn_enabled(False)
    C._set_cudnn_enabled(False)
    try:
        yield
    finally:
        C._set_mkldnn_enabled(mkldnn)
        C._set_cudnn_enabled(cudnn)


def _snapshot(counter):
    return {k: dict(v) for k, v in counter.get_flop_counts().items()}, Counter(counter.calls)


NEEDS_VALUES = False   # counts on meta too: shapes are all it needs
# ops whose output size is read from tensor values: the work after them depends on the input's values
# (not .item()/bool(): an input check reads a value without sizing anything, a review)
VALUE_SIZED = {"nonzero", "masked_select", "unique", "_unique2", "unique_consecutive", "repeat_interleave"}


@dataclass
class _Counts:
    """What one counted pass saw: FLOPs per module scope and op, call counts, forward part apart."""

    fwd: dict
    fwd_calls: Counter
    total: dict
    total_calls: Counter
    registry: dict
    loss: str | None = None
    value_sized: tuple = ()   # ops of the pass whose output size its input's values set


# both engines count in eval mode: a train-mode forward (its dropout, a detector's loss heads) can differ
EVAL = "eval (dropout off, BatchNorm on its running statistics)"


def run(model, inputs, opts: Options | None, ctx) -> Result:
    opts = opts or Options()
    if opts.engine == "fvcore":
        return run_fvcore(model, inputs, opts, ctx)
    counts = _count(model, inputs, opts, ctx)
    grad = opts.backward
    result = Result("flops", header={"counter": "torch.utils.flop_counter (dispatch level)",
                                     "convention": "1 MAC = 2 FLOPs; MACs = FLOPs / 2", "mode": EVAL})
    fwd_total = sum(counts.fwd.get("Global", {}).values())
    all_total = sum(counts.total.get("Global", {}).values())
    bwd_total = all_total - fwd_total if grad else None
    if grad:
        result.header["loss"] = counts.loss
    _module_table(result, model, counts, opts, fwd_total)
    _operator_table(result, counts, grad)
    uncounted = _uncounted_table(result, counts)
    result.data.update({
        "engine": "torch", "forward_flops": fwd_total, "forward_macs": fwd_total // 2,
        "backward_flops": bwd_total, "backward_macs": None if bwd_total is None else bwd_total // 2,
        "params": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
    })
    result.summary += [("Forward", f"{_si(fwd_total)}FLOPs = {_si(fwd_total // 2)}MACs ({fwd_total:,} FLOPs)")]
    if grad:
        result.summary.append(("Backward", f"{_si(bwd_total)}FLOPs ({bwd_total:,}); forward+backward {_si(all_total)}FLOPs"))
    n_unc = sum(r["calls"] for r in uncounted)
    result.summary.append(("Not counted", f"{len(uncounted)} op type(s), {n_unc:,} call(s) (table above; "
                                          "elementwise, normalisation and pooling are not counted by convention)"))
    sized = sorted(counts.value_sized)
    if sized:   # a detector's heads run on the proposals that survive: another image gives another count
        # "may": not every such op sizes a counted one (torch_geometric's self-loop filter sizes an edge list that
        # only gathers and scatters read: the count stays 25,600 FLOPs for any edges, a sweep)
        result.notes.append(f"the count may depend on the input's values: {', '.join(sized)} ran, which size what "
                            "follows by what passes (boxes kept, tokens routed); where a counted op (a detector's heads) "
                            "works on what they kept, another input gives another count")
    result.notes.append("published model tables (e.g. torchvision 'GFLOPS') are MACs of conv/matmul/attention at batch 1")
    return result


def _count(model, inputs, opts: Options, ctx) -> _Counts:
    """One forward (and with `backward` one backward of ctx.loss()) under the counter, in eval mode.
    Without `backward` the forward runs under no_grad."""
    import torch

    from ..core.tracking import ModuleTracker

    counter = _counter()
    tracker = ModuleTracker(model, record_shapes=False)
    grad = opts.backward
    loss_rule = ctx.loss() if grad else None
    inputs.keep()   # the copy a forward that writes into its input is re-run from: torchdiag's ops, not the model's
    with leave_no_trace(model):
        model.eval()  # eval: BatchNorm running stats stay as they are, dropout off
        torch.backends.mha.set_fastpath_enabled(False)  # fused MHA hides its projections from counters
        try:
            # --amp: the same matmuls, in the autocast dtype; its casts are listed as uncounted ops
            with _rnn_unfused(model), ctx.autocast(), counter, tracker, torch.set_grad_enabled(grad):
                out = inputs.call(model)
                fwd_counts, fwd_calls = _snapshot(counter)
                if grad:
                    _backward(model, out, loss_rule, counter, ctx)
        except (UsageError, ModelError):
            raise
        except Exception as exc:
            phase = "backward" if grad and tracker.failing is None else "forward"
            raise forward_error(exc, tracker if phase == "forward" else None, phase) from exc
    total_counts, total_calls = _snapshot(counter)
    return _Counts(fwd_counts, fwd_calls, total_counts, total_calls, counter.flop_registry,
                   loss_rule.describe() if grad else None, tuple(counter.value_sized))


def _module_table(result, model, counts: _Counts, opts: Options, fwd_total: int) -> None:
    """Per module, in definition order, to `depth`."""
    grad = opts.backward
    root = type(model).__name__
    fwd_mod = _module_flops(counts.fwd, root)
    all_mod = _module_flops(counts.total, root)
    _add_containers(model, fwd_mod)
    _add_containers(model, all_mod)
    rows = []
    for name, mod in model.named_modules():
        if not name or name.count(".") + 1 > opts.depth:
            continue
        f = fwd_mod.get(name, 0)
        row = {"name": name, "type": type(mod).__name__, "flops": f, "macs": f // 2,
               "share": (f / fwd_total) if fwd_total else 0.0,
               "_label": "  " * name.count(".") + name.rsplit(".", 1)[-1] if "." in name else name}
        if grad:
            row["backward_flops"] = all_mod.get(name, 0) - f
        rows.append(row)
    mod_cols = [Column("_label", "module"), Column("type", "type"), Column("flops", "forward FLOPs", "flops"),
                Column("macs", "forward MACs", "flops"), Column("share", "share", "pct")]
    note = f"depth ≤ {opts.depth}; a module's count includes its submodules"
    if grad:
        mod_cols.append(Column("backward_flops", "backward FLOPs", "flops"))
        top = sum(r["backward_flops"] for r in rows if "." not in r["name"])
        if top > 1.001 * _backward_total(counts):
            # torch's module tracker keeps a module open in backward until its inputs' gradients are done: an encoder
            # whose output a decoder reads runs its backward inside the decoder's (a sweep: T5's decoder 134 M, its own
            # 84 M; the top-level rows summed to 201 M of 151 M)
            note += ("; backward rows overlap: a module's backward also counts what ran while its inputs' gradients "
                     "were still being formed (an encoder read by a decoder, inside the decoder's), so they sum to more "
                     "than the total")
    result.tables.append(Table("modules", "FLOPs per module", mod_cols, rows, note=note,
                               tb_scalars=("macs", "backward_flops") if grad else ("macs",)))


def _backward_total(counts: _Counts) -> int:
    g_all, g_fwd = counts.total.get("Global", {}), counts.fwd.get("Global", {})
    return sum(g_all.values()) - sum(g_fwd.values())


def _operator_table(result, counts: _Counts, grad: bool) -> None:
    fwd_ops = counts.fwd.get("Global", {})
    all_ops = counts.total.get("Global", {})
    op_rows = []
    for packet in set(all_ops) | set(fwd_ops):
        f = fwd_ops.get(packet, 0)
        row = {"op": _op_name(packet), "flops": f, "calls": counts.fwd_calls.get(packet, 0)}
        if grad:
            row["backward_flops"] = all_ops.get(packet, 0) - f
            row["backward_calls"] = counts.total_calls.get(packet, 0) - counts.fwd_calls.get(packet, 0)
        op_rows.append(row)
    op_rows.sort(key=lambda r: -(r["flops"] + r.get("backward_flops", 0)))
    op_cols = [Column("op", "operator"), Column("calls", "calls", "count"), Column("flops", "forward FLOPs", "flops")]
    if grad:
        op_cols += [Column("backward_calls", "bwd calls", "count"), Column("backward_flops", "backward FLOPs", "flops")]
    result.tables.append(Table("operators", "FLOPs per operator", op_cols, op_rows))


def _uncounted_table(result, counts: _Counts) -> list[dict]:
    """Every op that ran without a formula, with its call count; compute-heavy ones are findings."""
    uncounted = []
    for packet, calls in counts.total_calls.items():
        if packet in counts.registry:
            continue
        name = _op_name(packet)
        uncounted.append({"op": name, "calls": calls, "kind": op_kind(name)})
    uncounted.sort(key=lambda r: (not r["kind"].startswith("COMPUTE"), r["kind"], -r["calls"]))
    result.tables.append(Table("uncounted_ops", "Ops that ran without a FLOP formula (counted as 0)", [
        Column("op", "operator"), Column("calls", "calls", "count"), Column("kind", "kind")], uncounted,
        show=bool(uncounted), limit=12))
    for r in uncounted:
        if r["kind"].startswith("COMPUTE"):
            result.add("unsupported-op", "warning", r["op"],
                       f"{r['op']} ran {r['calls']}× with no FLOP formula: the total is low by its cost",
                       hint="please report the op so torchdiag can add a formula")
    return uncounted


def _si(n) -> str:
    from ..fmt import si

    return si(n) + " " if n < 1000 else si(n)


def run_fvcore(model, inputs, opts: Options, ctx) -> Result:
    """fvcore's jit-traced count, labelled honestly: fvcore's "flops" are MACs."""
    import logging
    import warnings

    import torch

    if inputs.kwargs:
        raise UsageError(f"{ctx.option('engine')} fvcore traces positional inputs only; this model takes keyword inputs",
                         hint="use the default engine (torch), which handles keyword inputs")
    with warnings.catch_warnings():   # fvcore's import warns of torch.jit.script's deprecation: its code, not the model
        warnings.simplefilter("ignore")
        from fvcore.nn import FlopCountAnalysis

    result = Result("flops", header={"counter": "fvcore (torch.jit.trace)",
                                     "convention": "fvcore counts one multiply-add as one 'flop': its number is MACs; FLOPs = 2 × MACs",
                                     "mode": EVAL})
    with leave_no_trace(model), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.eval()
        logging.getLogger("fvcore").setLevel(logging.ERROR)
        try:
            with torch.no_grad():
                analysis = FlopCountAnalysis(model, tuple(inputs.args))
                analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
                macs = int(analysis.total())
                by_module = analysis.by_module()
                by_op = analysis.by_operator()
                unsupported = analysis.unsupported_ops()
        except Exception as exc:
            from ..core.tracking import run_forward

            with torch.no_grad():
                run_forward(model, inputs)  # the model's own error → exit 3, naming the module
            raise UsageError(f"fvcore could not trace this model: {one_line(exc)}",
                             hint="the default engine (torch) counts at dispatch level and handles dict outputs, kwargs and control flow") from exc
    rows = []
    for name, mod in model.named_modules():
        if not name or name.count(".") + 1 > opts.depth:
            continue
        m = int(by_module.get(name, 0))
        rows.append({"name": name, "type": type(mod).__name__, "flops": 2 * m, "macs": m,
                     "share": m / macs if macs else 0.0,
                     "_label": "  " * name.count(".") + name.rsplit(".", 1)[-1] if "." in name else name})
    result.tables.append(Table("modules", "FLOPs per module (fvcore)", [
        Column("_label", "module"), Column("type", "type"), Column("flops", "forward FLOPs", "flops"),
        Column("macs", "forward MACs", "flops"), Column("share", "share", "pct")], rows, tb_scalars=("macs",)))
    op_rows = sorted(({"op": k, "flops": 2 * int(v), "macs": int(v), "calls": None} for k, v in by_op.items()),
                     key=lambda r: -r["flops"])
    result.tables.append(Table("operators", "FLOPs per operator (fvcore handle names)", [
        Column("op", "operator"), Column("flops", "forward FLOPs", "flops"), Column("macs", "MACs", "flops")], op_rows))
    unc = [{"op": k, "calls": int(v), "kind": op_kind(k.replace("aten::", ""))} for k, v in sorted(unsupported.items())]
    result.tables.append(Table("uncounted_ops", "Ops fvcore skipped (unsupported)", [
        Column("op", "operator"), Column("calls", "calls", "count"), Column("kind", "kind")], unc, show=bool(unc)))
    for r in unc:
        if r["kind"].startswith("COMPUTE"):
            result.add("unsupported-op", "warning", r["op"], f"fvcore has no handle for {r['op']} ({r['calls']}×): its total is low")
    deprecations = sorted({str(w.message).splitlines()[0][:120] for w in caught
                           if issubclass(w.category, (DeprecationWarning, FutureWarning, UserWarning)) and "jit" in str(w.message).lower()})
    for d in deprecations[:3]:
        result.notes.append(f"fvcore/torch.jit warned: {d}")
    extra = sorted(k for k, v in by_op.items() if v and any(w in k for w in ("norm", "pool", "upsample")))
    if extra:   # said as counted here: its skipped ops (max_pool2d) are in the table below (a sweep: the note said pooling)
        result.notes.append(f"fvcore counts {', '.join(extra)} too, so CNN totals run above published tables")
    result.data.update({"engine": "fvcore", "forward_flops": 2 * macs, "forward_macs": macs,
                        "backward_flops": None, "backward_macs": None})
    result.summary.append(("Forward", f"{_si(2 * macs)}FLOPs = {_si(macs)}MACs (fvcore total {macs:,})"))
    return result
