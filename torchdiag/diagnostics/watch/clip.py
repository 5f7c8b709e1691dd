"""The gradient norm before clipping. A loop that clips (`torch.nn.utils.clip_grad_norm_`) hands the optimizer
gradients of norm at most max_norm, so the norm watch measures at the step is flat at max_norm and no explosion can
show (a review: AdamW at lr 1.0 clipped at 1, the norm 1.0 at every step). clip_grad_norm_ returns the total norm
before clipping: while watching it is wrapped, and each step's returned norms (device tensors, no sync) go to the
read with the losses. A loop that bound the function by name before watching started (`from torch.nn.utils import
clip_grad_norm_` in the Python API) keeps the original: its norms stay the clipped ones.

A step's norm is taken from the calls only when they tell the whole L2 norm of the gradients it applies (a review
broke the first version five ways): calls since the last backward (a step GradScaler skipped leaves its calls behind),
with the L2 norm, the first call over a parameter counting (measured, then clipped, over the same ones: the first is
the one before clipping), covering every parameter of the step's optimizer that has a gradient (a subset clipped:
the watched norm stays); none over an empty list. A call over more than the optimizer's gradients (one clip over a
model that two optimizers step) gives the optimizer's own part (_part), not the whole. torch >= 2.6's split of it, `get_total_norm` then
`clip_grads_with_norm_`, is read from the first, and clipping by value (`clip_grad_value_`) has the norm
measured before it (torch.nn.utils.get_total_norm; clip_grad_norm_'s own inner call is
not the wrapped one)."""
from __future__ import annotations

import contextlib
import functools
import math
import sys
import types
import warnings
import weakref
from typing import Any, NamedTuple

from .hooks import one_graph

ORIGINAL = "_torchdiag_original"   # on a wrapper: the function it wraps
OWNER = "_torchdiag_owner"         # on a wrapper: its ClipNorms, weakly (closed or gone: a pass-through)


def _record(me: ClipNorms, *args, **kwargs) -> None:
    """`me._saw(...)`, run eagerly where the loop compiles the clipping: traced, its ids of the gradients were guards on
    each gradient's identity, which a new gradient fails at every step (zero_grad sets them to None): dynamo recompiled
    the step to its limit (a review: 3.0 → 7.1 s for 60 steps). A graph that may not break does without it: the norm
    watched there stays the clipped one."""
    import torch

    if not torch.compiler.is_compiling():
        me._saw(*args, **kwargs)
    elif not one_graph():
        if not _EAGER:
            import torch._dynamo

            _EAGER.append(torch._dynamo.disable(ClipNorms._saw, recursive=True))
        _EAGER[0](me, *args, **kwargs)


def _late_now(me: ClipNorms, grads: list) -> bool:
    """ClipNorms.late_now, eagerly only: a compiled clipping is not asked (its gradients' identities would be guards)."""
    import torch

    return not me._closed and not torch.compiler.is_compiling() and me.late_now(grads)


_EAGER: list = []   # ClipNorms._saw under torch._dynamo.disable, made at the first compiled clipping


class ClipNorms:
    """clip_grad_norm_'s (and get_total_norm's) calls since the last step of the clock (taken) or of another
    optimizer (dropped)."""

    def __init__(self, engine):
        self._engine = weakref.ref(engine)
        self._since: list = []      # (norm tensor, ids of the gradient tensors it read, backward count)
        self._installed: list = []  # (module name, attribute, wrapper)
        self._closed = False
        self._placed = False        # a clip asked against a step's gradients and found before the step
        self._unasked = False       # a clip before the clock's gradients were noted (the loop's first clip)
        self.late: list = []        # (clock step, function): clips of the gradients that step had already applied
        self.clipping = False       # any clipping call seen: from then on the clock's steps note their gradients
        self._applied: dict = {}    # the clock's gradients at its last step: id -> (weak reference, version): late_now
        self._applied_step = 0

    def attach(self) -> None:
        import torch.nn.utils as utils
        from torch.nn.utils import clip_grad

        ref = weakref.ref(self)
        original = clip_grad.clip_grad_norm_

        @functools.wraps(original)
        def clip_grad_norm_(parameters, max_norm, norm_type=2.0, *args, **kwargs):
            me = ref()
            if me is None or me._closed:
                return original(parameters, max_norm, norm_type, *args, **kwargs)
            params = [parameters] if _is_tensor(parameters) else list(parameters)
            if not params and isinstance(parameters, types.GeneratorType):   # torch's warning, at the user's line
                warnings.warn("`parameters` is an empty generator, no gradient clipping will occur.", stacklevel=2)
            grads = [p.grad for p in params if getattr(p, "grad", None) is not None]
            # asked before the clip writes them; a max_norm of inf only measures (a review: a norm logged after the
            # step so was "a clipping that never acts")
            late = not (isinstance(max_norm, (int, float)) and math.isinf(max_norm)) and _late_now(me, grads)
            total = original(params, max_norm, norm_type, *args, **kwargs)
            _record(me, total, grads, norm_type, max_norm=max_norm, late=late)
            return total

        self._install(clip_grad_norm_, original, "clip_grad_norm_", (clip_grad, utils))
        total_norm = getattr(utils, "get_total_norm", None)   # torch >= 2.6: clipping split in two (a review)
        if total_norm is not None:
            @functools.wraps(total_norm)
            def get_total_norm(tensors, norm_type=2.0, *args, **kwargs):
                me = ref()
                if me is None or me._closed:
                    return total_norm(tensors, norm_type, *args, **kwargs)
                grads = [tensors] if _is_tensor(tensors) else list(tensors)
                total = total_norm(grads, norm_type, *args, **kwargs)
                _record(me, total, grads, norm_type, max_norm=float("inf"))   # measured, not clipped: a factor of 1
                return total

            self._install(get_total_norm, total_norm, "get_total_norm", (utils,))

        by_value = clip_grad.clip_grad_value_   # clips each element: the norm before it is measured here (a review:

        @functools.wraps(by_value)               # Lightning's gradient_clip_algorithm="value" hid a 90,000 norm)
        def clip_grad_value_(parameters, clip_value, *args, **kwargs):
            me = ref()
            if me is None or me._closed:
                return by_value(parameters, clip_value, *args, **kwargs)
            params = [parameters] if _is_tensor(parameters) else list(parameters)
            grads = [p.grad for p in params if getattr(p, "grad", None) is not None]
            late = _late_now(me, grads)
            with contextlib.suppress(Exception):   # grads on several devices: not measured, the watched norm stays
                each = _norms(grads)
                _record(me, _l2(each), grads, 2.0, each=each, late=late)
            return by_value(params, clip_value, *args, **kwargs)

        self._install(clip_grad_value_, by_value, "clip_grad_value_", (clip_grad, utils))

    def _install(self, wrapper, original, attr: str, modules) -> None:
        setattr(wrapper, ORIGINAL, original)
        setattr(wrapper, OWNER, weakref.ref(self))
        for module in modules:
            if getattr(module, attr, None) is original:
                setattr(module, attr, wrapper)
                self._installed.append((module.__name__, attr, wrapper))

    def _saw(self, total, grads: list, norm_type, max_norm=None, each=None, late: bool = False) -> None:
        """One call: its norm before clipping over `grads`, with what lets a part of it be read where the call covered
        more than one optimizer's gradients: the max_norm it clipped to (clip_grad_norm_; inf where it only measured)
        or each tensor's norm (`each`, clip_grad_value_). A gradient listed twice (tied weights) is multiplied twice by
        clip_grad_norm_: no part is read from such a call (a review)."""
        engine = self._engine()
        ids = frozenset(id(g) for g in grads)
        if engine is None or engine.closed or not ids:
            return
        self.clipping = True
        if late:   # (get_total_norm, which clips nothing, is never asked)
            self.late.append((self._applied_step, "clip_grad_value_" if each is not None else "clip_grad_norm_"))
            return
        if float(norm_type) != 2.0 or getattr(total, "ndim", None) != 0:
            return
        once = len(ids) == len(grads)
        order = [id(g) for g in grads] if each is not None else None
        self._since.append(_Call(total.detach(), ids, engine.backwards, max_norm if once else None,
                                 (order, each) if order else None))
        if self._applied:
            self._placed = True
        else:
            self._unasked = True

    @property
    def seen(self) -> bool:
        """The loop clipped before a step at least once while watched: one clip in its place, or a first clip that
        could not be asked where no clip was late (the first of a loop that clips after each step is late too)."""
        return self._placed or (self._unasked and not self.late)

    def stepped(self, step: int, params) -> None:
        """The clock stepped over `params`: in a loop that clips, their gradients as the step took them (id and
        version), so that a clip of those very tensors, unchanged since, is known to come after the step (_late).
        Called only once the loop has clipped (`clipping`: the engine asks, a steady step's calls stay counted)."""
        if self.clipping:
            self._applied = {id(g): (weakref.ref(g), g._version) for p in params if (g := p.grad) is not None}
            self._applied_step = step

    def late_now(self, grads: list) -> bool:
        """Are `grads`, about to be clipped, all gradients of the clock's last step, every one the same tensor at the
        same version as the step took it? Nothing wrote them since: the step applied them unclipped and the next backward
        replaces them (a sweep: `optimizer.step(); clip_grad_norm_(...)`, the clip never acted, nothing said so)."""
        applied = self._applied
        if not grads or any(id(g) not in applied for g in grads):   # one it clips that the step did not take: it acts
            return False   # (a review: one clip over a GAN, the critic's stale gradients beside the generator's new)
        # the very tensor (an id is reused once its tensor is freed: zero_grad's new gradient had the old one's)
        return all(applied[id(g)][0]() is g and g._version == applied[id(g)][1] for g in grads)

    def close(self) -> None:
        """Put each function back where the wrapper is still the one installed, past any wrapper of a watch closed
        before it (watches closed out of order); a wrapper installed over it later unwraps it when it closes."""
        self._closed, self._since, self._applied = True, [], {}
        for name, attr, wrapper in self._installed:
            module = sys.modules.get(name)
            if module is not None and getattr(module, attr, None) is wrapper:
                setattr(module, attr, live(getattr(wrapper, ORIGINAL)))
        self._installed = []

    def take(self, params, backwards: int, keep_others: bool = False) -> list:
        """An optimizer stepped over `params`: the norms before clipping of its gradients, or [] where the calls do
        not tell the whole norm. Calls over none of its gradients are another's (a review: two models clipped apart,
        the clock's norm read as the two together): dropped, or with `keep_others` (a watched optimizer that is not
        the clock) kept for the clock (a review: the clock clipped, another optimizer stepped, then the clock, and the
        clock's norm was lost). A loop that does not clip costs a list check a step."""
        if not self._since:
            return []
        need = {id(p.grad) for p in params if p.grad is not None}
        own = [v for v in self._since if not v.ids.isdisjoint(need)]
        self._since = self._beyond(need) if keep_others else []
        now = [v for v in own if v.backwards == backwards]
        kept: list = []
        covered: set[int] = set()
        for call in now:
            if call.ids.isdisjoint(covered):
                kept.append(call)
                covered |= call.ids
        if not kept or not need <= covered:
            return []
        if covered == need:
            return [c.total for c in kept]
        return _part(kept, now, params, need)

    def drop(self, params) -> None:
        """An optimizer not watched stepped over `params`: the calls over its gradients alone were its own; one over
        more keeps the rest's part (a review: one clip over both models, the unwatched optimizer stepping first, lost
        the clock's)."""
        self._since = self._beyond({id(p.grad) for p in params if p.grad is not None})

    def _beyond(self, need: set) -> list:
        """The calls that read gradients besides `need`: a call over more keeps the rest's part for the optimizer
        that steps them next."""
        return [v for v in self._since if not v.ids <= need]


class _Call(NamedTuple):
    total: Any            # the norm before clipping it returned (a device tensor)
    ids: frozenset        # ids of the gradient tensors it read
    backwards: int        # the engine's backward count when it was made
    max_norm: Any = None  # clip_grad_norm_: what it clipped to (its factor: _factor)
    each: Any = None      # clip_grad_value_: (ids in order, each one's norm before clipping)


def _part(kept: list, now: list, params, need: set) -> list:
    """The norm before clipping of the optimizer's own gradients (`need`) where calls read more than them (one clip over
    a model that two optimizers step: the whole model's norm is not the clock's; a review). By value, from each tensor's
    norm the call kept; by norm, the clipped gradients' norm now over the product of the factors of every call since the
    backward (each covering all of `need`: a part clipped apart is not known); else [] (the watched norm stays)."""
    import torch

    try:   # gradients on several devices: not read here, the watched norm stays
        if all(c.each is not None for c in kept):
            picked = {i: norm for c in kept for i, norm in zip(c.each[0], c.each[1]) if i in need}   # once each
            return [_l2(torch.stack(list(picked.values())))]
        if not all(c.max_norm is not None and need <= c.ids for c in now):
            return []
        with torch.no_grad():
            factor = torch.stack([_factor(c) for c in now]).prod()
            clipped = _l2(_norms([p.grad for p in params if p.grad is not None]))
            # a factor of 0 (max_norm 0, or a non-finite norm) left nothing to divide: the clipped norm where the
            # call's was finite, else the call's (inf or NaN: what the clip put in every gradient it read)
            whole = kept[0].total.to(clipped.dtype)
            return [torch.where(factor > 0, clipped / factor.clamp_min(1e-30),
                                torch.where(torch.isfinite(whole), clipped, whole))]
    except RuntimeError:
        return []


def _factor(call: _Call):
    """The factor clip_grad_norm_ multiplied its gradients by (torch's own: max_norm / (total + 1e-6), at most 1), on
    the device; a tensor max_norm stays one (float() would be a sync)."""
    import torch

    total = call.total.float()
    return torch.clamp(call.max_norm / (total + 1e-6), max=1.0)


def _norms(grads: list):
    """Each tensor's L2 norm, stacked on their device (no sync)."""
    import torch

    with torch.no_grad():
        from .stats import norms32

        return torch.stack([n.float() for n in norms32(grads)])


def _l2(each):
    """The L2 norm of the norms (`_norms`): None for none."""
    import torch

    if each is None or not len(each):
        return None
    with torch.no_grad():
        return torch.linalg.vector_norm(each)


def _is_tensor(x) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def live(fn):
    """`fn`, or what it wraps where it is a wrapper of a watch that has closed (or gone)."""
    while getattr(fn, OWNER, None) is not None:
        owner = getattr(fn, OWNER)()
        if owner is not None and not owner._closed:
            break
        fn = getattr(fn, ORIGINAL)
    return fn


def combined(norms: list[float]) -> float | None:
    """One step's norm before clipping: the norms of disjoint parameter sets clipped apart, as one (L2)."""
    return sum(n * n for n in norms) ** 0.5 if norms else None
