"""`LiveTensors`, the TorchDispatchMode behind core/memtrack.py (see its docstring). A module of its own
so that importing memtrack needs no torch: this one is imported when a tracker is made."""
from __future__ import annotations

import weakref
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .memtrack import CATEGORIES, ModuleStats, Record, storages


class LiveTensors(TorchDispatchMode):
    def __init__(self, round_to: int = 1, resizable: bool = False):
        super().__init__()
        self.round_to = max(1, int(round_to))
        # storages resized in place (FSDP frees and re-allocates its unsharded parameters with
        # untyped_storage().resize_, which no op reports): re-read every size at every op
        self.resizable = resizable
        self.records: dict[int, Record] = {}
        self._refs: dict[int, weakref.ref] = {}
        self.by_cat: dict[str, int] = defaultdict(int)
        self.current = 0
        self.peak = 0
        self.peak_phase = "setup"
        self.peak_modules: tuple[str, ...] = ()
        self.peak_by_cat: dict[str, int] = {}
        self.phase_peak: dict[str, int] = {}
        self.phase_peak_by_cat: dict[str, dict[str, int]] = {}
        self.phase = "setup"
        self.fw_stack: list[str] = []
        self.bw_active: dict[str, int] = defaultdict(int)
        self.modules: dict[str, ModuleStats] = {}
        self._handles: list = []
        self._fw_before: list[int] = []
        self._fw_nodes: list[dict] = []   # per open forward: id() -> grad_fn of its inputs that carry a gradient

    # ---- bookkeeping -------------------------------------------------------------
    def _size(self, st) -> int:
        n = int(st.nbytes())
        r = self.round_to
        return n if r == 1 or n == 0 else -(-n // r) * r

    def register(self, tensor, category: str) -> None:
        """Put a tensor's storage on the books under `category` (or move it there)."""
        for st in storages(tensor):
            key = st._cdata
            rec = self.records.get(key)
            if rec is None:
                self._add(st, category)
            elif rec.category != category:
                self.by_cat[rec.category] -= rec.nbytes
                rec.category = category
                self.by_cat[category] += rec.nbytes

    def recategorize(self, tensor, category: str, only_from: tuple[str, ...] = ("temporaries",)) -> None:
        for st in storages(tensor):
            rec = self.records.get(st._cdata)
            if rec is None:
                self._add(st, category)
            elif rec.category in only_from:
                self.by_cat[rec.category] -= rec.nbytes
                rec.category = category
                self.by_cat[category] += rec.nbytes

    def _add(self, st, category: str) -> None:
        key = st._cdata
        n = self._size(st)
        module = self.fw_stack[-1] if self.fw_stack else None
        self.records[key] = Record(n, category, module, self.phase)
        self.by_cat[category] += n
        self.current += n
        try:
            self._refs[key] = weakref.ref(st, lambda _r, k=key: self._free(k))
        except TypeError:  # storage not weak-referenceable: counted until the end
            pass
        self._update_peaks()

    def _free(self, key: int) -> None:
        rec = self.records.pop(key, None)
        self._refs.pop(key, None)
        if rec is not None:
            self.current -= rec.nbytes
            self.by_cat[rec.category] -= rec.nbytes

    def _update_peaks(self) -> None:
        cur = self.current
        if cur > self.peak:
            self.peak = cur
            self.peak_phase = self.phase
            self.peak_by_cat = dict(self.by_cat)
            self.peak_modules = tuple(self.fw_stack) if self.phase == "forward" else tuple(self.bw_active)
        if cur > self.phase_peak.get(self.phase, -1):
            self.phase_peak[self.phase] = cur
            self.phase_peak_by_cat[self.phase] = dict(self.by_cat)
        for name in self.fw_stack:
            st = self.modules[name]
            if cur > st.fw_peak:
                st.fw_peak = cur
        for name in self.bw_active:
            st = self.modules[name]
            if cur > st.bw_peak:
                st.bw_peak = cur

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self._update_peaks()

    # ---- dispatch ----------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.resizable:
            self._resync()
        out = func(*args, **kwargs)
        # resizable: also what the op wrote into (out= arguments a resize may have re-allocated)
        for t in tree_leaves((out, args, kwargs) if self.resizable else out):
            if isinstance(t, torch.Tensor):
                for st in storages(t):
                    if st._cdata not in self.records:
                        self._add(st, "temporaries")
        if self.resizable:
            self._resync()
        return out

    def _resync(self) -> None:
        """Every recorded storage's bytes as it holds them now (O(live storages): resizable only)."""
        changed = False
        for key, rec in self.records.items():
            ref = self._refs.get(key)
            st = ref() if ref is not None else None
            if st is None:
                continue
            n = self._size(st)
            if n != rec.nbytes:
                self.by_cat[rec.category] += n - rec.nbytes
                self.current += n - rec.nbytes
                rec.nbytes, changed = n, True
        if changed:
            self._update_peaks()

    # ---- autograd: saved tensors and gradients -------------------------------------
    def pack(self, t):
        self.recategorize(t, "activations")
        return t

    @staticmethod
    def unpack(t):
        return t

    def watch_grads(self, params) -> None:
        for p in params:
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._grad_ready))

    def _grad_ready(self, p) -> None:
        if p.grad is not None:
            self.recategorize(p.grad, "gradients", only_from=("temporaries", "activations", "other"))

    # ---- modules -----------------------------------------------------------------
    def watch_modules(self, model) -> None:
        from torch.autograd.graph import register_multi_grad_hook

        names = {}
        for name, mod in model.named_modules():
            names.setdefault(id(mod), name or "(root)")
        for mod in {id(m): m for m in model.modules()}.values():
            name = names[id(mod)]
            self.modules.setdefault(name, ModuleStats(name, type(mod).__name__))

            def pre(m, args, kwargs, name=name):
                stats = self.modules[name]
                stats.calls += 1
                self.fw_stack.append(name)
                self._fw_before.append(self.current)
                stats.fw_peak = max(stats.fw_peak, self.current)
                ts = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor) and a.requires_grad] \
                    if torch.is_grad_enabled() else []
                self._fw_nodes.append({id(a): a.grad_fn for a in ts})
                if ts:
                    self._handles.append(register_multi_grad_hook(ts, lambda _g, n=name: self._bw_exit(n)))

            def post(m, args, output, name=name):
                given: dict = {}
                if self.fw_stack and self.fw_stack[-1] == name:
                    self.fw_stack.pop()
                    before = self._fw_before.pop()
                    given = self._fw_nodes.pop()
                    self.modules[name].fw_delta += self.current - before
                if torch.is_grad_enabled():
                    # an output that is one of its inputs, unchanged (an Identity, drop_path at rate 0: the same
                    # grad_fn), gets its gradient once, and the exit hook on it ran first: entered then, the module
                    # stayed "in backward" to the end (a sweep: pvt_v2_b0's drop_path2). One changed in place
                    # (ReLU(inplace=True)) has a new grad_fn: its backward is its own (a review)
                    ts = [a for a in tree_leaves(output) if isinstance(a, torch.Tensor) and a.requires_grad
                          and not (id(a) in given and a.grad_fn is given[id(a)])]
                    if ts:
                        self._handles.append(register_multi_grad_hook(ts, lambda _g, n=name: self._bw_enter(n)))

            self._handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
            # always_call: a forward that raises (a fast path caught by its caller, a checkpoint's recomputation
            # stopping early) leaves the stack too (a review: its stale entries were named at the peak)
            self._handles.append(mod.register_forward_hook(post, always_call=True))

    def _bw_enter(self, name: str) -> None:
        self.bw_active[name] += 1
        stats = self.modules[name]
        stats.ran_backward = True
        stats.bw_peak = max(stats.bw_peak, self.current)

    def _bw_exit(self, name: str) -> None:
        if self.bw_active.get(name, 0) > 0:
            self.bw_active[name] -= 1
            if not self.bw_active[name]:
                del self.bw_active[name]

    def end_backward(self) -> None:
        self.bw_active.clear()

    def attribute_activations(self) -> None:
        """Call after forward (+ loss): saved-for-backward bytes alive now, per module that
        allocated them (counted for the module and every module around it)."""
        for rec in self.records.values():
            if rec.category != "activations" or rec.module is None:
                continue
            name = rec.module
            while True:
                if name in self.modules:
                    self.modules[name].activation_bytes += rec.nbytes
                if name == "(root)":
                    break
                name = name.rsplit(".", 1)[0] if "." in name else "(root)"

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def snapshot(self) -> dict[str, int]:
        return {c: int(self.by_cat.get(c, 0)) for c in CATEGORIES}
