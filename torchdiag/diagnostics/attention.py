"""attention: the attention weights of every attention layer, per head, for one forward pass.

Three sources, in eval mode under no_grad:
- every nn.MultiheadAttention: a forward pre-hook asks it for per-head weights
  (need_weights=True, average_attn_weights=False; the caller still gets what it asked for), and
  the MHA fast path is switched off so nn.TransformerEncoderLayer really calls it;
- any other module whose output carries attention weights: a tuple/list element after the first,
  or a dict value whose key mentions "attn"/"attention", that is a 3-D/4-D non-negative tensor
  whose last dimension sums to 1;
- F.scaled_dot_product_attention calls (patched for the run, restored after): the weights
  softmax(q·kᵀ·scale + mask) are recomputed from q and k and credited to the calling module;
- a softmax over the last dimension of 4-D attention scores (N×H×L×S: what ops made, at the same size, from a
  batched matmul q·kᵀ) that the model's own code computes (DeBERTa's disentangled attention, CaiT's talking
  heads: a TorchFunctionMode sees it), or of 3-D ones ((N·H)×L×S, fairseq's layout: FSMT), each row a head of one
  sample (the model alone knows whether samples or heads are outer), credited to the module that called it (not an nn.Softmax inside it);
  once: the module that returns that tensor takes it over, one inside nn.MultiheadAttention or the SDPA
  recomputation is not counted, nor one beside an SDPA call of the same module and shape.
Per head: mean entropy of a query's distribution (nats, and as a fraction of log(keys the query
can see), keys with a weight below e^-90 of the query's largest being masked: exactly 0 after a −inf mask,
~e^-100 after Swin's additive −100; queries seeing one key are left out), mean
max weight, mean weight on the first key (CLS / attention sink) and on the diagonal. Pictures are data
(the weights of the drawn sample, `result.artefacts["heatmaps"]`), drawn and written by
render/attention.py; the captured weights are in `result.artefacts["captures"]`."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.device import wide_float
from ..core.guard import leave_no_trace
from ..core.run import flag, number
from ..core.tracking import ModuleTracker, forward_error
from ..errors import OptionError, UsageError
from ..pictures import MAX_LABELLED, attention_size
from ..results import Column, Result, Table

NEEDS_VALUES = True


@dataclass
class Options:
    tokens: list[str] | None = None
    images: bool = False           # PNG files of the pictures (render/attention.py draws them)
    tb: bool = False
    sample: int = 0
    sdpa: bool = True

    def __post_init__(self):
        if self.tokens is not None:
            if isinstance(self.tokens, str):
                raise OptionError("tokens", "takes a list of labels, one per token position")
            self.tokens = [str(t) for t in self.tokens]
        flag("images", self.images, "torchdiag.render.attention.write_images")
        flag("tb", self.tb, "torchdiag.render.tensorboard.write_result")
        number("sample", self.sample, low=0, integer=True)


@dataclass
class Capture:
    name: str
    type: str
    source: str
    weights: object  # N×H×L×S float32 cpu
    ref: tuple = ()  # (data_ptr, numel) of the model's own tensor, to know it when a module returns it (again)
    folded: bool = False   # a 3-D softmax's (N·H) rows, one head each (Catcher.softmax)


SOFTMAX, SDPA = "softmax", "F.scaled_dot_product_attention"


def _looks_like_attention(t) -> bool:
    import torch

    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() not in (3, 4) or t.numel() == 0:
        return False
    t = t.detach().float()
    if bool((t < -1e-6).any()):
        return False
    return bool(torch.allclose(t.sum(-1), torch.ones(()), atol=1e-3))


def sdpa_weights(q, k, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """softmax(q kᵀ · scale + mask) as F.scaled_dot_product_attention defines it (before dropout)."""
    import torch

    q, k = q.float(), k.float()
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    L, S = q.shape[-2], k.shape[-2]
    s = (1.0 / math.sqrt(q.shape[-1])) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * s
    if is_causal:
        causal = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.float()
    return torch.softmax(scores, dim=-1)


class Catcher:
    def __init__(self, model, opts: Options):
        self.model, self.opts = model, opts
        self.captures: list[Capture] = []
        self.stack: list[tuple[str, object]] = []
        self.starts: list[int] = []        # per frame of the stack: len(captures) when the module was called
        self.pending: dict[int, list] = {}
        self._handles = []
        self._orig_sdpa = None
        self._softmax = None               # the TorchFunctionMode that sees softmax calls
        self.in_sdpa = False
        self.not_scores = None             # softmax outputs of what was no q·kᵀ (_softmax_mode): weakly held

    def __enter__(self):
        import torch
        from torch import nn

        names = {}
        for n, m in self.model.named_modules():
            names.setdefault(id(m), n or "(model)")
        self.names = names
        mha_children = set()
        for m in self.model.modules():
            if isinstance(m, nn.MultiheadAttention):
                mha_children.update(id(c) for c in m.modules())
        for m in {id(x): x for x in self.model.modules()}.values():
            name = names[id(m)]
            self._handles.append(m.register_forward_pre_hook(self._push(name, m), with_kwargs=True))
            if isinstance(m, nn.MultiheadAttention):
                self._handles.append(m.register_forward_hook(self._mha_post(name, m)))
            elif id(m) not in mha_children:
                self._handles.append(m.register_forward_hook(self._generic_post(name, m)))
            else:
                self._handles.append(m.register_forward_hook(self._pop))
        if self.opts.sdpa:
            import torch.nn.functional as F

            self._orig_sdpa = F.scaled_dot_product_attention
            orig = self._orig_sdpa
            catcher = self

            def patched(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
                out = orig(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kw)
                owner = catcher.stack[-1] if catcher.stack else ("(model)", None)
                if not isinstance(owner[1], nn.MultiheadAttention):
                    catcher.in_sdpa = True   # its own softmax is not another capture
                    try:
                        w = sdpa_weights(query.detach(), key.detach(), attn_mask, is_causal, scale,
                                         kw.get("enable_gqa", False))
                    finally:
                        catcher.in_sdpa = False
                    if w.dim() == 3:
                        w = w.unsqueeze(1)
                    if w.dim() == 4:
                        catcher.captures.append(Capture(owner[0], type(owner[1]).__name__ if owner[1] is not None else "",
                                                        SDPA, w.to("cpu", copy=True)))
                return out

            F.scaled_dot_product_attention = patched
        torch.backends.mha.set_fastpath_enabled(False)
        self._softmax = _softmax_mode()(self)
        self._softmax.__enter__()
        return self

    def __exit__(self, *exc):
        if self._softmax is not None:
            mode, self._softmax = self._softmax, None
            mode.__exit__(None, None, None)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._orig_sdpa is not None:
            import torch.nn.functional as F

            F.scaled_dot_product_attention = self._orig_sdpa
            self._orig_sdpa = None
        return False

    def _push(self, name, mod):
        from torch import nn

        def pre(module, args, kwargs):
            self.stack.append((name, module))
            self.starts.append(len(self.captures))
            if isinstance(module, nn.MultiheadAttention):
                args = list(args)
                need = kwargs.get("need_weights", args[4] if len(args) > 4 else True)
                avg = kwargs.get("average_attn_weights", args[6] if len(args) > 6 else True)
                self.pending.setdefault(id(module), []).append((need, avg))
                if len(args) > 4:
                    args[4] = True
                else:
                    kwargs["need_weights"] = True
                if len(args) > 6:
                    args[6] = False
                else:
                    kwargs["average_attn_weights"] = False
                return tuple(args), kwargs
            return None

        return pre

    def _pop(self, module, args, output):
        if self.stack:
            self.stack.pop()
            self.starts.pop()

    def softmax(self, w) -> None:
        """A softmax the model's code computed over the last dimension of a 4-D tensor of attention scores: its
        weights (a copy: the model may change its tensor in place after), credited to the module that called it
        (the attention module, not an nn.Softmax inside it)."""
        import torch
        from torch import nn

        if self.in_sdpa or any(isinstance(m, nn.MultiheadAttention) for _, m in self.stack):
            return
        frames = [f for f in self.stack if not isinstance(f[1], nn.Softmax)] or [("(model)", None)]
        name, mod = frames[-1]
        ref = (w.data_ptr(), w.numel())
        folded = w.dim() == 3   # fairseq's layout (FSMT): samples and heads in one dimension, in an order only the
        w = w.unsqueeze(0) if folded else w   # model knows (sample-outer, or head-outer: torch.cat(q.split(d, -1)))
        self.captures.append(Capture(name, type(mod).__name__ if mod is not None else "", SOFTMAX,
                                     w.detach().to("cpu", torch.float32, copy=True), ref, folded))

    def _returned(self, module, name, t, start: int) -> bool:
        """A module returned attention weights `t`: the softmax capture of that very tensor, made inside its call,
        becomes this module's (one capture, credited as before the softmax source); the same tensor handed up by a
        module around the one that returned it first is that capture already (BERT's BertAttention returns its
        BertSelfAttention's weights, BertModel all of them under output_attentions); else a capture of its own,
        unless `t` is a softmax of what was no q·kᵀ (False: D-FINE's deformable attention returns its sampling
        weights, a softmax of a Linear's output, N×queries×heads×points: a sweep read 300 "heads" of 4 queries)."""
        ref = (t.data_ptr(), t.numel())   # (a view of the same weights: FSMT returns its 3-D softmax viewed 4-D)
        same = [c for c in self.captures[start:] if c.ref == ref]
        if same:
            if same[0].source == SOFTMAX:
                same[0].name, same[0].type, same[0].source = name, type(module).__name__, "module output"
                if same[0].folded:   # the model's own view says which are samples, which heads (3-D: one head)
                    shape = t.shape if t.dim() == 4 else (t.shape[0], 1, *t.shape[1:])
                    same[0].weights, same[0].folded = same[0].weights.reshape(shape), False
            return True
        if self.not_scores is not None and (t in self.not_scores or (t._base is not None and t._base in self.not_scores)):
            return False
        w = t.detach().float()
        self.captures.append(Capture(name, type(module).__name__, "module output",
                                     (w if w.dim() == 4 else w.unsqueeze(1)).to("cpu", copy=True), ref))
        return True

    def _one_per_call(self, start: int) -> None:
        """A module that calls SDPA and computes the same weights with its own softmax (for a picture): one."""
        made = self.captures[start:]
        sdpa = {(c.name, tuple(c.weights.shape)) for c in made if c.source == SDPA}
        if sdpa:
            self.captures[start:] = [c for c in made if not (c.source == SOFTMAX
                                                             and (c.name, tuple(c.weights.shape)) in sdpa)]

    def _mha_post(self, name, mod):
        def post(module, args, output):
            self._pop(module, args, output)
            need, avg = self.pending[id(module)].pop()
            out, w = output
            if w is not None:
                w4 = w.detach() if w.dim() == 4 else w.detach().unsqueeze(0)
                self.captures.append(Capture(name, type(module).__name__, "need_weights=True", w4.float().to("cpu", copy=True)))
                if not need:
                    return out, None
                if avg:
                    return out, w.mean(dim=-3)
            return output

        return post

    def _generic_post(self, name, mod):
        def post(module, args, output):
            start = self.starts[-1] if self.starts else 0
            self._pop(module, args, output)
            cands = []
            if isinstance(output, (tuple, list)):
                cands = list(output[1:])
            elif isinstance(output, dict):
                cands = [v for k, v in output.items() if "attn" in str(k).lower() or "attention" in str(k).lower()]
            self._one_per_call(start)
            for c in cands:
                for t in (c if isinstance(c, (tuple, list)) else [c]):
                    if _looks_like_attention(t) and self._returned(module, name, t, start):
                        return None
            return None

        return post


def _softmax_mode():
    """The TorchFunctionMode of the softmax source: it marks the output of a batched matmul (both operands at
    least 3-D: q·kᵀ) as attention scores, and what ops make from scores at the same size (a scale, a bias, a
    mask, a view, CaiT's talking-heads projection); a softmax over the last dimension of 4-D scores is captured.
    A softmax of anything else (a Linear's output: Deformable DETR's sampling weights, a router, a segmentation
    head's classes) is not attention."""
    import operator

    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils.weak import WeakIdKeyDictionary

    softmaxes = {torch.softmax, torch.nn.functional.softmax, torch.Tensor.softmax, torch.special.softmax}
    matmuls = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.Tensor.bmm,
               torch.einsum, torch.baddbmm, torch.Tensor.baddbmm}

    def tensors(args, kwargs):
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor):
                yield a
            elif isinstance(a, (list, tuple)):
                yield from (t for t in a if isinstance(t, torch.Tensor))

    def last_dim(args, kwargs, ndim: int) -> bool:
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        try:
            return operator.index(dim) % ndim == ndim - 1
        except TypeError:
            return False

    class Softmaxes(TorchFunctionMode):
        def __init__(self, catcher):
            super().__init__()
            self.catcher, self.scores = catcher, WeakIdKeyDictionary()
            catcher.not_scores = WeakIdKeyDictionary()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if not isinstance(out, torch.Tensor) or not out.is_floating_point():
                return out
            if func in softmaxes:
                if out.dim() in (3, 4) and out.shape[-1] > 1 and args and args[0] in self.scores \
                        and last_dim(args, kwargs, out.dim()):
                    self.catcher.softmax(out)
                elif not (args and args[0] in self.scores):   # no attention, should a module return it
                    self.catcher.not_scores[out] = True
            elif func in matmuls:
                if out.dim() >= 3 and all(t.dim() >= 3 for t in tensors(args, kwargs)):
                    self.scores[out] = True
            elif any(t in self.scores and t.numel() == out.numel() for t in tensors(args, kwargs)):
                self.scores[out] = True
            return out

    return Softmaxes


MASKED = math.exp(-90)   # a weight below this × its query's largest: a masked key (−inf → 0; Swin's −100 → e^-100);
                         # a trained head's logits rarely spread over 90 nats, a masked key's over 100 or more


def head_stats(w) -> list[dict]:
    """w: N×H×L×S. Per head, averaged over batch and queries."""
    import torch

    wide = wide_float(w.device)   # float32 on mps (no float64 there): MASKED is under its smallest normal
    p = w.to(wide).clamp_min(0)
    S = p.shape[-1]
    ent = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)            # N×H×L
    # a query's largest possible entropy is log(keys it can see): masked keys (causal, padding) get 0 weight
    # (or ~e^-100 under an additive mask), so a uniform causal head reads 100%, not log(i+1)/log(S)
    visible = (p > p.amax(-1, keepdim=True) * max(MASKED, torch.finfo(wide).tiny)).sum(-1)   # N×H×L
    frac = ent / torch.log(visible.clamp_min(2).to(wide))
    counted = visible >= 2
    rows = []
    L = p.shape[-2]
    for h in range(p.shape[1]):
        ph = p[:, h]
        diag = (ph.diagonal(dim1=-2, dim2=-1).mean().item() if L == S else None)
        e = float(ent[:, h].mean())
        ch = counted[:, h]
        ef = float(frac[:, h][ch].mean()) if bool(ch.any()) else 0.0
        rows.append({"head": h, "entropy": e, "entropy_fraction": ef,
                     "max_weight": float(ph.max(-1).values.mean()), "first_key": float(ph[..., 0].mean()),
                     "diagonal": diag})
    return rows


def run(model, inputs, opts: Options, ctx) -> Result:
    import torch

    result = Result("attention", header={"mode": "eval, no grad (one forward pass); MHA fast path off"})
    catcher = Catcher(model, opts)
    tracker = ModuleTracker(model, record_shapes=False)
    with leave_no_trace(model):
        model.eval()
        with torch.no_grad():
            try:
                with catcher, tracker:
                    inputs.call(model)
            except UsageError:
                raise
            except Exception as exc:
                raise forward_error(exc, tracker) from exc
    if not catcher.captures:
        raise UsageError("no attention weights found: no nn.MultiheadAttention, no module returning attention weights, "
                         "no F.scaled_dot_product_attention call and no softmax over 4-D (N×H×L×S) or 3-D ((N·H)×L×S) "
                         "attention scores ran in forward",
                         hint="point MODEL_SPEC at a model with attention layers")
    counts: dict[str, int] = {}
    layers, heads = [], []
    for cap in catcher.captures:
        counts[cap.name] = counts.get(cap.name, 0) + 1
        key = cap.name if counts[cap.name] == 1 else f"{cap.name}#{counts[cap.name]}"
        cap.key = key
        n, h, L, S = cap.weights.shape
        layers.append({"layer": key, "type": cap.type, "source": cap.source, "heads": h, "queries": L, "keys": S,
                       "batch": n, "row_sum_error": float((cap.weights.to(wide_float(cap.weights.device)).sum(-1) - 1).abs().max())})
        for r in head_stats(cap.weights):
            heads.append({"layer": key, **r})
    result.tables.append(Table("layers", "Attention layers", [
        Column("layer", "layer"), Column("type", "type"), Column("source", "weights from"), Column("heads", "heads", "int"),
        Column("queries", "queries", "int"), Column("keys", "keys", "int")], layers))
    result.tables.append(Table("heads", "Per head (mean over batch and queries)", [
        Column("layer", "layer"), Column("head", "head", "int"), Column("entropy", "entropy (nats)", "float"),
        Column("entropy_fraction", "entropy / log(visible keys)", "pct"), Column("max_weight", "max weight", "float"),
        Column("first_key", "on first key", "float"), Column("diagonal", "on diagonal", "float")], heads,
        note="entropy near 100% = uniform over the keys a query can see (masked keys excluded); a high 'on first key' = a CLS/sink head; high 'on diagonal' = attends to itself"))
    _check_against(catcher.captures, opts)
    result.data["images"] = _pictures(result, catcher.captures, opts)
    folded = [c.key for c in catcher.captures if c.folded]
    if folded and (inputs.batch_size or 1) > 1:
        result.notes.append(f"{', '.join(folded)}: scores with samples and heads folded into one dimension "
                            "((N·H)×L×S): each row is shown as a head of one sample, in the model's order (samples "
                            "outer, or heads outer); the model alone knows which")
    result.data["attention_layers"] = len(layers)
    result.summary.append(("Attention layers", f"{len(layers)} ({sum(row['heads'] for row in layers)} heads)"))
    result.artefacts["captures"] = catcher.captures
    result.artefacts["sample"] = opts.sample
    return result


def _check_against(captures, opts: Options) -> None:
    """--tokens and --sample against the shapes the forward pass gave."""
    first = captures[0].weights
    if opts.tokens is not None and len(opts.tokens) not in (first.shape[-1], first.shape[-2]):
        raise OptionError("tokens", f"gave {len(opts.tokens)} labels but the attention has {first.shape[-2]} queries "
                          f"and {first.shape[-1]} keys", hint="give one label per token position")
    if opts.sample >= first.shape[0]:
        raise OptionError("sample", f"{opts.sample} is out of range: batch size {first.shape[0]}")


def _pictures(result, captures, opts: Options) -> list[dict]:
    """One heatmap per layer, described for render/attention.py (which draws it, for TensorBoard and/or
    PNG files): the sample's H×L×S weights; the entries give each picture's size."""
    if not (opts.images or opts.tb):
        return []
    if opts.tokens is not None:
        long = [c.key for c in captures if max(c.weights.shape[-2:]) > MAX_LABELLED]
        if long:
            result.notes.append(f"token labels are drawn up to {MAX_LABELLED} tokens; unlabelled: {', '.join(long)}")
    result.artefacts.update(heatmaps=[(cap.key, cap.weights[opts.sample].numpy()) for cap in captures],
                            tokens=opts.tokens, tb=opts.tb, images=opts.images)
    return [dict(zip(("layer", "height", "width"), (cap.key, *attention_size(cap.weights.shape[1])))) for cap in captures]
