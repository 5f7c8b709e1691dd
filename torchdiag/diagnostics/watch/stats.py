"""Device-side statistics of `watch`: per optimizer (Track) and per sampled forward (DeadUnits), queued
as tensors and read back together (`read_parts`: one sync per device); `absorb` files the values read."""
from __future__ import annotations

import functools
import math
import random
import weakref

from ...core.device import wide_float

SAMPLE = 256          # elements per parameter sampled for the update/weight ratio
CARRY_PROBES = 4      # parameters per optimizer whose old gradient is looked at in the next backward
OPPOSED = -0.5        # cosine under which the gradient a backward adds pulls against the one already there
CLOCK_STOPPED = 4     # the clock stopped: a model's optimizer took more steps since its last than this many times the
                      # most it took between two of the clock's, and more than 2 x every (engine._stopped)


class Track:
    """One optimizer's parameters. Per step: gradient norms, their total, the first non-finite step per
    parameter. On read steps: a strided sample of each parameter before/after the update (ratio), and
    probes that look at the old gradient when the next backward reaches the parameter (zero_grad)."""

    OWN_LOSSES = 10_000   # steps since the clock's last whose losses are kept for a handover (engine._stopped)

    def __init__(self, opt, opts):
        import torch

        self.adopt(opt)          # its optimizer (weakly), parameters, ids; released: params are stand-ins
        self.first_step = None   # the clock's step when it first stepped; None: its model is not looked for
        self.roots: set[int] = set()   # id() of the watched models that hold its parameters
        self.unfound = 0               # of its trainable parameters, those no watched model holds (engine._searching)
        self.names = [f"param_groups[{gi}][{j}]" for gi, g in enumerate(opt.param_groups) for j in range(len(g["params"]))]
        self.device = self.params[0].device if self.params else torch.device("cpu")
        self.wide = wide_float(self.device)   # float64, float32 on mps (no float64 there)
        self.word_bits = round(-math.log2(torch.finfo(self.wide).eps))   # a reach code's bits a word (52, 23)
        n = len(self.params)
        self.first_bad_dev = torch.full((n,), -1, dtype=torch.long, device=self.device)
        self.first_bad = None          # host: (step, [names]) once a read saw it
        self.every = opts.every
        self.blocks: list = []         # device (every, n) buffers of per-step gradient norms
        self.used = 0                  # rows used in the last block
        self._block_rows: tuple = ()   # the last block's rows, as views
        self.steps: list = []          # the step of each row since the last read
        self.seen_grad = [False] * n   # a gradient was present at some read step
        self.joined = [0] * n          # the read steps sampled before it joined (add_param_group: inherit)
        self.sampled = 0               # read steps it stepped at: none, and seen_grad says nothing
        self.since_clock = 0           # its steps since the clock's last (engine._choose_clock)
        self.own_losses: list = []     # the losses of each of them, up to OWN_LOSSES (engine._stopped)
        self.unclocked = 0             # of those, the ones taken while there was no clock at all
        self.last_clip: list = []      # the norms before clipping of its last step, should it be credited with it
        self.last_step = 0             # the run's step when it last stepped (a parameter two tracks hold: the later's)
        self.rates: tuple[float, float, float] | None = None   # (lowest, highest, last) rate it stepped at
        self.stepped = 0               # its steps, the longest stretch before or between them (the clock's steps),
        self.gap_max = 0               # and the reads since its last step at which a backward had reached its
        self.idle_reads = 0            # parameters (optimizer-idle)
        self.peak_since = 0            # the most steps it took between two of the clock's (report._clock_note)
        self.backward_gave: bool | None = None   # starved at its first steps: did the next backward give them one?
        self.first_before_backward = False   # its first step came before any backward of the run (step, then backward)
        self.last_fed = None           # the last step its gradients' total norm was not 0 (read at reads), and the
        self.unfed_after = 0           # steps it took since with no gradient at all (None or exactly 0)
        self._reached: set | None = None    # id() of the parameters a backward reached, while the hooks are armed
        self.reached: set = set()      # of those, the ones seen at a read since its last step (the finding's names)
        self._reach_handles: list = []
        self.start = None              # device (3, n): each parameter's fingerprint at the first step (_fingerprint)
        self.changed = None            # host: per parameter, did it change over the run (final read)
        self.weight_norm = None        # host: per parameter, at the last read
        self.start_norm = None         # host: per parameter, before the first update (the first read's)
        self.grad_max = [0.0] * n      # host: the largest finite gradient norm each parameter had at any step
        self.lr_max = [0.0] * n        # host: the highest rate of its param group at a read step (inf: unreadable)
        self.before = None             # the samples before the update (read steps), until post_step
        self._views: list = [None] * n # per parameter: (key, sample view or None, float32 buffer) for the ratio
        self._before_views: list = []  # the entries the samples before the update came from
        self._probe_next = False       # arm the zero_grad probes after this step (a read step)
        self._drawn = (0, 0)           # (block of `every` steps, the step in it drawn to be looked after too)
        self.fired: list = []          # the probes' flags since they were armed
        self.fired_at: list = []       # per flag, (outermost optimizer steps, backward calls) when it fired
        self.fired_dots: list = []     # per flag, (old·new, |old|², |new|²) of the gradients (float32 sums, as float64)
        self.fired_who: list = []      # per flag, (id, version, fingerprint, no .grad before) of the probed parameter
        self.fired_after: list = []    # per flag, whether .grad was non-zero once its backward had added to it
        self.kept: dict = {}           # id(parameter) -> (ref, its .grad's direction statistic after the last backward, its storage)
        self.skipped_at = 0            # the backward count at a GradScaler step that skipped this optimizer's
        self.marks = None              # the engine's (steps, backwards) counter (engine._marks), set by it
        self.armed_step = 0
        self.light = False             # the probes armed hold one parameter and read no cosine (_looks_after)
        self.mode_mark = 0             # the engine's root-forward and backward counts at its last step
        self.bw_mark = 0               # (engine._check_mode)
        self.queue: list = []          # (kind, payload, tensor)
        self.probes: list = []
        self._unkept: list = []        # per probed parameter (weakref, its look no accumulation followed, if any)
        self._zero = torch.zeros((), dtype=torch.float32, device=self.device)   # the carry probe's "no gradient"
        self._one = torch.ones((), dtype=torch.float32, device=self.device)
        self._zero3 = torch.zeros(3, dtype=self.wide, device=self.device)
        # (dtypes written out: a script's torch.set_default_dtype(torch.float64) is not ours; a review: index_add_ of
        # float32 counts into a float64 default stopped watch at step 1)
        # on the CPU the device is the host: a one-element flag per step is looked at through a shared
        # numpy view (no op, nothing waits), so a non-finite gradient is known at its own step
        self._flag = torch.zeros(1, dtype=torch.float32) if host_visible(self.device) else None
        self._flag_view = self._flag.numpy() if self._flag is not None else None
        self._slices: dict[int, tuple] = {}
        self._index_key = None
        self._index = None
        self._bits = None              # device (n, c): parameter i's bit in its step's reach code (_reach_codes)

    @property
    def opt(self):
        """The optimizer, or None once the run let it go (held weakly: a track must not keep it alive)."""
        return self._opt()

    def rebind(self, opt) -> None:
        """This track's optimizer is now `opt` (a new one over the same parameters); what the report says of
        it is kept for when it is gone: its type and its first param group (the dict itself, which a schedule
        updates in place: the learning rate it ended with)."""
        self._opt = weakref.ref(opt)
        self.kind = type(opt).__name__
        self.group = opt.param_groups[0] if opt.param_groups else {}

    def release(self) -> None:
        """Its optimizer was let go, and the run may let the model go too (a model per fold): the track keeps what
        the report reads of each parameter (Released) and a weak reference, not the tensor, which would hold the
        model's memory to the end. The end-of-run fingerprint (never-changes) is taken now, while they are here.
        Armed carry probes stay (a successor's first step reads them; the hooks hold nothing but the tensor)."""
        import torch

        if self.released:
            return
        if self.start is not None and self.params:
            with torch.no_grad():
                self.queue.append(("changed", self, (self._fingerprint() != self.start).any(0).float()))
        self.idle_off()
        self.params = [Released(p) for p in self.params]
        self.ids = {id(p): i for i, p in enumerate(self.params)}
        self.lazy, self.lazy_made = {}, False
        self.group = {k: v for k, v in self.group.items() if k != "params"}   # the settings it ended with
        self.main_group = {k: v for k, v in self.main_group.items() if k != "params"}
        self._views, self._before_views, self.before = [None] * len(self.params), [], None
        self.released = True

    def adopt(self, opt) -> None:
        """Its optimizer and its parameters: at the start, and for a successor over the same parameters
        (same_params), which takes the tensors back from a released track."""
        self.rebind(opt)
        self.adopted_at = getattr(self, "stepped", 0)   # its steps when this optimizer took it (optimizer-remade)
        given = [p for g in opt.param_groups for p in g["params"]]
        self.params = [_made(p) for p in given]
        # a lazy module's parameters not made yet: the optimizer's own objects, by index; made later (a branch first
        # called after the first step), they turn into real ones in place and the engine makes a new track (_track)
        self.lazy = {i: p for i, (p, q) in enumerate(zip(given, self.params)) if p is not q}
        self.lazy_made = False   # one of them made since (set at reads: engine._read_step_checks)
        self.ids = {id(p): i for i, p in enumerate(given)}
        self.groups = len(opt.param_groups)   # add_param_group adds one: the engine makes a new track (_regroup)
        self.main = _main_group(opt.param_groups)   # the index of the group whose rate is the run's (lr())
        self.main_group = opt.param_groups[self.main] if opt.param_groups else {}
        self.released = False
        self.retired = False                  # ... and this one ends (its optimizer is listed by the new one)
        self.early = False                    # the samples before the update were taken at the step's start
        self._inherited = None                # (old start, [(new index, old index)]) until the first step's start

    def lr(self) -> float | None:
        """The learning rate of its main group (_main_group), as a schedule sets it now: looked up in the optimizer
        each time, since load_state_dict replaces the group dicts (a review: the series stopped following StepLR)."""
        opt = self.opt
        if opt is not None and self.main < len(opt.param_groups):
            self.main_group = opt.param_groups[self.main]
        return rate(self.main_group.get("lr"))

    def maximizes(self) -> bool:
        """Its main group climbs the loss (`maximize=True`, gradient ascent), as the group says now."""
        self.lr()   # the group dict as the optimizer holds it now
        return bool(self.main_group.get("maximize", False))

    def inherit(self, old) -> None:
        """The counts of the track its optimizer left (add_param_group): one optimizer, its steps counted on."""
        if old is None:
            return
        self.stepped, self.gap_max, self.last_step, self.sampled = old.stepped, old.gap_max, old.last_step, old.sampled
        self.rates = old.rates
        opt = self.opt
        if opt is not None and old.main < len(opt.param_groups):   # the same group's rate on: a larger group added
            self.main, self.main_group = old.main, opt.param_groups[old.main]   # read as a decay 0.01 -> 0.001 (a sweep)
        pairs = [(self.ids[param_key(p)], j) for j, p in enumerate(old.params) if param_key(p) in self.ids]
        self.joined = [old.sampled] * len(self.params)   # the new ones: no read saw them before now
        norms = old.weight_norm
        self.weight_norm = [None] * len(self.params) if norms is not None else None
        for i, j in pairs:   # what the reads saw of the parameters it held (never-gets-grad, the table's columns)
            self.joined[i], self.seen_grad[i], self.grad_max[i] = old.joined[j], old.seen_grad[j], old.grad_max[j]
            self.lr_max[i] = old.lr_max[j]
            if norms is not None:
                self.weight_norm[i] = norms[j]
        if old.start is not None and pairs:
            self._inherited = (old.start, pairs)

    def _take_start(self, start, pairs) -> None:
        """The fingerprints the left track took at its first step, for the parameters it held: never-changes
        compares the run's first step with its last."""
        import torch

        new, old = zip(*pairs)
        taken = start[:, torch.tensor(old, device=start.device)].to(self.start.device)   # the model may have moved
        self.start[:, torch.tensor(new, device=self.start.device)] = taken
        self._inherited = None

    def retire(self) -> None:
        """Its optimizer took more parameters (add_param_group): this track ends as a let-go optimizer's does, and
        holds the optimizer no more (a new track has it)."""
        self.disarm()
        self.release()
        self._opt = _no_optimizer
        self.retired = True

    def stepped_now(self, step: int) -> None:
        self.gap_max = max(self.gap_max, step - self.last_step)   # from the run's start at its first step
        self.stepped += 1
        self.last_step = step
        lr = self.lr()   # the rate it stepped at (the header says where the rate now is another)
        if lr is not None:
            self.rates = (min(self.rates[0], lr), max(self.rates[1], lr), lr) if self.rates else (lr, lr, lr)
        self.idle_reads = 0
        if self.reached:
            self.reached = set()
        if self._reached is not None:
            self.idle_off()

    def idle_read(self, last_read: int, shared) -> None:
        """A read step: has a backward reached its parameters since the last read, while it has not stepped since
        that read? Asked with a hook on each parameter only it holds (`shared`: another live optimizer's too) that a
        backward accumulates into (a leaf), armed only once a read finds it idle, so a stepping optimizer costs
        nothing; a gradient clipped or zeroed in place is not a new one. `shared()` is asked only when arming."""
        if not self.stepped or self.last_step >= last_read:
            if self._reached is not None:
                self.idle_off()
            return
        if self._reached is None:
            reached, others = set(), shared()
            self._reached = reached
            self._reach_handles = [p.register_post_accumulate_grad_hook(functools.partial(_reach, reached))
                                   for p in self.params if p.requires_grad and p.is_leaf and id(p) not in others]
        elif self._reached:
            self.idle_reads += 1
            self.reached |= self._reached
            self._reached.clear()

    def idle_off(self) -> None:
        for h in self._reach_handles:
            h.remove()
        self._reach_handles, self._reached = [], None

    def keys(self) -> set[int]:
        """id() of the parameters it holds. A let-go one's live tensors count while they get no new gradient: a
        body frozen after its optimizer went keeps its old .grad (not a finding); a body still getting gradients
        that nothing steps any more is `not-in-optimizer` (a review)."""
        if not self.released:
            return set(self.ids)
        return {param_key(p) for p in self.params if not p.fresh_grad()}

    def same_params(self, ids: list[int]) -> bool:
        """Does an optimizer over these parameters (id() in order) hold exactly this track's, still alive?"""
        return [param_key(p) for p in self.params] == ids

    def rename(self, names: dict[int, str]):
        self.names = [names.get(id(self.lazy.get(i, p)), self.names[i]) for i, p in enumerate(self.params)]

    def made_since(self) -> bool:
        """A lazy parameter it holds as a stand-in has been made since (its module's first call)."""
        from ...core.lazy import is_uninitialised

        return any(not is_uninitialised(p) for p in self.lazy.values())

    def pre_step(self, step: int, sample: bool, before_update: bool = True):
        """Per step: each parameter's gradient norm into the next row of a device buffer (a foreach norm
        and a stack: two ops; on the CPU a third, the sum the host looks at). Totals, first non-finite steps and
        maxima are made from the rows at the read. The per-step path is kept to those ops and a few list
        passes: on a small model its Python is most of watch's cost."""
        import torch

        if self.probes or self.fired:
            self.disarm(applied_at=step)   # the step whose update the probes' gradients went into
        grads = [p.grad for p in self.params]
        present = [g for g in grads if g is not None]
        if sample:
            self.sampled += 1
            for i, g in enumerate(grads):
                if g is not None:
                    self.seen_grad[i] = True
        grad_mode = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)   # torch.no_grad() without the context manager's cost
        try:
            row = self._row(step)
            self._fill(row, grads, present)
            if self._flag is not None:   # norms are >= 0: their sum is finite iff every one is
                torch.sum(row, 0, keepdim=True, out=self._flag)
            if sample or self.start is None:
                self._sample(step, sample, before_update)
            elif self.early:   # sampled early for a read step that did not come (the count changed hands)
                self.early, self.before = False, None
        finally:
            torch._C._set_grad_enabled(grad_mode)

    def _fill(self, row, grads: list, present: list) -> None:
        """The row: each gradient's norm, 0 where a parameter has none. stack(out=) casts to the row's dtype;
        a gradient on another device (a model moved after its optimizer was built) takes the general path."""
        import torch

        if not present:
            row.zero_()
            return
        norms = norms32(present)
        if len(present) == len(grads):
            try:
                torch.stack(norms, out=row)
                return
            except RuntimeError:
                pass
        idx = [i for i, g in enumerate(grads) if g is not None]
        row.zero_().index_copy_(0, self._indices(idx), torch.stack([n.float().to(self.device) for n in norms]))

    def _sample(self, step: int, sample: bool, before_update: bool) -> None:
        """The first step's fingerprint, and a read step's samples (weights, the update's before-values)."""
        fresh = self.start is None and self.params
        if fresh:
            self.start = self._fingerprint()
        if self._inherited is not None and fresh:
            self._take_start(*self._inherited)
        early, self.early = self.early, False
        if sample and self.params:
            self._group_rates()
            self.queue.append(("weights", (self, step), self.start[0].clone() if fresh else self._norms()))
            self.before = (self.before if early else self._samples_before()) if before_update else None
            self._probe_next = True
        elif early:
            self.before = None

    def _group_rates(self) -> None:
        """Each parameter's group rate, kept at its highest: a group at lr 0 all run is frozen on purpose (a backbone
        given lr 0 was `never-changes` warnings: a sweep). A rate not readable without a sync counts as not 0."""
        opt = self.opt
        rates = [] if opt is None else [rate(g.get("lr")) for g in opt.param_groups for _ in g["params"]]
        if len(rates) == len(self.lr_max):
            self.lr_max = [max(m, math.inf if r is None else r) for m, r in zip(self.lr_max, rates)]

    def sample_early(self) -> None:
        """The samples before the update, taken at the step's start (a step(closure), read at its closure: SAM
        moves the weights before calling it)."""
        import torch

        if self.params:
            with torch.no_grad():
                self.before = self._samples_before()
            self.early = True

    def looks_on_host(self) -> bool:
        """Whether this optimizer's per-step flag is looked at on the host (stats.host_visible: the CPU)."""
        return self._flag_view is not None

    def nonfinite_now(self) -> bool:
        """On the CPU: did this step's gradients hold a NaN/Inf (the flag written by pre_step)? False elsewhere."""
        return self._flag_view is not None and not math.isfinite(float(self._flag_view[0]))

    def _row(self, step: int):
        """The next free row of the per-step buffer (a new block of `every` rows when the last is full)."""
        if not self.blocks or self.used == self.blocks[-1].shape[0]:
            import torch

            self.blocks.append(torch.empty((self.every, len(self.params)), dtype=torch.float32, device=self.device))
            self._block_rows = self.blocks[-1].unbind(0)   # the row views made once a block, not once a step
            self.used = 0
        self.used += 1
        self.steps.append(step)
        return self._block_rows[self.used - 1]

    def rows(self):
        """(steps, the rows written since the last read as one (k, n) tensor); the buffer starts again."""
        import torch

        if not self.steps:
            return [], None
        parts = [b for b in self.blocks[:-1]] + [self.blocks[-1][:self.used]]
        out = torch.cat(parts) if len(parts) > 1 else parts[0]
        steps, self.steps = self.steps, []
        self.blocks, self.used = self.blocks[-1:], 0   # reused: what the read needs is computed from `out` at once
        return steps, out

    def post_step(self, step: int, carry_probe: bool):
        import torch

        if carry_probe and self._probe_next:
            self._arm(step)
        elif carry_probe and self._looks_after(step):
            self._arm(step, light=True)
        self._probe_next = False
        if self.before is None:
            return
        with torch.no_grad():
            after = self._samples_after()
            moved = torch.stack([n.float() for n in norms32(torch._foreach_sub(after, self.before))])
            size = torch.stack([n.float() for n in norms32(self.before)])
            ratio = torch.where(size > 0, moved / size.clamp_min(1e-30), torch.full_like(size, float("nan")))
        self.before = None
        self.queue.append(("ratio", (self, step), ratio))

    def _looks_after(self, step: int) -> bool:
        """Besides read steps, the probes look after each of the first `every` steps and after one step drawn in each
        later block of `every` (from the block's number: not the run's random stream). A loop that skips zero_grad()
        now and then (every 7th step, at every=50) had no read step before a skip (a sweep). Those looks are light:
        one parameter, no cosine (~50 µs an armed step on a small MLP)."""
        every = self.every
        if step <= every:
            return True
        block = (step - 1) // every
        if self._drawn[0] != block:
            self._drawn = (block, block * every + 1 + random.Random(block).randrange(every))
        return step == self._drawn[1]

    def _arm(self, step: int, light: bool = False):
        """Hooks on a few parameters that had a gradient, until this optimizer's next step: at every
        backward that reaches one, they look at the gradient already there (a leaf's hooks run before
        accumulation). Carried over = non-zero at every such backward: nothing reset it before the next
        step (a GAN's other loss reaching these parameters after their step, then zero_grad, is fine;
        so is accumulating micro-batches after a zero_grad). A look counts once the gradient is accumulated
        into .grad (a post-accumulate hook): torch.autograd.grad runs the first hook but leaves .grad alone (a
        loop that sets p.grad = g from it replaces the old gradient: a false `grad-carried-over`, a sweep)."""
        chosen = [p for p in self.params if p.grad is not None and p.requires_grad and p.is_leaf][:1 if light else
                                                                                                   CARRY_PROBES]
        self.light = light
        self.fired.clear()
        self.fired_at.clear()
        self.fired_dots.clear()
        self.fired_who.clear()
        self.fired_after.clear()
        self.kept = {}
        self.armed_step = step
        self.probes, self._unkept = [], []
        for p in chosen:
            look, keep = self._probe(p, light)
            self.probes += [p.register_hook(look), p.register_post_accumulate_grad_hook(keep)]

    def _probe(self, p, light: bool = False):
        """The two hooks of one probed parameter: `look` reads the gradient already there and the one coming,
        `keep` files that reading when the coming one was accumulated into .grad. A light look reads no cosine.
        (A look on the host alone, the same .grad tensor at the same version, was tried and withdrawn: a review's
        `p.grad.data.zero_()` moves no version, and a step's second backward moves it though nothing was reset.)"""
        import torch

        ref = weakref.ref(p)   # the hooks live on p: a strong reference would make a cycle only gc frees
        fired, at, dots, marks, pending = self.fired, self.fired_at, self.fired_dots, self.marks, []
        who, kept, after = self.fired_who, self.kept, self.fired_after
        self._unkept.append((ref, pending))

        def look(grad):   # `grad`: the gradient this backward adds; .grad: the one already there
            param = ref()
            old = param.grad if param is not None else None
            with torch.no_grad():
                flag = (old.detach().abs().sum() > 0).float() if old is not None else self._zero
                dot = _dot_norms(old, grad, self._zero3) if old is not None and not light else self._zero3
                weight = _fingerprint(param) if param is not None else None   # moved in place since (SAM, by .data)?
            # (id, version, weight, cleared: nothing there, as zero_grad() leaves it; an exactly zero gradient
            # accumulated, a masked task's head or a hook's zeros, is not cleared: a review)
            pending[:] = [(flag, dot, marks() if marks is not None else (0, 0), grad,
                           (id(param), param._version, weight, old is None) if weight is not None else None)]
            return None

        def keep(param):
            if pending:
                flag, dot, mark, _, whose = pending.pop()
                fired.append(flag)
                dots.append(dot)
                at.append(mark)
                who.append(whose)
                after.append(self._zero)
                if param.grad is not None and not param.grad.is_sparse:   # (stepped and cleared in backward, by an
                    with torch.no_grad():                                 # optimizer hook; a sparse embedding's:
                        direction = _direction(param.grad)                # not asked)
                        after[-1] = (param.grad.detach().abs().sum() > 0).float()
                    if direction is not None:
                        kept[id(param)] = (ref, direction, param.grad.data_ptr())
        return look, keep

    def _settle_unkept(self) -> None:
        """A look no accumulation followed (torch.autograd.grad's): what the loop then put in .grad tells. Added
        (`p.grad += g` with no reset, a review's miss) when .grad minus the new gradient is the old one, as far as the
        look's sums tell: the same squared norm and the same product with the new gradient (1e-3 relative). Anything
        else was written in its place (`p.grad = g`, `g.sign()`, `2 * g`, clipped or noised: a review's false error
        under the first, nearer-norm test)."""
        import torch

        for ref, pending in self._unkept:
            p = ref()
            if not pending or p is None or p.grad is None or self.light:   # a light look has no sums to tell by:
                continue                                                     # not counted (a review: "4 of the 15")
            flag, dot, mark, new, whose = pending.pop()
            if p.grad.is_sparse or new.is_sparse or p.grad.shape != new.shape:
                continue
            with torch.no_grad():
                rest = p.grad.detach().to(self.wide) - new.detach().to(self.wide)
                old2, on = dot[1], dot[0]
                scale = (old2 * dot[2]).sqrt()
                same = ((rest.square().sum() - old2).abs() <= 1e-3 * old2) & \
                    (((rest * new.detach().to(self.wide)).sum() - on).abs() <= 1e-3 * scale)
                self.fired.append(flag * same.float())
            self.fired_dots.append(dot)
            self.fired_at.append(mark)
            self.fired_who.append(whose)
            self.fired_after.append(flag)   # nothing added: .grad as it was
        self._unkept = []

    def disarm(self, applied_at: int | None = None):
        """At the next step (or the end): the probes' verdict, queued for the read; a crossing only when this
        optimizer's step applied the gradients (`applied_at`, its step), not at the end or when it was let go."""
        import torch

        for h in self.probes:
            h.remove()
        self.probes = []
        self._settle_unkept()
        if self._reached is not None:
            self.idle_off()
        if self.fired:
            self.queue.append(("carry", (self, self.armed_step), torch.stack(self.fired).min()))
            cleared = self._cleared() if applied_at is not None else None
            if cleared is not None:
                self.queue.append(("cleared", (self, applied_at, cleared[1]), cleared[0]))
            crossed = _after_other_step(self.fired_at) if applied_at is not None and not self.light else []
            if crossed:   # still there all the way (min), and the cosine between what was there and what came
                first = [i for i in crossed if self.fired_at[i] == self.fired_at[crossed[0]]]
                dot, old, new = torch.stack([self.fired_dots[i] for i in first]).sum(0)
                cos = dot / (old * new).sqrt().clamp_min(1e-30)
                self.queue.append(("crossed", (self, applied_at),
                                   torch.stack([torch.stack([self.fired[i] for i in crossed]).min(), cos.float()])))
        self.fired, self.fired_at, self.fired_dots, self.fired_who, self.kept = [], [], [], [], {}
        self.fired_after = []

    def _cleared(self):
        """(a device value, the backward calls) for the looks since the last step of any optimizer (or GradScaler's
        skip of this one's): per probed parameter looked at by two backward calls or more, with its weight unmoved
        between them (its version, and its fingerprint: SAM moving it through .data), and the step applying the .grad its last
        backward accumulated into, up to a positive scale (clipping, unscaling; not per-sample gradients the loop summed
        and wrote), its flags' maximum. A value of 0 (read with the carry's, no sync here) says one was cleared before
        each of its backwards: zero_grad() inside the micro-batch loop, the step applying the last one's alone (a
        sweep's miss). Parts only one backward reaches each (an actor and a critic, two backwards) ask nothing. None
        when nothing is asked."""
        import torch

        since = _after_other_step(self.fired_at) or list(range(len(self.fired)))
        by: dict[int, list[int]] = {}
        for i in since:
            if self.fired_at[i][1] > self.skipped_at and self.fired_who[i] is not None:
                by.setdefault(self.fired_who[i][0], []).append(i)
        values, calls = [], set()
        reduced = _ranks() > 1   # the step applies the ranks' mean (DDP, FSDP, an all_reduce by hand), not this one's
        for pid, idx in by.items():
            ref, direction, ptr = self.kept.get(pid, (None, None, None))
            param = ref() if ref is not None else None
            if len({self.fired_at[i][1] for i in idx}) < 2 or len({self.fired_who[i][1] for i in idx}) != 1 \
                    or param is None or param.grad is None or param.grad.is_sparse:
                continue
            with torch.no_grad():
                now = _direction(param.grad)
                if now is None:
                    continue
                weights = torch.stack([self.fired_who[i][2] for i in idx])
                moved = (weights != weights[:1]).any().float()
                # across ranks the values are the ranks' mean (a sweep's zero_grad inside DDP's no_sync loop went unseen
                # on 2 ranks), written where they are (DDP's reducer, in place): another tensor is the loop's own (a
                # review: micro-batches summed into buffers and written back, healthy, were said cleared)
                written = ((self._zero if param.grad.data_ptr() == ptr else self._one) if reduced else
                           ((now - direction).abs() > 1e-4).any().float())
                # each later look found .grad gone, or zero where the backward before had left it non-zero
                # (zero_grad(set_to_none=False), a review's miss); a masked task's exact zeros were never non-zero
                kept = torch.stack([self._one if self.fired_who[j][3] else self.fired_after[i]
                                    for i, j in zip(idx, idx[1:])]).min()
                values.append(torch.stack([self.fired[i] for i in idx]).max() + moved + written + 1 - kept)
            calls |= {self.fired_at[i][1] for i in idx}
        return (torch.stack(values).min(), len(calls)) if values else None

    def queued(self, final: bool) -> list:
        """What this optimizer hands to a read: per step the total gradient norm (k), per parameter the
        first non-finite step so far and the largest finite gradient norm of these steps (n each)."""
        import torch

        out = []
        steps, rows = self.rows()
        if rows is not None:
            with torch.no_grad():
                bad = ~torch.isfinite(rows)
                at = torch.tensor(steps, device=self.device)[bad.to(torch.uint8).argmax(0)]
                hit = bad.any(0) & (self.first_bad_dev < 0)
                self.first_bad_dev = torch.where(hit, at, self.first_bad_dev)
                out.append(("grad_norm", (self, steps), _row_norms(rows, self.wide)))
                out.append(("grads", (self, steps), torch.where(bad, 0.0, rows).amax(0)))
                out.append(("reach", (self, steps), self._reach_codes(rows)))
        out.append(("first_bad", self, self.first_bad_dev))
        out.extend(self.queue)
        self.queue = []
        if final and self.start is not None and not self.released:   # a released one's was taken at its release
            with torch.no_grad():
                out.append(("changed", self, (self._fingerprint() != self.start).any(0).float()))
        return out

    def _reach_codes(self, rows):
        """Per step, which parameters its gradient reached (a norm not 0) as c = ceil(n / b) floats, parameter i bit
        i % b of the (i // b)th, b = word_bits (52 in float64, 23 on mps): sums of distinct powers of two under
        2**(b+1) are exact in any order, so a set reads back exactly (report._reach_groups: tasks sampled per step,
        each through its own head)."""
        import torch

        n, b = rows.shape[1], self.word_bits
        if self._bits is None or self._bits.shape[0] != n:
            i = torch.arange(n, device=self.device)
            self._bits = torch.zeros((n, max(1, -(-n // b))), dtype=self.wide, device=self.device)
            self._bits[i, i // b] = torch.pow(2.0, (i % b).to(self.wide))
        return (rows != 0).to(self.wide) @ self._bits

    def _norms(self):
        """Per parameter, its L2 norm (no detach: under no_grad nothing is recorded, and a detach is an op each)."""
        import torch

        with torch.no_grad():
            return torch.stack([n.float().to(self.device) for n in norms32(self.params)])

    def _fingerprint(self):
        """Per parameter, its L2 norm, the sum of its elements and the sum of every other one (a changed parameter
        changes one of them); at the first step and the end only. The sum rather than the L1 norm: one plain pass
        (the CPU's foreach L1 norm costs 3x the L2 on a ResNet-18). The half sum: a scale-invariant weight at 1 (a
        BatchNorm's gain before a ReLU and the next normalisation, as in RegNet's blocks) gets gradients that sum to
        0 and are orthogonal to it, so its sum and norm held to float32's last bit while it moved by 1e-4 (a sweep's
        6 false never-changes on regnet_y_800mf); every other element's share of such a move is not 0."""
        import torch

        with torch.no_grad():
            sums = torch.stack([p.detach().sum().float().to(self.device) for p in self.params])
            halves = torch.stack([p.detach().reshape(-1)[::2].sum().float().to(self.device) for p in self.params])
        return torch.stack([self._norms(), sums, halves])

    def _samples_before(self) -> list:
        """Per parameter, its strided sample before the update: one foreach copy from views of the parameters
        into float32 buffers, both made once (op count independent of the number of parameters); a parameter
        with no view (see _view) is sampled the plain way."""
        import torch

        entries = self._sample_views()
        fast = [e for e in entries if e[1] is not None]
        if fast:
            torch._foreach_copy_([e[2] for e in fast], [e[1] for e in fast])
        self._before_views = entries
        return [e[2] if e[1] is not None else _sample(p) for e, p in zip(entries, self.params)]

    def _samples_after(self) -> list:
        """The same samples after the update: the views themselves (the foreach ops read them in place),
        unless the parameter's storage changed since the sample before it."""
        entries = self._before_views
        return [e[1] if e[1] is not None and e[0] == _view_key(p) else _sample(p)
                for e, p in zip(entries, self.params)]

    def _sample_views(self) -> list:
        out = []
        for i, p in enumerate(self.params):
            key = _view_key(p)
            e = self._views[i]
            if e is None or e[0] != key:   # new storage, shape or dtype (p.data replaced): a new view
                e = self._views[i] = (key, *self._view(p))
            out.append(e)
        return out

    def _view(self, p) -> tuple:
        """(the sample as a view of p, its float32 buffer), or (None, None) where a view would not be the
        plain sample (not contiguous: reshape copies in another order) or foreach would not apply (not
        float32, another device)."""
        import torch

        if p.dtype != torch.float32 or p.device != self.device or not p.is_contiguous():
            return None, None
        with torch.no_grad():
            view = _strided(p.detach().view(-1), _fan_in(p))
            return view, torch.empty(view.shape, dtype=torch.float32, device=p.device)

    def _indices(self, idx):
        import torch

        key = tuple(idx)
        if key != self._index_key:
            self._index_key, self._index = key, torch.tensor(idx, device=self.device)
        return self._index


class DeadUnits:
    """Forward hooks on every leaf module of one root for one forward: per output feature (channel for
    conv maps, last dim for sequences), is it non-zero anywhere in the batch. Compared on the device with
    the first sample: units alive then and zero now (outputs that are never negative only). The hooks take
    two reductions per module; collect() compares all modules at once (a fixed number of ops per device)."""

    def __init__(self, engine, root, grad_only: bool = False):
        self.engine = engine
        self.grad_only = grad_only   # a model whose own forward never runs: its layers' forwards in train mode
        from .engine import inner

        self.module, self.root = root, inner(root)
        self.handles: list = []
        self.seen: list = []   # (name, per-unit max, per-unit min, per-unit input alive or None)
        self.calls: dict[str, int] = {}   # calls of each module in this forward
        self.made: dict[int, tuple] = {}  # storage of an output seen -> (the entry that made it, a weakref to it,
                                          # the dimension of its units)

    def attach(self):
        self.engine.fed_memo = None
        prefix = self.engine.root_prefix(self.module)   # per model: two models' "0" are not one module
        # a part the model compiled (`model.block = torch.compile(model.block)`): hooks on its layers would be traced
        # into its graph and recompile it at every read (a review: 10 graphs for 1): not probed, and said
        compiled = [name for name, m in self.root.named_modules() if compiled_module(m)]
        self.engine.compiled_parts.update(prefix + n for n in compiled)
        for name, m in self.root.named_modules():
            if any(name == c or name.startswith(c + ".") for c in compiled):
                continue
            if not any(True for _ in m.children()):
                self.handles.append(m.register_forward_hook(self._hook(prefix + name)))

    def _hook(self, name):
        def hook(module, args, output):
            import torch

            if self.grad_only and (not self.root.training or torch._C._current_graph_task_id() != -1):
                return None   # a validation forward (the model in eval), a checkpoint's recomputation: not training
            if torch.compiler.is_compiling():   # compiled code of its own calls this layer (a compiled helper
                self.engine._traced.add(id(self.module))   # function: a review): no probe of this model again
                self.engine.compiled_parts.add(name)
                return None
            if under_functorch():   # under torch.func (vmap, grad): its
                self.engine.under_functorch = True   # tensors are wrappers with no storage, whose reductions must
                return None                          # not escape the transform (a sweep: DP-SGD's script raised)
            if not module.training:
                self.engine.saw_eval_module(name, module, args)
            if (not isinstance(output, torch.Tensor) or not output.is_floating_point() or output.dim() < 2
                    or output.numel() == 0):
                return None
            with torch.no_grad():
                unit = self._unit(module, args, output)
                rest = [d for d in range(output.dim()) if d != unit]
                # a module called again in one forward (a ResNet block's one ReLU, twice) is another layer of
                # units: its own entry, `name#2`, compared with its own first sample
                k = self.calls[name] = self.calls.get(name, 0) + 1
                entry = name if k == 1 else f"{name}#{k}"
                fed = self._passed_on(module, args, output, entry)
                self.made[output.untyped_storage().data_ptr()] = (entry, weakref.ref(output), unit)
                self.seen.append((entry, output.amax(rest), output.amin(rest), None if fed else _input_range(
                    module, args, output, rest)))
            return None
        return hook

    def _fed_by(self, args) -> tuple | None:
        """(entry, the tensor, the dimension of its units) of the module output this module reads first (or a view
        of it), while it is alive (its memory not reused since), or None."""
        import torch

        x = args[0] if args else None
        made = self.made.get(x.untyped_storage().data_ptr()) if torch.is_tensor(x) else None
        src = made[1]() if made is not None else None
        return None if src is None else (made[0], src, made[2])

    @staticmethod
    def _units_of(x, made: tuple) -> int:
        """The dimension of `x`'s units: its maker's where `x` has its shape (not a view that selects or reshapes)."""
        return made[2] if made[1].shape == x.shape else 2 if x.dim() == 3 else 1

    def _unit(self, module, args, output) -> int:
        """The dimension of `output` that holds its units: a convolution's channels (1, a Conv1d's (B, C, L) too: a
        review found its dead channels unseen, judged per position), kept by what reads another module's output
        and keeps that dimension's size with no weights across it (its ReLU, BatchNorm, pooling; a Linear over a
        Conv1d's length mixes the last dimension, its own units: a review); else the last of a 3-D sequence
        (B, T, C), else 1."""
        import torch

        if isinstance(module, torch.nn.modules.conv._ConvNd):
            return 1
        made, x = self._fed_by(args), args[0] if args else None
        if isinstance(module, torch.nn.Linear) and torch.is_tensor(x) and x.dim() == output.dim() > 3 \
                and _over_last(module, x, output):   # its own features, before a square (W, W) weight over a
            return output.dim() - 1                  # (H = W) map is taken for an elementwise gain (a review)
        if made is not None and made[1].shape == x.shape and x.dim() == output.dim() \
                and x.shape[made[2]] == output.shape[made[2]] and _per_unit(module, x, output, made[2]):
            return made[2]
        if torch.is_tensor(x) and x.dim() == output.dim() > 3 and _over_last(module, x, output):
            return output.dim() - 1   # a Linear over a channels-last map (B, H, W, C): its features
        return 2 if output.dim() == 3 else 1

    def _passed_on(self, module, args, output, entry: str) -> bool:
        """A module without parameters whose input is another module's output (a pool or a flatten after a
        ReLU) passes that module's dead units on: noted (host-side names only) so the report names them once.
        One whose units are not its input's (a Flatten: a channel at one position) is noted as regrouped: its
        zeros are the input's, told at a finer grain than a unit (the report does not judge it alone)."""

        x, made = args[0] if args else None, self._fed_by(args)
        if made is not None and not _holds_parameters(module):
            checks = self.engine.checks
            checks["dead_feeds"][entry] = made[0]
            if x.dim() >= 2 and (x.dim() != output.dim() or
                                 x.shape[self._units_of(x, made)] != output.shape[self._unit(module, args, output)]):
                checks["dead_regrouped"].add(entry)
            return True
        return False

    def remove(self):
        """Off without a verdict (watching ended during the forward it sampled)."""
        for h in self.handles:
            h.remove()
        self.handles = []
        self.engine.fed_memo = None   # the eval-mode walks' memo is this forward's (engine.saw_eval_module)

    def collect(self):
        import torch

        self.remove()
        by_device: dict = {}
        for entry in self.seen:
            by_device.setdefault(entry[1].device, []).append(entry)
        self.seen = []
        with torch.no_grad():
            for entries in by_device.values():
                self._collect(entries)

    def _collect(self, entries):
        """One device's modules: per module [units newly dead, units dead, units whose minimum is negative
        or NaN] as one (modules, 3) tensor in engine.pending (absorb splits it)."""
        import torch

        eng = self.engine
        names = [e[0] for e in entries]
        sizes = [int(e[1].numel()) for e in entries]
        mx = torch.cat([e[1] for e in entries])
        mn = torch.cat([e[2] for e in entries])
        alive = mx.ne(0) | mn.ne(0)   # some element non-zero (a NaN counts, as ne(0) does)
        first, seg = _first_alive(eng, id(self.root), names, sizes, alive)
        dead = alive.logical_not()
        # newly dead: zero on this batch and on the one the last sample saw. A unit that fires for a few samples in 60
        # is zero on most batches of 30 by chance (a helper's MLP: 161 of 256 on one batch, 71 on all 600 samples)
        key, modules = (id(self.root), alive.device), tuple(zip(names, sizes))
        last = eng._dead_last.get(key)
        held = dead & last[1] if last is not None and last[0] == modules else dead
        eng._dead_last[key] = (modules, dead)
        came = _came_dead(entries, sizes, alive)
        per_unit = torch.stack([first & held, dead, (mn >= 0).logical_not(),
                                first & held & came if came is not None else torch.zeros_like(dead)], 1).float()
        counts = torch.zeros((len(entries), 4), dtype=per_unit.dtype, device=alive.device).index_add_(0, seg, per_unit)
        # the step this forward is part of, as the loss's (a forward before any step was "step 0" beside a loss at 1)
        eng.pending.append(("dead", (eng.step + 1, list(zip(names, sizes))), counts))


def _holds_parameters(module) -> bool:
    return any(True for _ in module.parameters(recurse=False))


def _per_unit(module, x, output, unit: int) -> bool:
    """`module` keeps the units of its input `x` (on dimension `unit`): it has no parameters, or each is one value
    for all (PReLU's one slope, a 0-dim gain), one per unit (a BatchNorm's weight over a conv's channels, a PReLU's),
    or elementwise where the output has x's shape: it broadcasts against x (a (1, C, 1) or (C, 1) gain, a LayerNorm's
    (C, L) over a Conv1d's map). A review found dead channels behind each of these unseen. Not told apart by shape: a
    Linear(L, L) over a Conv1d's square (C = L) map, taken for one (over a 4-D map `_unit` takes a Linear's own
    features first)."""
    import torch

    def keeps(p) -> bool:
        if p.numel() == 1 or (p.dim() == 1 and p.shape[0] == x.shape[unit]):
            return True
        try:
            return output.shape == x.shape and torch.broadcast_shapes(p.shape, x.shape) == x.shape
        except RuntimeError:
            return False

    return all(keeps(p) for p in module.parameters(recurse=False))


def _over_last(module, x, output) -> bool:
    """`module` holds an (out, in) matrix from x's last dimension to the output's, the rest of the shape kept: a
    Linear, whatever the rank of its input."""
    return output.shape[:-1] == x.shape[:-1] and any(
        p.dim() == 2 and tuple(p.shape) == (output.shape[-1], x.shape[-1]) for p in module.parameters(recurse=False))


def _input_range(module, args, output, rest):
    """Per unit, the max and min of the input of a module without parameters that is not another module's output (None
    where that is not read: the module has parameters, or its input is not shaped as its output). A dropout after an
    activation called as a function (nn.TransformerEncoderLayer's F.relu) passes on zeros it did not make: the report
    says they arrive at its input (a sweep: the finding named the Dropout)."""
    import torch

    x = args[0] if args else None
    if (not torch.is_tensor(x) or x.shape != output.shape or not x.is_floating_point()
            or _holds_parameters(module)):
        return None
    return x.amax(rest), x.amin(rest)


def _came_dead(entries, sizes, alive):
    """Per unit of all modules: zero at its module's input as well (_input_range; False where not read), in a fixed
    number of ops whatever the modules; None when no module's input was read."""
    import torch

    offsets = list(_offsets(sizes))
    have = [(offsets[j], e[3]) for j, e in enumerate(entries) if e[3] is not None]
    if not have:
        return None
    mx = torch.cat([m for _, (m, _) in have])
    mn = torch.cat([m for _, (_, m) in have])
    idx = torch.tensor([off + k for off, (m, _) in have for k in range(m.numel())], device=alive.device)
    return torch.zeros_like(alive).index_copy_(0, idx, mx.eq(0) & mn.eq(0))


def _first_alive(eng, root_id, names, sizes, alive) -> tuple:
    """(per unit of `alive`: alive at its module's first sample, the module index of each unit). The engine keeps
    per module name (vector, offset, units), reset when the unit count changes; the concatenation for a forward
    is built once (an index_select) and reused while no module's entry changes: no op at a steady read."""
    import torch

    srcs, pos = [], 0
    for name, n in zip(names, sizes):
        src = eng._dead_first.get(name)
        if src is None or src[2] != n or src[0].device != alive.device:
            src = eng._dead_first[name] = (alive, pos, n)
        srcs.append(src)
        pos += n
    key = (root_id, alive.device)
    plan = eng._dead_plans.get(key)
    if plan is not None and len(plan[0]) == len(srcs) and all(a is b for a, b in zip(plan[0], srcs)):
        return plan[1], plan[2]   # the plan holds the entries: identity cannot be a reused id
    dev = alive.device
    seg = torch.repeat_interleave(torch.arange(len(sizes), device=dev), torch.tensor(sizes, device=dev),
                                  output_size=pos)
    if all(src[0] is alive and src[1] == off for src, off in zip(srcs, _offsets(sizes))):
        first = alive
    else:   # a module seen before, a module called twice: gather its first sample's units
        uniq: dict = {}
        for src in srcs:
            if id(src[0]) not in uniq:
                uniq[id(src[0])] = (src[0], sum(v.numel() for v, _ in uniq.values()))
        base = torch.cat([v for v, _ in uniq.values()]) if len(uniq) > 1 else srcs[0][0]
        idx = [uniq[id(v)][1] + off + j for v, off, n in srcs for j in range(n)]
        first = base.index_select(0, torch.tensor(idx, device=dev))
    eng._dead_plans[key] = (srcs, first, seg)
    return first, seg


def _offsets(sizes):
    pos = 0
    for n in sizes:
        yield pos
        pos += n


def _strided(flat, fan_in: int = 1):
    """At most SAMPLE elements of a flat tensor, evenly strided."""
    return flat[::_stride(flat.numel(), fan_in)][:SAMPLE]


@functools.lru_cache(maxsize=1024)
def _stride(numel: int, fan_in: int) -> int:
    """At least numel // SAMPLE and coprime with the row length; where one sample falls in each row, stepping
    through the columns by a residue near fan_in / φ, so that the samples' columns spread over the row. A stride
    that divides the row length samples the same few columns of every row (a sweep: Linear(64, 128)'s 32 read only
    digits' two blank pixels, its ratio 0); one 1 more than it samples the first columns in order (a review:
    Linear(784, 256)'s 785, the top of an image, 2x off)."""
    base = max(1, numel // SAMPLE)
    if base == 1 or fan_in <= 1 or numel // fan_in < 2:
        return base
    if base < fan_in:   # several samples a row: a coprime stride reaches every column, though in bands where
        # it is near a simple fraction of the row (128x784: a 17% gap per row; a review)
        return next(s for s in range(base, 2 * fan_in) if math.gcd(s, fan_in) == 1)
    target = round(fan_in / 1.618033988749895)
    residue = next(r for k in range(fan_in) for r in (target + k, target - k) if 0 < r < fan_in and math.gcd(r, fan_in) == 1)
    return base + (residue - base) % fan_in


def _fan_in(p) -> int:
    return p.numel() // p.shape[0] if p.dim() >= 2 and p.shape[0] else 1


def _sample(p):
    """A parameter's strided sample, copied as float32 (for parameters with no sample view)."""
    return _strided(p.detach().reshape(-1), _fan_in(p)).float().clone()


def _made(p):
    """The parameter, or for a lazy module's never called (no shape, no values: every look raised, and watch stopped:
    a review) an empty stand-in: nothing to train or judge, as an empty parameter. Made later, a new track holds it
    (Track.lazy)."""
    from ...core.lazy import is_uninitialised

    if not is_uninitialised(p):
        return p
    import torch

    return torch.zeros(0, requires_grad=p.requires_grad)   # one never made is never-gets-grad, as a Linear never called


class Released:
    """What the report reads of a parameter whose optimizer the run let go (Track.release), and a weak reference
    to it: its model can go."""

    def __init__(self, p):
        self.ref = weakref.ref(p)
        self.shape, self.requires_grad, self._numel, self._dim = p.shape, p.requires_grad, p.numel(), p.dim()
        g = p.grad   # the gradient it had when its optimizer was let go (weakly), and its version
        self._grad = (weakref.ref(g), g._version) if g is not None else None

    def fresh_grad(self) -> bool:
        """The live tensor got a gradient since its optimizer was let go (another tensor, or the same one changed)."""
        p = self.ref()
        g = p.grad if p is not None else None
        if g is None:
            return False
        return self._grad is None or self._grad[0]() is not g or self._grad[1] != g._version

    def numel(self) -> int:
        return self._numel

    def dim(self) -> int:
        return self._dim


def _main_group(groups) -> int:
    """The index of the group whose learning rate is the run's: the largest of those a schedule or the user set
    above 0 (its `initial_lr`, a scheduler's base, else `lr`). A group held at 0 (a warm-up freeze) made the run's
    rate 0 (a sweep); the fastest group, a small head added at 10x, made a false warm-up rise (a review)."""
    from ...core.lazy import is_uninitialised

    def size(k):   # a lazy module never called holds no size yet (a review: numel() raised, watch stopped)
        return sum(p.numel() for p in groups[k]["params"] if not is_uninitialised(p))

    def base(k):
        return rate(groups[k].get("initial_lr", groups[k].get("lr"))) or 0.0

    live = [k for k in range(len(groups)) if base(k) > 0] or list(range(len(groups)))
    return max(live, key=size) if live else 0


def rate(lr) -> float | None:
    """A learning rate as a float (a CPU tensor's value too), None where there is none to read without a sync."""
    try:
        if isinstance(lr, (int, float)) or (lr is not None and lr.device.type == "cpu"):
            return float(lr)
    except Exception:
        pass
    return None


def _no_optimizer():
    return None


def autograd_hook_codes() -> list:
    """The code of the hooks autograd calls here (a gradient's look and keep, the reach mark): engine.skip_in_dynamo."""
    return nested_codes(Track._probe, ("look", "keep")) + [_reach.__code__]


def nested_codes(fn, names: tuple) -> list:
    """The code objects of the functions named `names` defined inside `fn`."""
    return [c for c in fn.__code__.co_consts if getattr(c, "co_name", None) in names]


def _reach(reached: set, param) -> None:
    reached.add(id(param))


def param_key(p) -> int:
    """id() of the parameter, through a stand-in while its tensor lives (a row is one parameter however many
    tracks hold it); a stand-in's own id once the tensor is gone (a new tensor may reuse that id)."""
    if isinstance(p, Released):
        alive = p.ref()
        return id(alive) if alive is not None else id(p)
    return id(p)


def _view_key(p) -> tuple:
    """What a sample view of p depends on: a changed one means p's storage or layout was replaced."""
    return p.data_ptr(), p.shape, p.stride(), p.dtype, p.device


def under_functorch() -> bool:
    """A torch.func transform (vmap, grad, jacrev, ...) is running."""
    import torch

    return torch._C._functorch.peek_interpreter_stack() is not None


def host_visible(device) -> bool:
    """Can the host look at a value on this device without waiting for it? Only the CPU, where eager ops
    have finished when they return (an accelerator's queue would need a sync per step)."""
    kind = getattr(device, "type", None)
    return (kind if kind is not None else str(device)) == "cpu"


def nonfinite_losses(losses) -> bool:
    """On the CPU: is one of this step's losses NaN/Inf (read through numpy, as the flag: no op, no wait)."""
    return any(host_visible(v.device) and not math.isfinite(_host_value(v)) for v in losses)


def _row_norms(rows, wide):
    """Each row's L2 norm in `wide`; in float32 (mps) scaled by the row's largest first: the squares of a 1e20
    gradient norm overflow float32, not float64."""
    import torch

    rows = rows.to(wide)
    if wide == torch.float64:
        return rows.square().sum(1).sqrt()
    top = rows.abs().amax(1, keepdim=True)
    scaled = top.squeeze(1) * (rows / top.clamp_min(torch.finfo(wide).tiny)).square().sum(1).sqrt()
    return torch.where(torch.isinf(top.squeeze(1)), top.squeeze(1), scaled)   # an inf row's norm is inf, not NaN


def _host_value(v) -> float:
    """A one-element CPU tensor's value through a numpy view; bfloat16, which numpy lacks, takes one cast."""
    try:
        return float(v.numpy().item())
    except TypeError:
        return float(v.float().numpy().item())


def read_parts(parts) -> list[list[float]]:
    """The values of several device tensors, one `.tolist()` (one sync) per device, in its widest float."""
    import torch

    by_device: dict = {}
    for i, t in enumerate(parts):
        by_device.setdefault(t.device, []).append(i)
    out: list = [None] * len(parts)
    for idx in by_device.values():
        wide = wide_float(parts[idx[0]].device)
        flat = torch.cat([parts[i].detach().reshape(-1).to(wide) for i in idx]).tolist()
        pos = 0
        for i in idx:
            n = parts[i].numel()
            out[i] = flat[pos:pos + n]
            pos += n
    return out


def absorb(engine, kind: str, payload, vals: list) -> None:
    """File the values one read brought back."""
    checks = engine.checks
    if kind == "first_bad":
        track = payload
        hit = [(int(v), track.names[i]) for i, v in enumerate(vals) if v >= 0]
        if hit and track.first_bad is None:
            step = min(s for s, _ in hit)
            track.first_bad = (step, [n for s, n in hit if s == step])
    elif kind == "ratio":
        track, step = payload
        for i, v in enumerate(vals):
            if math.isfinite(v) and track.seen_grad[i]:
                engine.ratios.setdefault(track.names[i], []).append((step, v))
    elif kind == "carry":   # one look at the backwards after a step (Track._looks_after)
        checks.setdefault("carry_steps", set()).add(payload[1])   # steps looked after (a step may take
        checks.setdefault("carry_looked", {}).setdefault(id(payload[0]), set()).add(payload[1])   # ... per optimizer
        if vals[0] > 0 and payload[1] not in checks["carried"]:    # several backwards: a sweep's "3 of the 204")
            checks["carried"].append(payload[1])
        if vals[0] > 0:   # which optimizer's (named where there are several)
            checks.setdefault("carried_by", {})[id(payload[0])] = payload[0]
    elif kind == "cleared":   # several backwards before this optimizer's step, the gradients cleared before each
        track, step, backwards = payload
        if vals[0] == 0:
            checks.setdefault("cleared", {}).setdefault(id(track), (track, []))[1].append((step, backwards))
    elif kind == "crossed":   # a gradient made before another optimizer's step, still there when this one stepped,
        if vals[0] > 0 and vals[1] < OPPOSED:   # and the next backward's pulling against it
            checks["crossed"].setdefault(id(payload[0]), (payload[0], payload[1], vals[1]))
    elif kind == "weights":
        track, step = payload
        for i, v in enumerate(vals):
            if not math.isfinite(v):
                widened = _wide_norm(track.params[i])
                if widened is None:
                    checks["param_nonfinite"].setdefault(track.names[i], step)
                else:   # finite elements whose float32 norm overflowed (a review: 1.3e19 at most, "non-finite")
                    vals[i] = widened
        track.weight_norm = vals
        if track.start_norm is None:
            track.start_norm = vals
    elif kind == "grads":
        track = payload[0]
        track.grad_max = [max(a, b) if math.isfinite(b) else a for a, b in zip(track.grad_max, vals)]
    elif kind == "changed":
        payload.changed = [v > 0 for v in vals]
    elif kind == "inscale":   # the first training forward's largest |x| (engine._look_at_input_scale)
        checks["input_absmax"] = vals[0]
    elif kind == "probs":   # a class loss module's input was probabilities (engine._look_at_loss_input)
        seen = checks.get("probs_into_loss")   # the graph's (function names) gives way to the module's own name
        if vals[0] > 0 and (seen is None or seen[1] in ("cross_entropy", "nll_loss")):
            checks["probs_into_loss"] = payload
    elif kind == "ctcblank":   # ctc_loss's labels holding its blank (engine._look_at_ctc): the first, with its count
        if vals[0] > 0:
            checks.setdefault("ctc_blank", (*payload, int(vals[0])))
    elif kind == "labels":   # a cross-entropy's targets the ids the model looked up (engine._look_at_labels)
        looked = checks.setdefault("labels_looked", [0, 0])
        looked[0], looked[1] = looked[0] + 1, looked[1] + (vals[0] > 0)
        if vals[0] > 0:
            checks.setdefault("labels_inputs", payload)
    elif kind == "nllpos":   # an NLLLoss input's row of both signs whose mean no log-probabilities reach
        if vals[0] > 0 and "logits_into_nll" not in checks:   # (engine._look_at_nll_input): its mean, its k
            checks["logits_into_nll"] = (*payload, vals[1], int(vals[2]))
    elif kind == "bn":
        step, names = payload
        for name, v in zip(names, vals):
            if not math.isfinite(v):
                checks["bn_nonfinite"].setdefault(name, step)
    elif kind == "dead":   # per module: units newly dead, dead, with a negative (or NaN) minimum, newly dead that
        step, modules = payload   # were zero at its input already
        for j, (name, units) in enumerate(modules):
            newly, dead, negative, came = vals[4 * j:4 * j + 4]
            checks["dead"].setdefault(name, []).append((step, newly, dead, negative == 0, units))
            checks.setdefault("dead_arrived", {})[name] = came


def compiled_module(m) -> bool:
    """A torch.compile'd module: the wrapper torch.compile(m) returns, a module compiled in place (m.compile(),
    which leaves its type and compiles its call: a review found its layers probed, 14 graphs for one), or one whose
    forward was compiled (`m.forward = torch.compile(m.forward)`, `@torch.compile` on forward: 11)."""
    forward = getattr(m, "forward", None)
    return (type(m).__name__ == "OptimizedModule" or getattr(m, "_compiled_call_impl", None) is not None
            or getattr(getattr(forward, "__func__", forward), "_torchdynamo_orig_callable", None) is not None
            or any(getattr(v, "_torchdynamo_orig_callable", None) is not None for v in vars(m).values()
                   if callable(v)))   # self.core = torch.compile(self._core): a compiled helper it calls


def _sparse_norm(t):
    """A sparse gradient's L2 norm, in float32: COO's values with duplicates summed first; a compressed layout's (CSR,
    CSC, BSR) values, which hold no duplicates (a review: a CSR gradient stopped watch)."""
    import torch

    values = t.coalesce()._values() if t.layout is torch.sparse_coo else t.values()
    return values.float().norm()


def norms32(tensors: list) -> tuple:
    """Each tensor's L2 norm, float16/bfloat16 ones accumulated and returned in float32: a half gradient's norm
    past 65,504 was inf in its own dtype, a non-finite gradient of finite values."""
    import torch

    if not tensors:
        return ()
    kinds = {(t.layout, t.dtype) for t in tensors}   # one pass: this runs every step
    if len(kinds) == 1 and kinds == {(torch.strided, torch.float32)}:   # the usual case
        return torch._foreach_norm(tensors)
    if any(layout is not torch.strided for layout, _ in kinds):   # nn.Embedding(sparse=True): its values' norm,
        dense = iter(norms32([t for t in tensors if t.layout is torch.strided]))   # duplicates summed first (a review:
        return tuple(next(dense) if t.layout is torch.strided else _sparse_norm(t) for t in tensors)   # every step raised)
    half = (torch.float16, torch.bfloat16)
    if all(dtype in half for _, dtype in kinds):
        return torch._foreach_norm(tensors, 2, dtype=torch.float32)
    if any(dtype in half for _, dtype in kinds):   # mixed: the half ones and the rest apart, put back in order
        lows = iter(norms32([t for t in tensors if t.dtype in half]))
        rest = iter(torch._foreach_norm([t for t in tensors if t.dtype not in half]))
        return tuple(next(lows) if t.dtype in half else next(rest) for t in tensors)
    return torch._foreach_norm(tensors)


def _dot_norms(old, new, zero3):
    """(old·new, |old|², |new|²) on old's device: three reductions, no sync, in float32 (a float32 gradient is not
    copied: a review's float64 copies of a 30000x512 embedding's two gradients cost 176 MB at a read). Inside autograd's
    backward: a gradient it cannot reduce (sparse) gives zeros, never an error in the user's backward."""
    import torch

    try:
        if old.is_sparse or new.is_sparse:   # a sparse embedding's: products of its rows (dense of the other)
            a, b = old.detach().coalesce() if old.is_sparse else old.detach(), \
                new.detach().coalesce() if new.is_sparse else new.detach()
            sq = [(t._values() if t.is_sparse else t).float().pow(2).sum() for t in (a, b)]
            dot = (a * b).coalesce()._values().float().sum() if a.is_sparse and b.is_sparse else \
                (a.to_dense() * b if a.is_sparse else a * b.to_dense()).float().sum()
            return torch.stack([dot, sq[0], sq[1]]).to(zero3.dtype)
        a, b = old.detach().reshape(-1), new.detach().reshape(-1)
        a, b = (a if a.dtype == torch.float32 else a.float()), (b if b.dtype == torch.float32 else b.float())
        b = b.to(a.device)
        return torch.stack([a @ b, a @ a, b @ b]).to(zero3.dtype)
    except Exception:   # noqa: BLE001 - a look only
        return zero3


def _wide_norm(p) -> float | None:
    """A parameter's L2 norm in float64 where its elements are all finite, else None: one read, asked only where its
    float32 norm was not finite (an event, not a step)."""
    import torch

    with torch.no_grad():
        if not bool(torch.isfinite(p).all()):
            return None
        return float((p.detach().cpu() if p.device.type == "mps" else p.detach()).double().norm())   # (no float64 on mps)


def _fingerprint(t):
    """Two numbers of a tensor's values (float32): its sum over √n, and a fixed pattern's weighted sum over at most
    4,096 entries spread across it, over √m (a sum alone misses a change that sums to zero: a 2-class head's, a
    review). None for what has no dense values to read (sparse, or a tensor subclass that refuses): not asked."""
    import torch

    if t.is_sparse:
        return None
    try:
        flat = (torch.view_as_real(t.detach()) if t.is_complex() else t.detach()).reshape(-1).float()
    except Exception:   # a hook of ours never breaks the user's backward
        return None
    few = flat[::max(1, flat.numel() // 4096)]
    pattern = torch.cos(torch.arange(few.numel(), device=few.device, dtype=few.dtype) * 0.6180339887)
    return torch.stack([flat.sum() / math.sqrt(max(flat.numel(), 1)), (few * pattern).sum() / math.sqrt(max(few.numel(), 1))])


def _direction(g):
    """A gradient's fingerprint over its norm: the same for any positive multiple of it (None: _fingerprint)."""
    mark = _fingerprint(g)
    return None if mark is None else mark / g.detach().abs().float().square().sum().sqrt().clamp_min(1e-30)


def _ranks() -> int:
    """The process group's size (1 where none is set up)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _after_other_step(at: list) -> list[int]:
    """The flags from the first backward after another optimizer's last step (counted from an earlier backward that
    reached the probed parameters) to this optimizer's step. All non-zero: a gradient made before that other step was
    still there when this one applied it (a GAN's discriminator loss reaching the generator through fakes not
    detached, its zero_grad at the loop's top). A zero_grad after the other step (a PGD attack's steps before the
    model's own zero_grad and backward) or micro-batches after one leave a zero flag among them."""
    last = max((i for i in range(1, len(at)) if at[i][0] > at[i - 1][0]), default=None)
    return list(range(last, len(at))) if last is not None else []
