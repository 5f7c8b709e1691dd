"""The engine of `watch`: hooks on the user's own training loop, statistics kept on the device, one
read-back every `every` optimizer steps.

Where it hooks (torch's own extension points, removed on close):
- optimizer steps: `Optimizer.register_step_pre_hook/post_hook` per optimizer given, else torch's global
  `register_optimizer_step_pre_hook/post_hook` (every optimizer the run builds). A pre-hook sees the
  gradients before the update: the weights are still the ones that produced them.
- the model: forward pre/post hooks on each trained root module (the batch, train/eval mode). Without a
  model given, torch's global module hooks find the roots (outermost module calls) until the first step
  of each optimizer says which roots it trains; then they are removed (no per-module cost afterwards).
- the loss: `Tensor.backward` is wrapped while watching (a reference to the scalar, no sync).

Per step (device only, no sync): the gradient norms of every parameter (`_foreach_norm`), the total norm
and the loss into a window buffer, and the first step each parameter's gradient went non-finite. Every
`every` steps (the read step) one read-back per device brings the window to the host, plus what the read
step sampled: update/weight ratios (a strided sample of each parameter before and after the step), the
gradients still present at the next backward (a missing zero_grad), dead units (the next forward's leaf
outputs), parameter and BatchNorm-statistics finiteness. Host-side analysis is in findings.py."""
from __future__ import annotations

import collections
import contextlib
import functools
import math
import sys
import weakref

from ...core.device import wide_float
from ...core.dropout_rate import dropping_most
from ...errors import one_line
from . import reload
from .children import Children
from .clip import ClipNorms, combined
from .double import DoubleSteps
from .frozen import LATER, frozen_probe, passed_through, recomputed, take, worth_asking
from .hooks import ModuleHook, hook_root
from .names import label, user_names
from .options import Options
from .schedulers import SchedulerCalls
from .stats import (
    CLOCK_STOPPED,
    Track,
    nonfinite_losses,
    norms32,
    param_key,
    read_parts,
    under_functorch,
)


def _kind_over(t: Track) -> str:
    """An optimizer named for a note: its type and its first parameter ("SGD over student.0.weight")."""
    return f"{t.kind} over {t.names[0]}" if t.names else t.kind


def _guarded(hook, uncompiled: bool = False):
    """A hook of ours that raises must never break the user's training: the engine stops watching
    (every hook becomes a no-op), and the report says why. `uncompiled`: see _step_hook."""
    eager: list = []

    @functools.wraps(hook)
    def run(self, *args, **kwargs):
        if self.broken:
            return None
        call = hook
        if uncompiled and "torch._dynamo" in sys.modules:
            if not eager:
                import torch._dynamo

                eager.append(torch._dynamo.disable(hook, recursive=True))
                skip_in_dynamo()
            call = eager[0]
        try:
            return call(self, *args, **kwargs)
        except Exception as exc:
            self.broken = f"watch stopped at step {self.step} after an internal error ({one_line(exc)}); " \
                          "the report covers the steps before it"
            return None
    return run


def _shares_groups(opt, given) -> bool:
    """`opt` holds the very param_groups of `given` (a wrapper built on it: SAM and Lookahead take their inner
    optimizer's param_groups as their own). A sweep: watch(model, sam) with SAM's first_step/second_step, which step
    the inner SGD alone, ended in "no optimizer step was seen"."""
    mine, theirs = opt.param_groups, given.param_groups
    return mine is theirs or (len(mine) == len(theirs) > 0 and all(a is b for a, b in zip(mine, theirs)))


def _step_hook(hook):
    """An optimizer-step hook, run eagerly at every step also where the user compiled the step (torch.compile of
    `opt.step`, or of a whole training step): traced, it ran once, on symbolic values, and under a compiled caller
    dynamo compiles each frame it calls too, where our code broke (a sweep: exit 2, "no optimizer step was seen").
    Disabled, it is a graph break that runs it uncompiled at every call. torch._dynamo is not imported for it: a run
    that compiles has it loaded already."""
    return _guarded(hook, uncompiled=True)


ROWS_UNREAD = 100   # an optimizer's per-step rows no read took, in units of `every`, at which one is made (one sync)
SEARCH_STEPS = 3   # the clock's steps, from an optimizer's first, during which its model is looked for
END_STOPPED = 10   # a model's optimizer's steps to the run's end since the clock's last, at least, for a handover there
ONE_OFF_STARTS = 4   # one-step models whose starting weights are kept (a fingerprint each): new weights or copies
MAX_SEARCHES = 8   # optimizers whose model is looked for at all
UNTRAINED_STEPS = 50   # the clock's steps during which a model called with trainable parameters that no optimizer
                       # holds keeps discovery on (a WGAN's generator first steps after 5 critic steps)


class Engine:
    """Attach with `attach()`, detach with `close()`; `finish()` makes the last read. Host-side state:
    `series` (per step), `events` (non-finite values, replays), `checks` (what the read steps saw)."""

    def __init__(self, opts: Options, models=(), optimizers=(), on_read=None, on_histograms=None):
        self.opts = opts
        self.explicit_models = [m for m in models if m is not None]
        self._given_models = bool(self.explicit_models)   # (a bool: a compiled graph's hooks read it, not the models)
        given = [o for o in optimizers if o is not None]
        self.opts_given = bool(given)    # optimizers were given (held weakly: the loop may let them go)
        self._given = weakref.WeakSet(given)
        self.on_read = on_read              # callback(engine): after each read (status line, TensorBoard)
        self.on_histograms = on_histograms  # callback(step, named params): TensorBoard histograms
        self.step = 0                       # optimizer steps of the clock optimizer
        self.epoch = None
        self.epochs: list[tuple[int, object]] = []   # (the step it began after, epoch) at each set_epoch that changed it
        self.tracks: dict = {}              # id(optimizer) -> Track; ("gone", n) -> a model's, its optimizer let go
        self._clock = None                  # weakref to the clock optimizer (see `clock`)
        self._provisional = False           # the clock is an attack's until a model's optimizer steps (_choose_clock)
        self._last_read = 0                 # the step of the last read (optimizer-idle)
        self._dead: list = []               # ids of watched optimizers the run let go, filed at the next step
        self.remade = 0                     # optimizers made again over the same parameters after one step
        self.let_go = 0                     # optimizers of no model let go (an attack's, made per step): dropped
        self.one_offs = 0                   # ... and of a model let go with it after one step (made anew each step)
        self.one_off_starts: list = []      # ... the first ones' (parameter shapes, first-step fingerprints on the
                                            # device) (model-remade)
        self._one_off_keys: list = []       # the tracks of those, kept until a read has read them
        # id -> trained root module, held weakly (a model per fold must go when the run lets it go); its order
        self.roots: weakref.WeakValueDictionary = weakref.WeakValueDictionary()   # among all ever hooked: _order
        self.frozen: tuple[int, int, list[str]] = (0, 0, [])   # the trained models' parameters without grad, as of
                                                               # the last read (_note_frozen)
        self._order: dict[int, int] = {}   # by id: a module class may define __eq__ and so not hash
        self.models_seen: list[str] = []    # the type of every root hooked, in order (the report's header)
        self._labels: list[str] = []       # by order: what the user's code calls each root hooked (names.py)
        self._untrained_eval: set[str] = set()   # of those, the ones called in eval mode
        self._untrained: dict[str, tuple] = {}   # a model watched for gradients no optimizer holds: its parameters
        self._dead_roots: list[int] = []    # ids of hooked roots the run let go, cleaned up at the next step
        # discovery: roots called with grad enabled, held weakly (a network built anew in each loss call must go)
        self.seen_roots: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._seen_since: dict[int, int] = {}   # by id: the step of a seen root's first call with grad
        self._adopted_since: dict[int, int] = {}   # by id: the same for a root adopted as untrained (seen from)
        self.last_call = None               # (weakref to the root, args, kwargs) of the last training forward
        self._bad_call = None               # ... of the forward whose loss was the step's first non-finite (CPU)
        self._stepped_bad = None            # ... that, of the step just taken, and how many losses it took
        self._step_losses = 0
        self._host_losses = True            # the last loss seen was on the CPU (looked at per backward, no sync)
        self._losses: list = []             # device: the (detached) losses backward saw since the last step
        self._others: list = []             # the losses taken by another optimizer's step since the clock's
        self.loss_seen = False
        self.series = {"loss": [], "grad_norm": [], "lr": []}
        self.reach: list = []               # per step (as series): which parameters its gradient reached, an index into
        self.reach_sets: list = []          # ... these name sets (up to REACH_SETS; None: another, or not read)
        self._reach_seen: dict = {}         # (id of a track, its codes) -> that index
        # (first step, id of the new clock's track, of the old one's, nested) at each hand-over of the count: a
        # clock whose parameters are not nested with the one's before trains another objective (report._objectives)
        self.handovers: list[tuple[int, int, int, bool]] = []
        self.stop_handovers: list[tuple[int, str, str, int]] = []   # (step, new, old, its steps before): a note each
        self._clock_keys: tuple[int, frozenset] | None = None   # the clock's track id and parameter ids
        self._owners: dict[int, int] = {}   # a step since the last read -> id of the track that took it (the clock)
        self.metrics: dict[str, list] = {}  # w.log(name, value): [(step, value)]
        self.events: list[dict] = []        # non-finite values (with replay), found at reads
        self.checks = {"eval_steps": [], "eval_models": {}, "eval_modules": {}, "eval_frozen": {}, "eval_fed": {},
                       "eval_left": {}, "eval_unfed": {}, "eval_region": {}, "eval_top": {}, "unowned_eval": {}, "mode_inert": None,
                       "not_in_optimizer": {}, "updated_by_hand": [], "carried": [], "crossed": {},
                       "dead": {}, "dead_feeds": {}, "dropout_high": {}, "dead_regrouped": set(), "bn_nonfinite": {}, "param_nonfinite": {}, "unhooked": [],
                       "orphaned": set(), "eval_unreached": {}, "val_in_train": {}, "bn_kept": {}, "idle_optimizer": {}, "unheld": {}, "held_late": {}}
        self.ratios: dict[str, list] = {}   # parameter name -> [(step, update/weight ratio)]
        self.reads = 0
        self.pending: list = []             # (kind, payload, tensor) waiting for the next read
        self.batch_size = None
        self.small_batches: dict[int, int] = {}   # step -> its batch, where SMALL_BATCH or less and the first's
                                                  # larger (an epoch's last batch: drop_last=False)
        self._handles: list = []
        self._root_handles: dict[int, list] = {}
        self._reload = None                  # the load_state_dict wrapper while watching (reload.py)
        self._batch_normed = False           # a hooked model has a BatchNorm (its dim 0: samples; _few)
        self._probes: dict[int, object] = {}        # id(root) -> its dead-unit probe of the forward running
        self._inner: weakref.WeakValueDictionary = weakref.WeakValueDictionary()   # id(root) -> the user's module
        self._root_refs: dict[int, weakref.ref] = {}   # id(root) -> a weak reference whose callback notes its end
        self._discovery: list = []
        self._beside = False                     # models given: a teacher beside them is asked (_search)
        self._inert = False                      # ... until a compiled graph traced the asking hooks
        self._grad_seen = False                  # an optimizer's parameter had a gradient at a step (_optimizers_idle)
        self._depth = 0
        self._backward = None
        self._scaler_scale = None           # GradScaler.scale while it is wrapped (_wrap_scaler)
        self._scaler_step = None            # ... and GradScaler.step
        self.scaler_calls = 0               # GradScaler.step calls, and the optimizer steps they applied (not skipped
        self.scaler_applied = 0             # for inf/NaN gradients): counted on the host, no read
        self._in_scaler = 0
        self.scaler = None                  # weakref to the last GradScaler that stepped (its scale, read at the end)
        self.scaled_opts: weakref.WeakSet = weakref.WeakSet()   # the optimizers GradScaler.step was given
        self._scaled: dict | None = None    # id(scaled loss) -> (it, the loss it was made from): _saw_scaled
        self._sample_forward = True         # the next training forward of each model samples dead units
        self.run_compiled = False           # a watched model ran inside a torch.compile of its caller's
        self.compiled_parts: set[str] = set()   # compiled submodules of a watched model (not probed for dead units)
        self.under_functorch = False            # a probed forward ran under torch.func (not probed for dead units)
        self.traced_forward = False             # a forward traced by torch.compile (a compiled training step)
        self._traced: set[int] = set()      # roots a probe hook ran under torch.compile's tracing: not probed again
        self._model_ids_key: tuple = ()
        self._model_ids_cache: set[int] = set()
        self._unowned_sums: dict[int, tuple] = {}   # id -> (weakref, its sum when first seen unowned)
        self._unheld_seen: set[str] = set()          # unowned names already looked for in every live optimizer
        self._unowned: dict[str, tuple[int, int]] = {}   # parameter name -> (first read step, id) of one with a
        # gradient in no optimizer: not-in-optimizer when no optimizer holds it at the end either
        self._sampled: set[int] = set()     # the models sampled since (a GAN's generator and discriminator each)
        self._uncalled_sampling: set[int] = set()   # given models whose forward never ran, sampled over one step
        self.children = Children(self)               # ... and their submodules' calls (a teacher inside them)
        self._first_prints: list | tuple | None = None   # the trained weights before the first update (frozen.copies;
                                                               # a tuple: their prints still on the device)
        self._eval_roots: dict[int, bool] = {}    # id(root) -> its last training forward ran in eval mode
        self._eval_walked: dict[int, int] = {}    # id(root) -> the step its eval-mode forward was last walked at
        self._nograd_train: dict[int, tuple[int, int]] = {}   # id(root) -> (step, its train-mode no_grad calls then)
        self._passes_each_step: set[int] = set()   # roots called so at most steps (a GAN's generator): not looked at
        self._bn_odd: dict[int, list] = {}   # id(root) -> its BatchNorms bn_momentum judges, with their start counts
        self._calls = 0                           # root forwards so far, and id(root) -> the count at its last one
        self._called: dict[int, float] = {}
        self.called_at: dict[int, float] = {}     # id(root) -> the steps taken before its last call
        self._fed_calls: dict[int, float] = {}    # id(root) -> its last call before a backward (_feed), its mode then,
        self._fed_mode: dict[int, bool] = {}      # and the call count at the last backward
        self._fed_mark = 0
        self._step_mark = 0                       # the call count at the last optimizer step's mode check
        self._seen_eval: dict[int, bool] = {}     # discovery: the same, for roots not hooked yet
        self._seen_fed: dict[int, bool] = {}      # discovery: a root called with an input that carries a gradient
        self._left_in_train: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # model -> what its eval()
        # leaves in train (modes.left_in_train)
        self._eval_probed: dict[int, float] = {}  # id(root) -> the call count of its last eval-mode forward whose
        self._eval_reached: dict[int, float] = {}   # output was probed, of the last one autograd reached, of the
        self._eval_reached_bw: dict[int, float] = {}  # last one a Tensor.backward reached,
        self._train_called: dict[int, float] = {}   # and of its last train-mode forward
        self._in_backward = 0                       # inside Tensor.backward (the wrapper's depth)
        self._vain = 0                            # optimizers of no model let go (searched for in vain)
        self._young_gone = -SEARCH_STEPS          # the step at which a one-step clock let go with its model was filed
        self._dead_first: dict[str, tuple] = {}   # module name -> (vector, offset, units): alive at its first sample
        self._dead_plans: dict = {}               # (root, device) -> the last probe's first-alive vector (stats.py)
        self._dead_last: dict = {}                # (root, device) -> (modules, units dead at its last sample)
        self._window = []                   # (step, lr) of steps since the last read
        self._loss_window = []              # per step since the last read: its losses (device 0-dim; [] none)
        self._clip_window: list = []        # ... and the norms clip_grad_norm_ returned before its step (clip.py)
        self.clips = ClipNorms(self)
        self.schedulers = SchedulerCalls(self)
        self.closed = False
        self.broken: str | None = None      # an internal error stopped the watching (a note in the report)
        self._closure_steps: set = set()    # optimizers inside a step(closure) call
        self._closure_calls: dict = {}     # id(optimizer) -> its closure's returns in the step running
        self._evaluates_often: set = set()  # optimizers whose closure ran several times a step (LBFGS)
        self._retired_keys: list = []       # tracks left by add_param_group, until a read has read them
        self._read_after: set = set()       # steps of this read's window whose gradients were read after the update
        self._before_update = True          # the read being made sees the weights before this step's update
        self._first_bad_found = False       # the first non-finite loss or gradient is among the events
        self.dropped_losses = None          # (first step, count, its event): non-finite losses not applied (_dropped)
        self._loss_counts: collections.Counter = collections.Counter()   # backward calls a step takes -> steps
        self._bad_in: tuple | None = None   # (track, its steps since the clock's) of a read a non-clock step made
        self._uncounted: list = []          # (event, id of its track, its steps since the clock's): _credit numbers it
        self.backwards = 0                  # Tensor.backward calls seen: a gradient since a step is a new one
        self.opt_steps = 0                  # outermost optimizer steps of any optimizer (the carry probes' marks)
        # an optimizer's first steps found none of its parameters with a gradient after a backward: the next
        # backward is asked whether it gives them one (then zero_grad() ran between it and step()) or not
        self._starved_probe: dict | None = None
        self._loss_looks: dict[int, int] = {}   # each loss module's inputs looked at (_look_at_loss_input): its own
                                                 # first calls (a review: three auxiliary losses used up the NLLLoss's)
        self._graph_looks = 0               # losses whose autograd graph was looked at (_look_at_graph)
        self._frozen_refs: dict = {}        # name -> the module kept in eval (its running statistics read at the end)
        self._eval_grad: dict[int, bool] = {}   # id -> a dropout/BatchNorm called in eval while asked: any call with grad
        self._shape_looks = 0               # elementwise losses' shapes looked at (_look_at_loss_shapes)
        self._scale_looked = False          # the first training forward's input scale (_look_at_input_scale)
        self.micro = 0                      # the most losses one step's backward calls took (accumulation)
        self.doubles = DoubleSteps()        # one gradient applied twice (double.py)
        self._nograd: dict[int, object] = {}   # id -> frozen.Probe (or None) of modules called under no_grad in discovery
        self._grads: list[bool] = []            # discovery: grad mode of each module call open (frozen.py's tops)
        self.fed_memo: tuple | None = None   # saw_eval_module, during one sampled forward: (trained, clean nodes)
        self._owner_memo: dict = {}          # _owners_of: id(root) -> (key, modules holding trained parameters)
        # optimizers given: one not given that steps a given model's parameters -> [its name, its steps since a
        # given one's last] (a second stage's optimizer after the given one stopped: said, not watched)
        self.unwatched: dict[int, list] = {}

    # ----------------------------------------------------------------- attach / detach
    def attach(self):
        import torch
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        skip_in_dynamo()
        if self.opts_given:
            for opt in list(self._given):
                self._handles.append(opt.register_step_pre_hook(self._pre_step))
                self._handles.append(opt.register_step_post_hook(self._post_step))
            # a new optimizer over exactly a given one's parameters (made again each epoch) is its successor
            self._handles.append(register_optimizer_step_pre_hook(self._successor_pre))
            self._handles.append(register_optimizer_step_post_hook(self._successor_post))
        else:
            self._handles.append(register_optimizer_step_pre_hook(self._pre_step))
            self._handles.append(register_optimizer_step_post_hook(self._post_step))
        for m in self.explicit_models:
            self._hook_root(m)
        # with models given: a model called beside them (a teacher), asked until the first read and in the step after
        # each (_search); not where a given model has a compiled part (the global hooks coming and going recompile it)
        self._beside = not any(compiled(m) for r in self.explicit_models for m in inner(r).modules())
        if not self.explicit_models or self._beside:
            self._discover(True)
        self._backward = torch.Tensor.backward
        # the wrappers hold the engine weakly: a copy of Tensor's attributes taken while one is installed (torch
        # dynamo's, at its first import) would otherwise keep the engine, and the model it tracks, for good
        ref, original = weakref.ref(self), torch.Tensor.backward

        def backward(tensor, *args, **kwargs):
            engine = ref()
            if engine is not None and not engine.closed:   # closed out of order under another's wrapper: pass
                engine.backwards += 1
                engine._feed()
                engine._saw_loss(tensor)
            if engine is not None:
                engine._in_backward += 1
            try:
                out = original(tensor, *args, **kwargs)
            finally:
                if engine is not None:
                    engine._in_backward -= 1
            if engine is not None and engine._starved_probe is not None:
                engine._after_backward()
            return out

        backward.__doc__ = original.__doc__
        torch.Tensor.backward = backward
        self._wrap_scaler()
        self.clips.attach()
        self.schedulers.attach()
        self._reload = reload.attach(self)
        return self

    def _saw_scaled(self, out, outputs) -> None:
        """GradScaler.scale(outputs) gave `out` (a tensor, or a list/tuple of them): each scaled tensor, by id, to
        the one it was made from, until backward is called on it (a few at most: older ones are dropped)."""
        import torch

        pairs = zip(out, outputs) if isinstance(out, (list, tuple)) and isinstance(outputs, (list, tuple)) \
            else [(out, outputs)]
        if self._scaled is None or len(self._scaled) > 16:
            self._scaled = {}
        for o, i in pairs:
            if isinstance(o, torch.Tensor) and o is not i:
                self._scaled[id(o)] = (o, i)

    def _wrap_scaler(self) -> None:
        """GradScaler.scale, wrapped while watching: the loss backward sees is the scaled one (x 65536, doubling
        every growth_interval steps: a review's healthy fp16 run read as loss-diverged); the curve gets the loss
        it was made from."""
        from torch.amp.grad_scaler import GradScaler

        ref, original, step = weakref.ref(self), GradScaler.scale, GradScaler.step
        self._scaler_scale, self._scaler_step = original, step

        @functools.wraps(original)
        def scale(scaler, outputs):
            out = original(scaler, outputs)
            engine = ref()
            if engine is not None and not engine.closed:
                engine._saw_scaled(out, outputs)
            return out

        @functools.wraps(step)
        def scaled_step(scaler, optimizer, *args, **kwargs):
            engine = ref()
            if engine is None or engine.closed or (engine.opts_given and optimizer not in engine._given):
                return step(scaler, optimizer, *args, **kwargs)
            engine.scaled_opts.add(optimizer)   # its parameters are held, stepped or not
            if getattr(optimizer, "_step_supports_amp_scaling", False):   # fused: it steps and skips inside (a read)
                return step(scaler, optimizer, *args, **kwargs)
            engine.scaler_calls += 1
            engine.scaler = weakref.ref(scaler)
            engine._in_scaler += 1
            applied = engine.scaler_applied
            try:
                return step(scaler, optimizer, *args, **kwargs)
            finally:
                engine._in_scaler -= 1
                skipped = engine.tracks.get(id(optimizer)) if engine.scaler_applied == applied else None
                if skipped is not None:   # its window of backwards ends here (a review: two skips, each after a
                    skipped.skipped_at = engine.backwards   # zero_grad, read as gradients cleared before a step)
                if engine.scaler_applied == applied and engine.clock in (None, optimizer):   # skipped (inf/NaN at this
                    engine._losses, engine._others = [], []   # scale): its loss is no later step's (a review: 15
                    # skipped iterations' losses were averaged into the first applied step, called accumulation)

        GradScaler.scale, GradScaler.step = scale, scaled_step

    def close(self):
        import torch

        if self.closed:
            return
        self.closed = True
        for h in self._handles:
            h.remove()
        self._discover(False)
        for hs in self._root_handles.values():
            for h in hs:
                h.remove()
        self._root_handles.clear()
        reload.detach(self._reload)
        for probe in self._probes.values():
            probe.remove()
        self._probes.clear()
        self.children.unhook()
        for t in self.tracks.values():
            t.disarm()
        if self._backward is not None:
            torch.Tensor.backward = self._backward
        if self._scaler_scale is not None:
            from torch.amp.grad_scaler import GradScaler

            GradScaler.scale, GradScaler.step = self._scaler_scale, self._scaler_step
        self.clips.close()
        self.schedulers.close()
        self._scaled = None

    def _discover(self, on: bool):
        if on and not self._discovery:
            from torch.nn.modules.module import (
                register_module_forward_hook,
                register_module_forward_pre_hook,
            )

            self._depth, self._grads = 0, []
            self._discovery = [register_module_forward_pre_hook(self._global_pre),
                               register_module_forward_hook(self._global_post, always_call=True)]
            _quiet_compile_warning(True)
        elif not on:
            for h in self._discovery:
                h.remove()
            if self._discovery:
                _quiet_compile_warning(False)
            self._discovery = []

    @_guarded
    def _global_pre(self, module, args):
        import torch

        if _compiling():   # nothing of ours in a compiled graph (a review: traced in script mode, the graph-task
            # read broke the script's graph 5 times and ran its dropout eagerly); with models given, the hooks stay
            if self._given_models:   # till the end, inert (their going would recompile); written, not read: a read
                self._inert = True   # is a guard, which the write fails once (a recompile)
            self.traced_forward = True
            return
        if self._given_models and self._inert:
            return
        if self._depth == 0 and not self.under_functorch and under_functorch():   # said if no step is ever seen
            self.under_functorch = True
        if isinstance(module, _losses()) and args:
            if self._loss_looks.get(id(module), 0) < LOSS_LOOKS and isinstance(module, _class_losses()):
                self._look_at_loss_input(module, args[0], args[1] if len(args) > 1 else None)
            if self._shape_looks < LOSS_LOOKS and isinstance(module, _elementwise_losses()) and len(args) >= 2:
                self._look_at_loss_shapes(module, args[0], args[1])

        if self._depth == 0 and (self._dead or self._dead_roots):   # let go before the next model's forward
            self._file_dead()
        # a forward run inside a backward is a checkpointed block's recomputation, not a model (a sweep: each
        # torch.utils.checkpoint block was listed as a model of its own)
        grad = torch.is_grad_enabled()
        if torch._C._current_graph_task_id() != -1:   # inside a backward
            probe = self._nograd.get(id(module))
            # run again there with grad on: a checkpoint's recomputation (its output backpropagated to the layers
            # before it), a layer of the trained model, whichever checkpoint ran it (reviews); a teacher recomputed
            # under no_grad by a fused loss's backward, or called from a hook, is not (a seventh review)
            if grad:   # (LATER is never kept)
                recomputed(probe)
        elif not module.training and isinstance(module, mode_sensitive()):   # no input that carries a gradient (under
            # no_grad, or all frozen before it: a teacher in eval): its mode changes no gradient (_read_step_checks)
            fed = grad and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
            self._eval_grad[id(module)] = self._eval_grad.get(id(module), False) or fed
        elif id(module) not in self._nograd and id(module) not in self._root_handles:
            # a forward under no_grad where its caller's had grad (a teacher inside a distiller's forward too), or
            # a model called with grad (its weights frozen, or its output detached: a review; the trained model too,
            # until a read finds it trained): a frozen model (frozen.py)
            if worth_asking(module, grad, not self._grads or self._grads[-1], self._depth == 0):
                probe = frozen_probe(module, self.step, mode_sensitive())
                if probe is not LATER:   # lazy weights not made yet: asked again at its next call
                    self._nograd[id(module)] = probe
        if self._depth == 0 and grad and id(module) not in self._root_handles and not self.explicit_models \
                and torch._C._current_graph_task_id() == -1:
            self.seen_roots[id(module)] = module
            self._seen_since.setdefault(id(module), self.step + 1)   # the step this forward is part of
            self._seen_eval[id(module)] = not inner(module).training   # its mode when called, not when stepped
            # fed a tensor that carries a gradient: it sits between a trained model and the loss (a loss network)
            self._seen_fed[id(module)] = self._seen_fed.get(id(module), False) or any(
                isinstance(a, torch.Tensor) and a.requires_grad for a in args)
            self._called_now(module)
        self._depth += 1
        self._grads.append(grad)

    @_guarded
    def _global_post(self, module, args, output):
        if _compiling() or (self._given_models and self._inert):
            return
        self._depth = max(0, self._depth - 1)
        if self._grads and self._grads.pop():
            passed_through(self._nograd.get(id(module)), output)   # frozen.py


    def _look_at_loss_input(self, module, x, target=None) -> None:
        """CrossEntropyLoss given probabilities (a softmax before it), NLLLoss given them rather than their log: the
        loss module's input at its first calls, judged on the device and read at the next read."""
        import torch

        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 2 or x.shape[1] < 2 \
                or x.numel() == 0:   # a review: an empty selection (no positives in the batch) stopped watch
            return
        self._loss_looks[id(module)] = self._loss_looks.get(id(module), 0) + 1
        # a row's sum is off by its rounding: ~eps per class (a review: bfloat16 softmax rows missed 1e-3)
        tol = max(1e-3, 4 * torch.finfo(x.dtype).eps * math.sqrt(x.shape[1]))
        with torch.no_grad():
            p = x.detach().float()
            flag = p.min() >= 0
            if isinstance(module, torch.nn.CrossEntropyLoss):
                flag = flag & (p.max() <= 1) & ((p.sum(1) - 1).abs().max() < tol)
            self.pending.append(("probs", (self.step + 1, type(module).__name__, int(x.shape[1]),
                                           isinstance(module, torch.nn.CrossEntropyLoss),
                                           math.nan if getattr(module, "weight", None) is not None   # weighted
                                           else float(getattr(module, "label_smoothing", 0.0))),
                                 flag.float().reshape(1)))
            if isinstance(module, torch.nn.NLLLoss):
                self._look_at_nll_input(type(module).__name__, module.ignore_index, p, target)

    def _look_at_nll_input(self, name: str, ignore_index: int, p, target) -> None:
        """NLLLoss given logits (a sweep: raw logits fell to -381 at chance accuracy, and watch passed it): a row it
        scores (not one ignore_index leaves out: a review's zeroed padding) whose finite values have both signs and a
        mean above log(1/k + NLL_FLOOR), k of them. Log-probabilities' mean over k classes is at most log(1/k)
        (Jensen: their probabilities sum to at most 1), log(1/k + eps) with a floor eps added before the log; a
        log-probability row scaled by a weight keeps one sign. Logits near 0 (a small init) have a mean near 0, and
        a class masked to -inf leaves the others' (a review). The worst row's excess over its bound is read, its mean
        and k with it. `name`: the loss module's class, or nll_loss where its graph showed it (F.nll_loss, a module
        called with keywords)."""
        import torch

        if isinstance(target, torch.Tensor) and target.shape == p.shape[:1] + p.shape[2:] \
                and not target.is_floating_point() and target.device.type != "meta":
            scored = (target != ignore_index).to(p.device)
        else:
            scored = torch.ones(p.shape[:1] + p.shape[2:], dtype=torch.bool, device=p.device)
        finite = p.isfinite()
        k = finite.sum(1)
        x = p.masked_fill(~finite, 0)
        both = (x.amax(1) > 0) & (x.amin(1) < 0) & scored & (k > 0)
        mean = x.sum(1) / k.clamp_min(1)
        excess = (mean - (1 / k.clamp_min(1) + NLL_FLOOR).log()).masked_fill(~both, -math.inf).reshape(-1)
        at = excess.argmax()
        read = torch.stack([excess[at], mean.reshape(-1)[at], k.reshape(-1)[at].to(mean.dtype)])
        self.pending.append(("nllpos", (self.step + 1, name, int(p.shape[1])), read))

    def _look_at_input_scale(self, args) -> None:
        """The first training forward's first input, its largest finite |x|, read with the next read: a plateau's hint
        names unnormalised inputs (a sweep: pixels in 0..255 were told "converged, or the rate is too small")."""
        import torch

        # the first input only, its finite values: a float attention mask beside it (-1e9, -inf) is no feature scale
        # (a review)
        x = args[0] if args else None
        self._scale_looked = True
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel():
            with torch.no_grad():
                v = x.detach().float()
                top = v.abs().masked_fill(~v.isfinite(), 0).amax()
            self.pending.append(("inscale", self.step + 1, top.reshape(1)))

    def _look_at_loss_shapes(self, module, x, y) -> None:
        """An elementwise loss whose input and target differ in shape broadcasts them: (N, 1) against (N,) compares
        every prediction with every target (torch warns once; the run goes on). Shapes only: no device read."""
        import torch

        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            return
        self._shape_looks += 1
        if x.shape != y.shape and "loss_broadcast" not in self.checks:
            with contextlib.suppress(RuntimeError):
                both = torch.broadcast_shapes(x.shape, y.shape)
                # both sides grown: (N, 1) with (N,) is (N, N); a scalar or per-feature target is grown alone
                if math.prod(both) > max(x.numel(), y.numel()):
                    self.checks["loss_broadcast"] = (self.step + 1, type(module).__name__, tuple(x.shape),
                                                     tuple(y.shape), tuple(both))

    def _hook_root(self, root):
        if id(root) in self._root_handles:
            return
        self.roots[id(root)] = root
        self._order[id(root)] = len(self.models_seen)
        self._labels.append(label(user_names(root, lambda v: inner(v) is inner(root)), set(self._labels),
                                  type(root).__name__, len(self.models_seen)))
        self.models_seen.append(type(root).__name__)
        if len(self.models_seen) == 2:   # names get a model's label from now on: the first's too, as if it always had
            if self._labels[1] == f"{self._labels[0]}#1":   # one variable for both (a model per fold): `model#0`
                self._labels[0] += "#0"
            self._prefix_first(self._labels[0] + ".")
        self._inner[id(root)] = inner(root)
        self._bn_start(root)
        self._batch_normed = self._batch_normed or _has_batch_norm(inner(root))
        if inner(root).training:   # dropout-rate at its first call too: a fold shorter than `every` has no read
            # (a review); kept by the model's order, not its id, which a later model may take (a review)
            self.checks["dropout_high"][self._order[id(root)]] = dropping_most(inner(root), self.root_prefix(root))
        self._root_refs[id(root)] = weakref.ref(root, functools.partial(_noted, self._dead_roots, id(root)))
        handle = hook_root(root, self._root_pre, self._root_post)
        self._root_handles[id(root)] = [handle]
        if compiled(root):
            self._unhooked("a torch.compile'd model: watch hooks its outer module (steps, loss, "
                                           "gradients, modes); dead units are not checked: compiled code does not "
                                           "call hooks added to its layers after it compiled, and hooks present "
                                           "while it compiles are traced into its graph")

    def loading(self, module, state_dict) -> None:
        """load_state_dict into a watched model whose every parameter the state dict gives as the model's own tensor
        (a `best = model.state_dict()` kept without a copy: it follows the weights as they train): the load restores
        nothing (a sweep: early stopping's "reload the best" was a no-op each time, nothing said). reload.py."""
        if not any(module is r or module is inner(r) for r in self.roots.values()):
            return
        with contextlib.suppress(Exception):   # a help only: tensors without storage (meta, sparse) say nothing
            got = [(state_dict.get(n), p) for n, p in module.named_parameters() if n in state_dict]
            if got and all(getattr(t, "shape", None) == p.shape and t.data_ptr() == p.data_ptr() for t, p in got):
                self.checks.setdefault("reload_own", []).append(self.step)

    def _adopt_roots(self, track: Track):
        """At an optimizer's first steps: the roots seen so far that hold its parameters are the trained models.
        Discovery (a hook on every module call) stays on while an optimizer's model is not found, at most
        SEARCH_STEPS of the clock's steps (_searching): a second model called after the first optimizer's step (a
        review's two models with two optimizers, the second never watched) is found too."""
        ids = {id(p) for p in track.params if p.requires_grad}   # a frozen teacher's weights given to it: not its model
        # once it has a model, only a module apart from every model found: a second head, not a wrapper around the
        # model called once in eval, nor a submodule called directly (a review: a third model, in eval mode)
        held = {id(p) for r in self.roots.values() for p in r.parameters()} if track.roots else set()
        found = [(key, root) for key, root in list(self.seen_roots.items())   # the others stay: a later optimizer
                 if any(id(p) in ids for p in root.parameters()) and held.isdisjoint(map(id, root.parameters()))]
        # a module called on its own that another one found holds (a parametrization, called whenever its weight is
        # read: spectral_norm's, at the model's construction) is part of that model (a sweep: 3 of 5 "models"), when
        # that one was called in train mode (a review: a wrapper called once in eval as a check took the model's place)
        inside = {id(m) for key, root in found if not self._seen_eval.get(key, False)
                  for m in root.modules() if m is not root}
        for key, root in found:
            if id(root) not in inside:
                self._hook_root(root)
                del self.seen_roots[key]
                self._eval_roots[key] = self._seen_eval.get(key, False)   # its forward ran before the hook: step 1
        track.roots = {key for key, r in self.roots.items() if any(id(p) in ids for p in r.parameters())}
        # parameters no model found holds: a second head called apart, after discovery went off for the first
        # optimizer (two tasks in turns: the head's rows were param_groups[0][2]); a bare tensor keeps it on too
        track.unfound = len(ids - {id(p) for key in track.roots for p in self.roots[key].parameters()})
        self._search()
        self._name_params()

    def _adopt_untrained(self) -> None:
        """Models called with gradients on whose trainable parameters got gradients that no optimizer holds: watched
        from now (named, and `not-in-optimizer` at the end). A sweep: a GAN's generator optimizer built over the
        discriminator's parameters left the generator unwatched, and the run passed. With no model found for any
        optimizer, only where every optimizer's parameters are without a gradient (an optimizer built over an EMA copy,
        a sweep: the model trained had no name in the report); an attack's optimizer over its input tensor, which gets
        one, leaves the model it probes alone."""
        if self.explicit_models or not (self.roots or self._optimizers_idle()):
            return
        held = set().union(*(t.keys() for t in self.tracks.values()))
        held |= {id(p) for r in self.roots.values() for p in r.parameters()}
        for key, root in list(self.seen_roots.items()):
            if any(p.requires_grad and p.grad is not None and id(p) not in held for p in root.parameters()) \
                    and id(root) not in self._root_handles:
                self._hook_root(root)
                unowned = [p for p in root.parameters() if p.requires_grad and p.grad is not None and id(p) not in held]
                held |= {id(p) for p in root.parameters()}
                del self.seen_roots[key]
                # called with grad since then: its gradients are not first "seen" at the read that adopted it (a
                # sweep: a GAN's generator in no optimizer, "seen from step 60" at every=10, had them from step 1)
                self._adopted_since[id(root)] = self._seen_since.get(key, self.step)
                prefix = self.root_prefix(root)   # a second model at least: it has one
                named = [(prefix + n, p) for n, p in inner(root).named_parameters() if p.requires_grad]
                # its values now (a sum per tensor, on the device): one the run changes by other means (by hand, an
                # EMA, a copy: a review's DQN target network) is trained, not "never trains"
                # its name: its prefix, or, the one model of the run, its label (an optimizer over an EMA copy: "")
                called = prefix.rstrip(".") or self._labels[self._order[id(root)]]
                self._untrained[called] = ([n for n, _ in named], [weakref.ref(p) for _, p in named],
                                           _sums([p for _, p in named]))
                # their gradients seen now: a loop that sets them to None before each read and the end (Lightning's
                # zero_grad before validation) left a head no optimizer held unsaid in runs under 2 * every (a sweep)
                for n, p in named:
                    if any(p is q for q in unowned):
                        self._saw_unowned(n, p, root)
                # called in eval mode on another model's output: a fixed network put there on purpose (a loss
                # network); one fed the data itself, in eval, is a part meant to train whose optimizer forgot it
                if self._seen_eval.get(key) and self._seen_fed.get(key):
                    self._untrained_eval.add(called)
        self._name_params()

    def _untrained_seen(self) -> bool:
        """A model called with gradients on has trainable parameters no watched optimizer holds: its optimizer may
        not have stepped yet."""
        held = set().union(*(t.keys() for t in self.tracks.values()))
        return any(p.requires_grad and id(p) not in held for r in self.seen_roots.values() for p in r.parameters())

    def _searching(self, track: Track) -> bool:
        """Is the model of this optimizer still looked for: none found yet (or not one holding some of its trainable
        parameters), within SEARCH_STEPS of the clock's steps
        since the optimizer first stepped (an optimizer stepped once, or over a bare tensor, ends its search too)."""
        return ((not track.roots or track.unfound > 0) and track.first_step is not None
                and self.step - track.first_step < SEARCH_STEPS)

    def _search(self) -> None:
        """Discovery on through the clock's first step (every optimizer stepping in that iteration finds its model
        at its own first step), while an optimizer's model is still looked for, and for SEARCH_STEPS steps after a
        clock of one step was let go with its model (a model and its optimizer made anew at every step: off, the next
        model's forward went unseen, its optimizer of no model found could not take the count, and 6 of 10 steps were
        counted, 10 of 2,000 once MAX_SEARCHES ran out); off after: no per-module cost, and the roots seen but not
        adopted are let go."""
        if self.explicit_models:   # no model is looked for: a teacher beside them is asked until the first read, then
            on = self._beside and (self.step < self.opts.every or self.step % self.opts.every == 0)
            if not self._inert and on != bool(self._discovery):    # in the step after each read
                self._discover(on)
            return
        looking = (self.step <= 1 or any(self._searching(t) for t in self.tracks.values())
                   or (self.step <= UNTRAINED_STEPS and self._untrained_seen()))
        on = looking or self.step - self._young_gone < SEARCH_STEPS
        self._discover(on)
        if not looking:   # on for the next model made anew only: what was seen before was adopted, or is not
            self._adopt_untrained()   # trained (a review: every model of the run was kept, 4,000 of them)
            self.seen_roots.clear()
            self._seen_eval.clear()
            self._seen_fed.clear()
            self._seen_since.clear()

    def _note_frozen(self) -> None:
        """(elements, of all elements, names) of the trained models' parameters that require no gradient and that no
        optimizer holds: flags and sizes only, no device read; kept at each read, as the models may be gone when the
        report is made."""
        from torch.nn.parameter import is_lazy

        count, total, names, seen = 0, 0, [], set()
        held = {i for t in self.tracks.values() for i in t.ids}   # an optimizer's: trained (a GAN's discriminator,
        for root in list(self.roots.values()):                     # frozen for the generator's step: a review)
            prefix = self.root_prefix(root)
            for n, p in inner(root).named_parameters():
                if id(p) in seen or is_lazy(p):   # (a lazy module's has no size yet)
                    continue
                seen.add(id(p))
                total += p.numel()
                if not p.requires_grad and id(p) not in held:
                    count += p.numel()
                    names.append(prefix + n)
        if total:
            self.frozen = (count, total, names)

    def _name_params(self):
        names: dict[int, str] = {}
        for root in self.roots.values():
            for n, p in inner(root).named_parameters():
                names.setdefault(id(p), self.root_prefix(root) + n)
        for t in self.tracks.values():
            t.rename(names)

    def _prefix_first(self, prefix: str) -> None:
        """The first model was named alone (no prefix); a second one came (a model per fold, a task's copy). Every
        name made so far is the first model's: it gets its prefix everywhere it is kept, so a parameter has one
        name over the run (fold 1 was `0.weight` and fold 2 `Sequential#1.0.weight`). A name no model gave
        (`param_groups[0][1]`) stays."""
        def ren(name: str) -> str:
            return name if name.startswith("param_groups[") else prefix + name

        def rekey(d: dict) -> dict:
            return {ren(k): v for k, v in d.items()}

        for t in self.tracks.values():
            t.names = [ren(n) for n in t.names]
            if t.first_bad is not None:
                t.first_bad = (t.first_bad[0], [ren(n) for n in t.first_bad[1]])
        self.ratios = rekey(self.ratios)
        self.checks["unowned_eval"] = {ren(k): ren(v) for k, v in self.checks["unowned_eval"].items()}
        self.checks["eval_top"] = {ren(k): ren(v) for k, v in self.checks["eval_top"].items()}
        for key in ("eval_modules", "eval_frozen", "eval_left", "eval_fed", "eval_unfed", "eval_region",
                    "not_in_optimizer", "dead", "bn_nonfinite", "param_nonfinite", "unheld"):
            self.checks[key] = rekey(self.checks[key])
        self._unheld_seen = {ren(k) for k in self._unheld_seen}
        self.checks["dead_feeds"] = {ren(k): ren(v) for k, v in self.checks["dead_feeds"].items()}
        self.checks["dead_regrouped"] = {ren(k) for k in self.checks["dead_regrouped"]}
        self.checks["dropout_high"] = {k: [(ren(n), p) for n, p in v] for k, v in self.checks["dropout_high"].items()}
        self._dead_first = rekey(self._dead_first)   # the units' first sample: a later one is compared with it
        self._unowned = rekey(self._unowned)         # seen in no optimizer at a read: the end judges them
        self._frozen_refs = rekey(self._frozen_refs)
        self.reach_sets = [frozenset(map(ren, names)) for names in self.reach_sets]
        for event in self.events:
            event["params"] = [ren(n) for n in event["params"]]
            rep = event.get("replay") or {}
            if "module" in rep:
                rep["module"] = ren(rep["module"]) if rep["module"] else prefix.rstrip(".")
        named = {"bn": ren, "dead": lambda e: (ren(e[0]), *e[1:])}   # reads not yet taken
        self.pending = [(k, (pl[0], [named[k](e) for e in pl[1]]) if k in named else pl, t) for k, pl, t in self.pending]

    def _optimizers_idle(self) -> bool:
        """Are there optimizers, none of whose parameters had a gradient at any step (_begin), or holds one now? (An
        attack's optimizer over its input, whose gradient is cleared after each step, had one: a review's FGSM with a
        new optimizer per batch, never looked at by the probes.)"""
        return bool(self.tracks) and not self._grad_seen and \
            not any(p.grad is not None for t in self.tracks.values() for p in t.params)

    def root_prefix(self, root) -> str:
        """How a trained model's parameters and modules are named when there are several (a GAN's generator and
        discriminator both have a "0"): the name the user's code gives it (`netG.`), else `Type#i.`; nothing with
        one."""
        if len(self.models_seen) < 2:
            return ""
        order = self._order.get(id(root))
        return f"{self._labels[order]}." if order is not None else f"{type(root).__name__}#{len(self.models_seen)}."

    def model_word(self, name: str) -> str:
        """What a hint calls the model a parameter name is in: its label where there are several (`netD`)."""
        head = name.split(".", 1)[0]
        return head if len(self.models_seen) > 1 and head in self._labels else "model"

    # ----------------------------------------------------------------- the model's forward and backward
    @_guarded
    def _root_pre(self, module, args, kwargs):
        if self.children.hooks:   # its own forward runs: judged as a called model (children.py)
            self.children.unhook(id(module))
        if not _grad_enabled():   # asked once (a call a step counts: the step budget)
            if not self._inner[id(module)].training and not _compiling() \
                    and self._eval_walked.get(id(module)) != self.step:   # a validation pass (a head trained with
                self._eval_walked[id(module)] = self.step                 # the rest in eval runs with grad on)
                self._eval_reaches(module)
            elif self._inner[id(module)].training and self.step and not _compiling():
                self._train_mode_pass(module)
            return
        # vmap/grad's wrapped tensors, kept for a replay or reduced here, would escape the transform (a sweep:
        # DP-SGD's per-sample gradients stopped watch); torch.compile traces under functorch too: its case is below
        if under_functorch() and not _compiling():
            self.under_functorch = True
            return
        self.last_call = (weakref.ref(module), args, kwargs)   # weakly: a model the run lets go must go
        if not self._scale_looked and not _compiling():   # traced into a compiled caller's graph: a graph more
            self._look_at_input_scale(args)
        if self._dead or self._dead_roots:
            self._file_dead()
        self._eval_roots[id(module)] = not self._inner[id(module)].training   # torch.compile: the mode is on theirs
        self._called_now(module)
        if not self._eval_roots[id(module)]:
            self._train_called[id(module)] = self._called[id(module)]
        size = _batch_size(args, kwargs)
        if self.batch_size is None:
            self.batch_size = size
        elif size is not None and size < self.batch_size and _few(size, self.batch_size, self._batch_normed) \
                and len(self.small_batches) < SMALL_BATCHES:   # (a call only for a smaller batch: the step budget)
            self.small_batches[self.step + 1] = size   # the loss and the step this forward makes
        if self._sample_forward and id(module) not in self._sampled and not compiled(module) \
                and id(module) not in self._traced:
            if _compiling():   # torch.compile(model) called, the model watched: hooks added now would be traced
                self.run_compiled = True   # into its graph and recompile it at every read (a review: 2x the time)
                return
            self._sampled.add(id(module))
            self._sample_forward = len(self._sampled) < len(self.roots)   # until every trained model had one
            from .stats import DeadUnits

            probe = self._probes[id(module)] = DeadUnits(self, module)
            probe.attach()

    @_guarded
    def _root_post(self, module, args, output):
        probe = self._probes.pop(id(module), None) if self._probes else None
        if probe is not None:
            probe.collect()
        if self._eval_roots.get(id(module)) and _grad_enabled() and not _compiling() and not under_functorch():
            self._probe_eval_output(id(module), output)

    def _train_mode_pass(self, module) -> None:
        """A trained model called under no_grad in train mode between two steps: a pass over held-out batches (a
        validation that forgot model.eval()) where its dropout draws and its BatchNorm learns those batches. The steps
        it happens at are counted: a GAN's no_grad generator (each critic step) or MixMatch's label guessing does it
        at every step, a validation now and then (report._val_in_train); a second call in one interval marks a loop
        over batches. Before the first step: a data-dependent init's passes. Host flags only, one walk of the model
        at the first call of an interval, none once the calls come at most steps."""
        import torch

        if torch._C._current_graph_task_id() != -1:   # inside a backward: a checkpoint's recomputation
            return
        key = id(module)
        step, n = self._nograd_train.get(key, (self.step, 0))
        n = n + 1 if step == self.step else 1
        self._nograd_train[key] = (self.step, n)
        found = self.checks["val_in_train"].get(key)
        if n == 2 and found is not None and found["last"] == self.step:   # a loop of them: counted apart, so a
            found["multi"] = True                                          # single look at every step (a train
            found["multi_steps"] += 1                                      # accuracy) hides no validation loop
            if found["multi_from"] is None:
                found["multi_from"] = self.step
        if n != 1 or key in self._passes_each_step:
            if n == 1 and found is not None:
                found["last"] = self.step
            return
        inner = self._inner[key]
        drop = [name for name, m in inner.named_modules() if name and m.training and
                isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0]
        bns = [m for name, m in inner.named_modules() if name and m.training and
               isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
        if any(m.momentum is None or m.momentum == 1.0 for m in bns):   # a recalibration: swa_utils.update_bn's
            return   # cumulative average, fvcore's PreciseBN (detectron2) at momentum 1 while it sums the batches itself
        bns = [name for name, m in inner.named_modules() if any(m is b for b in bns)]
        if not drop and not bns:
            return
        found = self.checks["val_in_train"].setdefault(
            key, {"step": self.step, "dropout": drop, "bn": bns, "steps": 0, "multi": False, "last": None,
                  "multi_steps": 0, "multi_from": None})
        found["steps"] += 1
        found["last"] = self.step
        if self.step >= 20 and found["steps"] > self.step // 2:   # at most steps: never said, no more walks
            self._passes_each_step.add(key)
            found["each_step"] = True

    def _eval_reaches(self, module) -> None:
        """A forward of a model put in eval (a validation pass): did eval() reach its dropout and BatchNorm? A
        train()/eval() override that sets only its own flag (`self.training = mode`, no super().train), at the root or
        in a block, or switches only part of the model (a frozen encoder's), leaves submodules in train mode:
        validation runs with dropout on and BatchNorm learning the validation batches (reviews). A module in train
        mode now may also have been put back on purpose after eval() (MC dropout's stochastic passes, a head trained
        apart): what tells them apart is what the model's eval() does, asked of a weightless copy once per model
        (modes.left_in_train: never of the model itself, whose eval() may swap weights), and only where a module
        overrides train() or eval(). Asked of forwards under no_grad with a dropout of p > 0 or a BatchNorm in train
        mode; once per model per step (host flags only, no sync)."""
        inner = self._inner[id(module)]
        sensitive = mode_sensitive()
        acting = [n for n, m in inner.named_modules() if n and m.training and isinstance(m, sensitive)
                  and (not hasattr(m, "p") or m.p > 0)]
        if not acting:
            return
        from .modes import FAILED, left_in_train

        if inner not in self._left_in_train:
            self._left_in_train[inner] = left_in_train(inner, sensitive)
        left = self._left_in_train[inner]
        if left == FAILED:   # no copy to ask (a lock, an open file): the flags alone, every other module in train
            rest = [m for n, m in inner.named_modules() if n and not isinstance(m, sensitive)]
            names = acting if rest and all(m.training for m in rest) else []
        else:
            names = [n for n in acting if left is not None and n in left]
        if names:
            self.checks["eval_unreached"].setdefault(id(module), (self.step, names))

    def _probe_eval_output(self, r: int, output) -> None:
        """An eval-mode forward with grad on: does a backward reach its output? A hook on the output's graph node says
        so when one does (a held-out accuracy taken between the training forward and its backward, only read, was
        `trained-in-eval-mode` on every step: a sweep). Rare on a healthy run, so free where it matters."""
        from ...core.recording import float_tensors

        fns = {id(t.grad_fn): t.grad_fn for t in float_tensors(output) if t.grad_fn is not None}
        if not fns:   # nothing a backward could reach (or outputs not found): judged as before, by the mode
            return
        call, ref = self._called.get(r, 0), weakref.ref(self)
        self._eval_probed[r] = call

        def reached(*_):
            engine = ref()
            if engine is not None:
                engine._eval_reached[r] = max(engine._eval_reached.get(r, 0), call)
                if engine._in_backward:
                    engine._eval_reached_bw[r] = max(engine._eval_reached_bw.get(r, 0), call)

        for fn in fns.values():
            fn.register_prehook(reached)

    def _fed_in_eval(self, r: int, since: float, fed: bool) -> bool:
        """Since `since`: no eval-mode forward of `r` probed; or no train-mode one (the gradients came from the eval
        ones, by whatever path: a review's loss on a feature a hook kept, the output unread); or a backward reached
        an eval one's output (with backwards seen, a Tensor.backward: a review's input saliency taken by
        autograd.grad in eval, between the training forward and its backward, reached it too)."""
        if self._eval_probed.get(r, 0) <= since or self._train_called.get(r, 0) <= since:
            return True
        return (self._eval_reached_bw if fed else self._eval_reached).get(r, 0) > since

    @_guarded
    def _saw_loss(self, tensor):
        scaled = self._scaled.pop(id(tensor), None) if self._scaled else None
        if scaled is not None and scaled[0] is tensor:
            tensor = scaled[1]   # GradScaler's: the loss before it was scaled
        if tensor.numel() != 1 or not tensor.requires_grad or not tensor.is_floating_point():
            return
        self.loss_seen = True
        self._losses.append(tensor.detach())   # one op; averaged per step at the read
        self._host_losses = tensor.device.type == "cpu"
        if self._bad_call is None and self._host_losses and self.opts.replay and not _finite_here(tensor):
            # under accumulation the step's forwards are several: the replay takes the one whose loss went bad,
            # not the last (a sweep: a NaN input in micro-batch 3 of 4 was blamed on the loss). On the host a look
            # through NumPy is free (no op, no wait); on an accelerator it would be a sync per backward (the replay
            # then says it took the last)
            self._bad_call = self.last_call
        if self._graph_looks < GRAPH_LOOKS and tensor.grad_fn is not None:
            self._graph_looks += 1
            self._look_at_graph(tensor.grad_fn)

    def _look_at_graph(self, fn) -> None:
        """The ops nearest the loss (graph.py): a softmax into cross_entropy or nll_loss, an elementwise loss that
        broadcast both sides, a dropout on what the loss reads, however the loss was written (F.cross_entropy, a
        module, by hand). Shapes only, but a CPU dropout mask's values (graph._dropped)."""
        import torch

        from .graph import loss_faults

        try:
            faults = loss_faults(fn)
        except Exception:   # a help only: a graph it cannot read (an op's saved values released) says nothing
            return
        for fault in faults:
            if fault[0] == "target":
                self._look_at_labels(fn, *fault[1:])
                continue
            if fault[0] == "ctc":
                self._look_at_ctc(*fault[1:])
                continue
            if fault[0] == "nll":   # nll_loss's input, however it was called: its values looked at as a module's are
                x, target, ignore = fault[1:]
                if x.is_floating_point() and x.dim() >= 2 and x.shape[1] >= 2 and x.numel():
                    with torch.no_grad():
                        self._look_at_nll_input("nll_loss", ignore, x.detach().float(), target)
                continue
            kind = {"probs": "probs_into_loss", "broadcast": "loss_broadcast", "dim": "loss_dim",
                    "sigmoid": "sigmoid_into_loss", "classes": "loss_classes", "dropout": "dropout_into_loss",
                    "minimised": "loss_minimised"}[fault[0]]
            if kind == "dropout_into_loss":   # looks, and those whose mask averaged exactly 1 (graph._dropped)
                looks = self.checks.setdefault("dropout_looks", [0, 0])
                looks[0], looks[1] = looks[0] + 1, looks[1] + fault[3]
                fault = fault[:3]
            self.checks.setdefault(kind, (self.step + 1, *fault[1:]))

    def _look_at_labels(self, fn, target, ignore: int) -> None:
        """labels-are-inputs: a cross-entropy's targets that are, position for position, ids an embedding of the model
        looked up on the loss's graph (graph.looked_up): a language model asked for the token it is given, labels not
        shifted (a sweep's planted bug: the loss fell to ~0, nothing said). The ids the model read, not its first
        integer argument: a review's Whisper, TrOCR and T5 given inputs_embeds have `labels` as their only one, shift
        them into the decoder themselves, and were said. Positions the loss ignores are left out; ids constant along
        every row, or of fewer than 3 values (a mask), are no sequence. Judged on the device, read with the next read."""
        import torch

        from .graph import looked_up

        if not isinstance(target, torch.Tensor) or target.is_floating_point() or target.numel() < 2:
            return
        y = target.reshape(-1)
        scored = y != ignore
        flags = []
        with torch.no_grad():
            for t in looked_up(fn):
                if t.dim() < 2 or t.numel() != y.numel() or t.device != y.device:
                    continue
                rows = t.reshape(t.shape[0], -1)
                flags.append(((rows.reshape(-1) == y) | ~scored).all() & (rows[:, 1:] != rows[:, :-1]).any()
                             & (t.amax() - t.amin() >= 2))
                shape = tuple(t.shape)
            if not flags:
                return
            flag = torch.stack(flags).any() & (scored.sum() >= 2)
        self.pending.append(("labels", (self.step + 1, shape), flag.float().reshape(1)))

    def _look_at_ctc(self, targets, lengths: tuple, blank: int) -> None:
        """ctc-blank-in-targets: ctc_loss's labels, within their lengths, holding its blank index (a sweep's planted
        bug, blank=C-1 with labels 1..C-1: CTC reads the blank as "no label", the loss went below 0, nothing said;
        torch does not check). Counted on the device, read with the next read."""
        import torch

        if not isinstance(targets, torch.Tensor) or targets.is_floating_point() or not targets.numel():
            return
        with torch.no_grad():
            if targets.dim() == 2:   # padded (N, S): the first length[i] of row i are labels
                n = torch.tensor(lengths, device=targets.device).reshape(-1, 1)
                within = torch.arange(targets.shape[1], device=targets.device) < n
            else:                    # concatenated: every one is a label
                within = torch.ones_like(targets, dtype=torch.bool)
            hits = ((targets == blank) & within).sum()
        self.pending.append(("ctcblank", (self.step + 1, blank, sum(lengths)), hits.float().reshape(1)))

    # ----------------------------------------------------------------- optimizer steps
    @property
    def clock(self):
        """The optimizer whose steps are the run's steps: the first to step that trains a model. Held weakly:
        when the run lets it go (a new optimizer each epoch), the next one to step that trains a model takes
        over and the count goes on."""
        return self._clock() if self._clock is not None else None

    @clock.setter
    def clock(self, opt) -> None:
        self._clock = weakref.ref(opt) if opt is not None else None

    def _track(self, opt) -> Track | None:
        if self._dead or self._dead_roots:
            self._file_dead()
        t = self.tracks.get(id(opt))
        left = self._regroup(opt, t) if t is not None and (len(opt.param_groups) != t.groups or t.lazy_made) else None
        if left is not None:
            t = None
        if t is None:
            if not self._mine(opt):
                return None
            if _sharded(opt):   # fully_shard's DTensor parameters: said once, not read (a sweep: exit 4 at step 1)
                self._unhooked("an optimizer over fully_shard (FSDP2) sharded parameters is not watched: its "
                               "per-step checks read whole tensors; watch the run under DDP, or one rank's model")
                return None
            weakref.finalize(opt, self._dead.append, id(opt))
            t = self._successor(opt)
            if t is not None:
                self.tracks[id(opt)] = t
            else:
                t = self.tracks[id(opt)] = Track(opt, self.opts)
                t.marks = self._marks()
                t.first_before_backward = self.backwards == 0
                # a search for its model, while fewer than MAX_SEARCHES optimizers were searched for in vain (one
                # made every iteration for an attack would keep every module call hooked; one a fold is found)
                t.first_step = self.step if self._fruitless() < MAX_SEARCHES else None
                self._adopt_roots(t) if not self.explicit_models else self._name_params()
        elif self._searching(t) and not self.explicit_models:
            self._adopt_roots(t)
        if left is not None:
            t.inherit(left)   # one optimizer: its steps go on counting
            if opt is self.clock:
                self._hand_over(t)   # nested with the old track's: the same objective, one loss curve
        self._choose_clock(opt, t)
        return t

    def _marks(self):
        """(optimizer steps, backward calls) so far, for a track's carry probes; the engine held weakly."""
        ref = weakref.ref(self)

        def marks() -> tuple[int, int]:
            engine = ref()
            return (engine.opt_steps, engine.backwards) if engine is not None else (0, 0)
        return marks

    def _regroup(self, opt, old: Track) -> Track:
        """`opt` took a param group more (a backbone unfrozen with add_param_group), or a lazy module it holds was
        made (first called after the first step: its weights trained unwatched, told "never changed"; seen at the next
        read): its track stays as a let-go
        optimizer's, and a new one, made by the caller, holds every parameter from this step on (a sweep: the added
        ones were never watched, their NaN gradient applied unseen). Nested with the old: one objective. Returns
        the track left, for the new one to take its counts from."""
        del self.tracks[id(opt)]
        self.tracks[("gone", id(old))] = old
        old.retire()
        self._retired_keys.append(("gone", id(old)))   # kept until a read has read its rows (a review: a group
        self.doubles._stale = True                      # added each step kept 400 tracks, 4x the time)
        return old

    def _choose_clock(self, opt, t: Track) -> None:
        """Which optimizer's steps are the run's steps: the first to step, with two exceptions.
        - An optimizer of no model that first stepped while a model with trainable parameters no optimizer held was
          being called (PGD's attack on the input, before the model's optimizer first steps) is the clock only
          provisionally: no read is made on its steps, and when a model's optimizer steps within UNTRAINED_STEPS
          the count starts again with it. Past that it is the clock for good (an image optimised through a
          network left trainable). An optimizer of no model with nothing else around it (3D Gaussians, a NeRF's
          grid) is the clock from its first step.
        - An optimizer over some of the clock's parameters (the same ones made again while the old one is kept,
          layers unfrozen, the head alone after the body was frozen) that steps twice with no step of the clock
          between takes over, and the count goes on (a review: the head's 30 steps were not counted while the
          first phase's optimizer, idle, was kept in a variable).
        - A clock that stops while kept alive (a teacher's optimizer, then a student's; a first stage's, then the
          next) gives way to a model's optimizer that took more steps since its last than it ever took between two of
          the clock's, CLOCK_STOPPED times over, and more than 2 x every (_stopped). Not at any count: a second review
          saw that steal the clock of healthy GANs whose critic steps 100 times per generator step. Until then its
          rows pile up unread (a review: a student's 171 steps at lr 20 passed unjudged)."""
        clock = self.clock
        if clock is None:
            if self._may_clock(t):
                self._hand_over(t)
                self.clock = opt
                self._provisional = not t.roots and not self.explicit_models and self._untrained_seen()
                self._credit(t, t.unclocked)   # steps it took with no clock at all (k-fold: its model found late)
            return
        if opt is clock or not (t.roots or self.explicit_models):   # a model given: its optimizers' (a review: an
            return   # optimizer over the unfrozen model, the head's kept, counted 13 of 40 steps under watch(model))
        held = self.tracks.get(id(clock))
        if self._provisional:
            self._restart_count()
            self._hand_over(t)
            self.clock = opt
        elif held is not None and t.since_clock >= 1 and not held.ids.keys().isdisjoint(t.ids):
            self._hand_over(t)
            self.clock = opt
            self._credit(t, t.since_clock)   # its step before this one, which the clock it replaces did not count
        elif held is not None and self._stopped(t):
            self.stop_handovers.append((self.step + 1, _kind_over(t), _kind_over(held), t.since_clock))
            self._hand_over(t)
            self.clock = opt
            self._credit(t, t.since_clock, t.own_losses)   # its steps since the clock's last, each with its losses

    def _stopped(self, t: Track) -> bool:
        """Has the clock stopped for t's optimizer (_choose_clock)? Asked at t's step, of t's steps since the clock's
        last; the clock itself must have held the count for 2 x every steps (a first burst of a GAN's critic after one
        generator step has no history to be judged against)."""
        every = self.opts.every
        return (bool(t.roots) and not t.released and self.step >= 2 * every
                and t.since_clock > max(2 * every, CLOCK_STOPPED * t.peak_since))

    def _bn_start(self, root) -> None:
        """A hooked model's BatchNorms of a momentum core/bn_momentum judges (rare: host flags), with their batch
        counts as they start (on the device, no read): at each read, those that counted batches since are judged."""
        from ...core.bn_momentum import odd

        found = odd(inner(root))
        if found:
            self._bn_odd[id(root)] = [(n, weakref.ref(m), m.num_batches_tracked.detach().clone()) for n, m in found
                                      if m.num_batches_tracked is not None]

    def _bn_kept(self) -> None:
        """At a read: batchnorm-momentum of each hooked model's judged BatchNorms that ran in train mode since it was
        hooked (one read, only where such a BatchNorm exists), kept by the model's id: a model local to the script's
        main() is gone by the report (a review: never said)."""
        import torch

        from ...core.bn_momentum import kept_statistics

        for rid, entries in list(self._bn_odd.items()):
            root, live = self.roots.get(rid), [(n, r(), c) for n, r, c in entries if r() is not None]
            if root is None or not live:
                continue
            grew = torch.stack([(m.num_batches_tracked.to(c.device) > c) for _, m, c in live]).tolist()
            only = {n for (n, _, _), g in zip(live, grew) if g}
            self.checks["bn_kept"][rid] = kept_statistics(inner(root), self.root_prefix(root), only) if only else []

    def _queue_bn_stats(self, kinds) -> None:
        """The norms of every watched model's normalisation statistics (`kinds`: mode_sensitive's modules), queued
        for the next read: a non-finite one is non-finite-bn-stats."""
        import torch

        from ...core.lazy import is_uninitialised

        stats = []
        for root in self.roots.values():
            prefix = self.root_prefix(root)
            stats += [(f"{prefix}{name}.{b}", t) for name, m in inner(root).named_modules()
                      if isinstance(m, kinds)   # (a lazy BatchNorm never called has no statistics yet: a review)
                      for b, t in (("running_mean", m.running_mean), ("running_var", m.running_var))
                      if t is not None and not is_uninitialised(t)]
        if stats:
            with torch.no_grad():
                norms = torch.stack([n.float() for n in norms32([t for _, t in stats])])
            self.pending.append(("bn", (self.step, [n for n, _ in stats]), norms))

    def _stopped_at_end(self) -> None:
        """The run ended with the clock idle while a model's optimizer took END_STOPPED steps or more since the clock's
        last, CLOCK_STOPPED times its longest run of steps between two of the clock's: the clock had stopped, and
        those steps are counted and judged as _stopped's handover counts them (a sweep: a teacher's 16 steps, then a
        student's 48 at lr 1e4 whose BatchNorm statistics went non-finite; `2 x every` was never reached, and the run
        passed on the teacher's 16). A GAN's critic burst at the end is no longer than its bursts before."""
        held = self.tracks.get(id(self.clock)) if self.clock is not None else None
        if held is None or self._provisional:
            return
        stopped = [t for t in self.tracks.values() if t is not held and (t.roots or self.explicit_models)
                   and not t.released
                   and t.since_clock >= END_STOPPED and t.since_clock > CLOCK_STOPPED * t.peak_since]
        opt = max(stopped, key=lambda t: t.since_clock)._opt() if stopped else None
        if opt is None:
            return
        t = self.tracks[id(opt)]
        self.stop_handovers.append((self.step + 1, _kind_over(t), _kind_over(held), t.since_clock))
        self._hand_over(t)
        self.clock = opt
        self._credit(t, t.since_clock, t.own_losses)

    def _hand_over(self, t: Track) -> None:
        """The count passes to t's optimizer (the first, one taking over, one after the clock was let go): noted with
        whether its parameters are nested with the last clock's (the same objective: made again, layers unfrozen, the
        head alone) or not (another: report._objectives)."""
        keys = frozenset(t.ids)
        last = self._clock_keys
        if last is not None and last[0] != id(t):
            self.handovers.append((self.step + 1, id(t), last[0], last[1] <= keys or keys <= last[1]))
        self._clock_keys = (id(t), keys)

    def _credit(self, t: Track, n: int, losses: list | None = None) -> None:
        """n steps the new clock took that no clock counted: counted now, the last with the loss its step took (or, given
        `losses` of each of them, each with its own). Its rows of them (gradient norms) had the old count's numbers:
        renumbered, so that the series' norms are its own."""
        rows = min(n, len(t.steps))
        t.steps[len(t.steps) - rows:] = range(self.step + n - rows + 1, self.step + n + 1)
        own = losses[-n:] if losses else None
        for k in range(n):
            self.step += 1
            self._owners[self.step] = id(t)
            self._window.append((self.step, t.lr()))
            if own is not None:   # the last len(own) steps' own losses (the first ones', before it was tracked: none)
                self._loss_window.append(own[k - (n - len(own))] if k >= n - len(own) else [])
            else:
                self._loss_window.append(self._others if k == n - 1 else [])
            self._clip_window.append(t.last_clip if k == n - 1 else [])   # its norm before clipping (a review)
        if n:
            self._others, t.last_clip = [], []
        self._renumber_uncounted(t, self.step - n, losses[-n:] if losses and n else None)
        t.since_clock, t.own_losses = 0, []   # counted now: no gap between the clock's steps (its peak_since)

    def _renumber_uncounted(self, t: Track, base: int, losses: list | None) -> None:
        """The first non-finite value found in a step of t's that no clock had counted (a review: a second stage's
        NaN at its 11th step was said at the first stage's last step, 300, as a gradient): now that t's steps are
        base + 1 on, the event gets its step, and is a loss when that step's own loss was non-finite."""
        mine = [u for u in self._uncounted if u[1] == id(t)]
        self._uncounted = [u for u in self._uncounted if u[1] != id(t)]
        for e, _, k in mine:
            if k < 1:
                continue
            e["step"] = base + k
            own = losses[k - 1] if losses and k <= len(losses) else None
            if own and nonfinite_losses(own):
                e["kind"] = "loss"
            if t.first_bad is not None:
                t.first_bad = (e["step"], t.first_bad[1])

    def _may_clock(self, t: Track) -> bool:
        """No clock: an optimizer of no model takes it only while no optimizer of a model has stepped."""
        return bool(self.explicit_models or t.roots) or not any(o.roots for o in self.tracks.values())

    def _restart_count(self) -> None:
        """The provisional clock's steps were an attack's: they were never read (no callback, no TensorBoard saw
        them), and what they left in memory goes; the tracks of no model start again when they next step."""
        self.step, self._provisional, self._first_bad_found, self._last_read = 0, False, False, 0
        self.dropped_losses = None
        self._window, self._loss_window, self._others, self.pending = [], [], [], []   # _losses: the new clock's
        self.handovers, self._clock_keys, self._owners, self.stop_handovers = [], None, {}, []
        self._clip_window = []
        for key, t in list(self.tracks.items()):
            if not t.roots:
                t.disarm()
                del self.tracks[key]
                self.let_go += 1

    def _successor(self, opt) -> Track | None:
        """A new optimizer over exactly the parameters of one the run let go (made again each epoch) goes on
        with its track: the same rows, the same statistics, no parameter listed twice."""
        params = [id(p) for g in opt.param_groups for p in g["params"]]
        for key, t in list(self.tracks.items()):
            # a gone one's only: a live one's optimizer is still stepping (a SAM wrapper's inner optimizer holds
            # the same parameters; so does a second optimizer used in turn)
            if isinstance(key, tuple) and t.same_params(params):
                del self.tracks[key]
                # the one before took one step, and this one starts with no state (not load_state_dict's: a review)
                if t.stepped - t.adopted_at <= 1 and not any(len(s) for s in opt.state.values()):
                    self.remade += 1
                t.adopt(opt)
                return t
        return None

    def _file_dead(self) -> None:
        """Optimizers the run let go since the last step (weakref.finalize only notes their ids: a collection
        can run inside our own loops): a model's track stays, for the report and a successor, holding its
        parameters weakly (Track.release); one of no model is dropped with what it held (an attack's, made per
        step, would pile up rows and never-gets-grad). Models let go leave nothing behind but their names."""
        while self._dead_roots:
            rid = self._dead_roots.pop()
            for h in self._root_handles.pop(rid, []):
                h.remove()
            self._root_refs.pop(rid, None)
            self._probes.pop(rid, None)
            self._eval_roots.pop(rid, None)
            self._sampled.discard(rid)
            for key in [k for k in self._dead_plans if k[0] == rid]:
                del self._dead_plans[key]
            for key in [k for k in self._dead_last if k[0] == rid]:
                del self._dead_last[key]
        while self._dead:
            key = self._dead.pop()
            self._evaluates_often.discard(key)   # its id may be reused by a new optimizer
            t = self.tracks.pop(key, None)
            if t is None:
                continue
            one_off = bool(t.roots) and t.stepped <= 1 and not self.explicit_models and (
                not any(r in self._root_refs for r in t.roots))   # a model and its optimizer made anew
            if one_off and self._clock_keys is not None and self._clock_keys[0] == id(t):   # at every step (_search)
                self._young_gone = self.step
            if t.roots or self.explicit_models:   # armed probes stay: a successor's first step reads them (cut at
                self.tracks[("gone", id(t))] = t  # another optimizer's step, they saw a false carry-over)
                t.release()
                if one_off:   # kept through the next read (its non-finite gradient, a smoke run's findings)
                    self._one_off_keys.append(("gone", id(t)))
            else:
                if id(t) in self._owners.values():   # the clock's rows of this window: its steps' norms (a review:
                    self.pending += [q for q in t.queued(False) if q[0] in ("grad_norm", "reach")]   # one re-made every 10 steps)
                t.disarm()
                self.let_go += 1
                self._vain += t.first_step is not None

    def _drop_retired(self) -> None:
        """After a read: the tracks that optimizers left when they took a param group more (_regroup) go, their rows
        read; their parameters are the new tracks' (a group deleted leaves its parameters in no optimizer)."""
        for key in self._retired_keys:
            t = self.tracks.pop(key, None)
            if t is not None:
                t.disarm()
        self._retired_keys = []

    def _drop_one_offs(self) -> None:
        """After a read: the one-step models' tracks it read go, but the last (a smoke run's one step keeps its
        findings). Each kept would cost every later step (a review: 56 ms a step by a 4,000th model made anew). What a
        read reads of them stays (a non-finite gradient, eval mode, parameters in no optimizer); what the report
        decides from a track at the end (never-gets-grad, never-changes, loss-ignores-parameters) is the last one's."""
        for key in self._one_off_keys[:-1]:
            t = self.tracks.pop(key, None)
            if t is not None:
                if len(self.one_off_starts) < ONE_OFF_STARTS and t.start is not None:
                    self.one_off_starts.append(([tuple(p.shape) for p in t.params], t.start))
                t.disarm()
                self.one_offs += 1
        self._one_off_keys = self._one_off_keys[-1:]

    def _fruitless(self) -> int:
        """Optimizers whose model was looked for in vain: let go with none (an attack's, made per batch), or alive
        with none past their search."""
        return self._vain + sum(1 for t in self.tracks.values() if (not t.roots or t.unfound) and t.first_step is not None
                                and self.step - t.first_step >= SEARCH_STEPS)   # a bare temperature: its part in vain

    def _mine(self, opt) -> bool:
        """Without optimizers given, an optimizer is watched when it steps parameters of a model given
        (or, with no model given either, always)."""
        if self.opts_given or not self.explicit_models:
            return True
        ids = {id(p) for m in self.explicit_models for p in m.parameters()}
        return any(id(p) in ids for g in opt.param_groups for p in g["params"])

    def _succeeds_given(self, opt) -> bool:
        """With optimizers given: is `opt` a new one over exactly the parameters of a watched one (the same
        training made again), not one of those given (their own hooks see them)?"""
        if opt in self._given:
            return False
        self._file_dead()   # the given one may just have been let go
        if id(opt) in self.tracks:
            return True
        if any(_shares_groups(opt, g) and id(g) not in self.tracks for g in self._given):
            return True   # the inner optimizer of a given wrapper that never steps itself (SAM's first/second_step)
        params = [id(p) for g in opt.param_groups for p in g["params"]]
        return any(isinstance(key, tuple) and t.same_params(params) for key, t in self.tracks.items())

    def _successor_pre(self, opt, args, kwargs):
        if opt in self._given:   # its own hooks see it (the per-step path: one look, no call)
            return None
        return self._not_given_step(opt, args, kwargs, True)

    def _successor_post(self, opt, args, kwargs):
        if opt in self._given:
            return None
        return self._not_given_step(opt, args, kwargs, False)

    @_step_hook
    def _not_given_step(self, opt, args, kwargs, pre: bool):
        if self._succeeds_given(opt):
            return self._pre_step(opt, args, kwargs) if pre else self._post_step(opt, args, kwargs)
        return self._other_pre(opt, args, kwargs) if pre else self._other_post(opt)

    @_step_hook
    def _other_pre(self, opt, args, kwargs):
        """With optimizers given, one not given (nor a successor) is not watched, but a second optimizer over
        the given one's parameters is how a gradient is applied twice (double.py); a given one's hooks run after."""
        if opt in self._given:
            return
        closure = _has_closure(args, kwargs)
        nested, again = self.doubles.enter(opt, self.backwards, closure)
        self.opt_steps += not nested
        if not nested:   # the losses before it were its own (`Watch(gen, opt_g)`: the discriminator's), as in _begin;
            self._took_losses()   # its clip calls are not dropped (a review: a wrapper not given, stepping the given
                                  # optimizer inside its step, lost the norm before clipping)
            self._count_unwatched(opt)
        if not nested and not closure:
            self.doubles.applied(opt, self.tracks, self.step, self._model_ids)

    def _count_unwatched(self, opt) -> None:
        """A step of an optimizer not given over a given model's parameters: counted since a given one's last step
        (a second stage's optimizer after the given one stopped: its steps are said, not watched)."""
        entry = self.unwatched.get(id(opt))
        if entry is None:
            names = {id(p): self.root_prefix(r) + n for r in self.explicit_models for n, p in inner(r).named_parameters()}
            mine = [names[id(p)] for g in opt.param_groups for p in g["params"] if id(p) in names]
            if not mine:
                return
            entry = self.unwatched[id(opt)] = [f"{type(opt).__name__} over {mine[0]}", 0]
        entry[1] += 1

    @_step_hook
    def _other_post(self, opt):
        if opt in self._given:
            return
        nested, closure, _ = self.doubles.leave(opt)
        if closure and not nested:
            self.doubles.applied(opt, self.tracks, self.step, self._model_ids)

    @_step_hook
    def _pre_step(self, opt, args, kwargs):
        closure = _has_closure(args, kwargs)
        nested, again = self.doubles.enter(opt, self.backwards, closure)
        if again:   # a subclass's super().step(): the hooks of one update, run twice
            return None
        self.opt_steps += not nested
        if self._in_scaler and not nested:   # GradScaler.step found the gradients finite and applies them
            self.scaler_applied += 1
        if self._dead or self._dead_roots:   # a let-go LBFGS's id, reused by this optimizer, is not an LBFGS (a review)
            self._file_dead()
        t = self.tracks.get(id(opt))
        if t is not None and t.early:   # a step(closure) of it raised after its early samples (a review: the next
            t.early, t.before = False, None   # read's ratio started from SAM's ascent point, 16x off)
        self._closure_steps.discard(id(opt))   # a step(closure) of it that raised is over (a review: its next plain
        self._closure_calls.pop(id(opt), None)  # step was read twice, a false double-step)
        if closure:
            self._closure_steps.add(id(opt))
            if id(opt) in self._evaluates_often:   # LBFGS: read after the step, its loss and gradients its own
                return None
            # the gradients are complete when the closure first returns, before the update (Lightning's manual
            # optimisation passes a closure that does nothing after manual_backward). The weights before the update
            # are sampled now: SAM moves them to its ascent point before the closure (a review: the way back read
            # as an update, a false update-ratio-high, through .data too, which no version counter sees)
            self._sample_early(opt)
            calls = self._closure_calls[id(opt)] = []
            done = functools.partial(self._closure_done, weakref.ref(opt), nested)
            return _wrap_closure(args, kwargs, done, calls)
        self._begin(opt, before_update=True)
        if not nested:
            self.doubles.applied(opt, self.tracks, self.step, self._model_ids)
            for entry in self.unwatched.values():   # a given one stepped: the others' count starts again
                entry[1] = 0
        return None

    def _unhooked(self, note: str) -> None:
        """A note of what watch could not see, once (a step's own would grow a list a step)."""
        if note not in self.checks["unhooked"]:
            self.checks["unhooked"].append(note)

    def _sample_early(self, opt) -> None:
        """A step(closure) about to be a sampled step of a known track: its weights sampled at the step's start."""
        t = self.tracks.get(id(opt))
        if t is None or t.released or self._provisional:
            return
        step = self.step + 1 if opt is self.clock else self.step
        if step % self.opts.every == 0:
            t.sample_early()

    @_guarded
    def _closure_done(self, ref, nested: bool) -> None:
        """The closure of a step(closure) returned for the first time: its gradients, read before the update."""
        opt = ref()
        if opt is None or id(opt) not in self._closure_steps:
            return
        self._closure_steps.discard(id(opt))
        self._begin(opt, before_update=True)
        if not nested:
            self.doubles.applied(opt, self.tracks, self.step, self._model_ids)

    def _begin(self, opt, before_update: bool):
        track = self._track(opt)
        clock = self.clock   # (chosen in _track; nothing below changes it)
        if opt is not clock:   # an unwatched optimizer's too (an adversarial attack's loss is not the model's)
            if track is not None and track.since_clock < track.OWN_LOSSES:
                track.own_losses.append(list(self._losses))   # its step's own, should the clock stop (_stopped)
            self._took_losses()
            if track is None:
                self.clips.drop(p for g in opt.param_groups for p in g["params"])
            else:   # kept for a credit, should it take the count (_credit)
                track.last_clip = self.clips.take(track.params, self.backwards, keep_others=True)
        if track is None:
            return
        if not self._grad_seen:   # (once true, no cost: a healthy run's first step)
            self._grad_seen = any(getattr(p, "grad", None) is not None for p in track.params)
        if opt is clock:
            self.step += 1
            if not before_update:   # its gradients read after the update: a non-finite one is said so (before
                self._read_after.add(self.step)   # the read this _begin may make, a review)
            for t in self.tracks.values():
                if t.since_clock > t.peak_since:
                    t.peak_since = t.since_clock
                t.since_clock = t.unclocked = 0
                t.own_losses = []
            if self._provisional and self.step > UNTRAINED_STEPS:
                self._provisional = False   # no model's optimizer came: it is the run's own
            if self.step >= 2 and (self._discovery or self.explicit_models):   # (given: on again after a read)
                self._search()
            self._loss_window.append(self._losses or self._others)
            # the step's backwards, and its forward whose loss went bad, for this step's replay (the read comes next)
            self._step_losses, self._stepped_bad = len(self._losses), self._bad_call
            self._losses, self._others, self._bad_call = [], [], None
            self._clip_window.append(self.clips.take(track.params, self.backwards))
            if self.clips.clipping:
                self.clips.stepped(self.step, track.params)
            self._window.append((self.step, track.lr()))
            self._owners[self.step] = id(track)
            self._sample_uncalled()
        else:
            track.since_clock += 1
            if clock is None:
                track.unclocked += 1
        track.stepped_now(self.step)
        self._starving(track)
        self._check_mode(track)
        read_step = self.step % self.opts.every == 0 and not self._provisional
        track.pre_step(self.step, read_step or self.step == 1, before_update)
        if self._provisional:
            return
        if self.step == 1 and opt is clock:   # before the first update: a copy of the trained model (an EMA or
            self._frozen_copies(track)           # target network, made from it) is no frozen teacher (frozen.py)
        if self.step == 2 and opt is clock and not read_step:
            # read with the next read: a model local to the script's main() is gone by the end; after one whole step,
            # so an EMA teacher updated after it has changed
            self._observe_frozen()
        if read_step and opt is clock:
            self._before_update = before_update
            self._read_step_checks()
            self.read()
        elif self._bad_here(track, opt is clock):   # on the CPU: a read now, while the weights are the step's own
            self._before_update = before_update
            self._bad_in = (track, track.since_clock) if opt is not clock else None
            try:
                self.read()
            finally:
                self._bad_in = None
        elif len(track.steps) >= ROWS_UNREAD * self.opts.every:   # steps no read takes (a clock that stopped for an
            self._before_update = before_update                   # optimizer of no model): memory stays bounded
            self.read()

    def _sample_uncalled(self) -> None:
        """A model given whose own forward never runs (a Lightning-style wrapper whose training_step calls self.net):
        its layers' training forwards from one step of the clock to the next are its sampled forward, collected at the
        next (an eighth review: a linear probe's frozen body in eval, given so, was a warning; nothing had asked what
        feeds it). Attached where a called model's would be: after a read, and at the first step."""
        if self._uncalled_sampling:
            for key in self._uncalled_sampling:
                probe = self._probes.pop(key, None)
                if probe is not None:
                    probe.collect()
            self._uncalled_sampling = set()
        if self.children.hooks and self.step >= self.opts.every:   # after the first read: hooked in the sampled steps only
            self.children.unhook()
        if not self._sample_forward:
            return
        from .stats import DeadUnits

        for key, root in self.roots.items():
            if key in self._called or key in self._sampled or key in self._traced or compiled(root):
                continue
            probe = self._probes[key] = DeadUnits(self, root, grad_only=True)
            probe.attach()
            self._sampled.add(key)
            self._uncalled_sampling.add(key)
            self.children.hook(key, root)   # a teacher inside it (children.py)
        self._sample_forward = len(self._sampled) < len(self.roots)

    def _starving(self, track: Track) -> None:
        """At an optimizer's first steps after a backward, none of its trainable parameters has a gradient: the
        next backward is asked (_after_backward). Attribute reads only, and only in the first steps."""
        probes = self._starved_probe or {}
        if id(track) in probes:   # no backward gave them one before this next step: the loss does not reach them
            del probes[id(track)]
            track.backward_gave = False
            self._starved_probe = probes or None
        if track.stepped > 2 or not self.backwards or track.backward_gave is not None:
            return
        mine = [p for p in track.params if p.requires_grad]
        if mine and all(p.grad is None for p in mine):
            self._starved_probe = {**probes, id(track): (weakref.ref(track), mine)}

    @_guarded
    def _after_backward(self) -> None:
        """Did a backward give a starved optimizer's parameters gradients before its next step? Yes: something
        cleared them before the step (zero_grad() between backward() and step()); none did by then: the loss does
        not reach them (_starving). Per optimizer: a review's two, one of each, both got the first one's cause."""
        probes = self._starved_probe or {}
        for key, (ref, params) in list(probes.items()):
            track = ref()
            if track is None or any(p.grad is not None for p in params):
                if track is not None:
                    track.backward_gave = True
                del probes[key]
        self._starved_probe = probes or None

    def _took_losses(self) -> None:
        """Another optimizer stepped: the losses since the last step were its own (a GAN's generator loss between
        two discriminator steps), not the clock's, unless the clock steps next with no backward of its own
        (one loss, two optimizers, the clock stepping second)."""
        if self._losses:   # added to: micro-batches each followed by an optimizer not given (a review)
            self._others, self._losses = self._others + self._losses, []

    def _check_mode(self, track: Track) -> None:
        """Was the last training forward of a model this optimizer trains in eval mode? Per optimizer: a second
        model in eval mode under its own optimizer (a review's) counts too, once per step."""
        self._step_mark = self._calls   # (the next backwards or their modes into a new step)
        if self.explicit_models and len(self._called) < len(self.roots):
            self._check_uncalled(track)
        if not any(self._eval_roots.values()) and not any(self._fed_mode.values()):   # the per-step path's usual case
            return
        # an optimizer with no model of its own (a bare tensor, a temperature) says nothing of any model's mode;
        # with the models given (Watch(model, opt)), the clock's is theirs
        roots = track.roots or (self._given_roots(track) if track.opt is not None and track.opt is self.clock
                                and self.explicit_models else set())
        steps = self.checks["eval_steps"]
        # the forwards a backward took since its last step (a forward after it, an eval-mode metric through autograd.grad
        # between backward and step, fed nothing: a review); with no backward seen (autograd.grad loops), every call
        fed = self.backwards > track.bw_mark
        calls, modes = (self._fed_calls, self._fed_mode) if fed else (self._called, self._eval_roots)
        since = track.mode_mark
        recent = [r for r in roots if calls.get(r, 0) > since]
        track.mode_mark, track.bw_mark = self._calls, self.backwards
        evals = [r for r in recent if modes.get(r, False) and self._fed_in_eval(r, since, fed)
                 and not self._trained_after(r, recent, calls, modes)]
        if evals and (not steps or steps[-1] != self.step):
            steps.append(self.step)
        for r in evals:   # which model (named at the report, as their parameters are, where there are several)
            self.checks["eval_models"].setdefault(r, self.step)

    def _check_uncalled(self, track: Track) -> None:
        """A model given whose own forward never ran while the optimizer trains its parameters (a Lightning-style
        wrapper whose training_step calls self.net): its hooks see no forward, so the mode the step trained in is
        that of the modules holding the parameters the optimizer trains. All of them in eval, with a dropout or
        BatchNorm in eval in the model: an eval step, as a called model in eval is (a sweep: a wrapper put in eval for
        validation and never back was not told; a review: a container put in eval whose parts were put back in train is
        not). A structural guess at which dropout is on the trained path was withdrawn: reviews broke it both ways."""
        for key, root in self.roots.items():
            if key in self._called:
                continue
            owners = self._owners_of(key, root, track)
            if owners and not any(m.training for m in owners) and self._eval_in_a_trained_part(root, owners):
                steps = self.checks["eval_steps"]
                if not steps or steps[-1] != self.step:
                    steps.append(self.step)
                self.checks["eval_models"].setdefault(key, self.step)

    @staticmethod
    def _eval_in_a_trained_part(root, owners: list) -> bool:
        """A dropout/BatchNorm in eval inside a part of the model given (one of its children, or itself when it holds
        trained weights directly) that holds a trained weight: that part is a model a called root would be, judged
        as one is (a teacher in eval beside an untouched student, in a wrapper left in eval: not; a review)."""
        sensitive = mode_sensitive()
        held = {id(m) for m in owners}
        m = inner(root)
        parts = [m] if any(id(x) in held for x in (m,)) else list(m.children())
        return any(any(id(x) in held for x in part.modules()) and any(
            isinstance(x, sensitive) and not x.training for x in part.modules()) for part in parts)

    def _owners_of(self, key: int, root, track: Track) -> list:
        """The modules of `root` that hold a parameter `track`'s optimizer trains (kept per model and set of trained
        parameters)."""
        ids = frozenset(id(p) for p in track.params if getattr(p, "requires_grad", False))
        memo = self._owner_memo.get(key)
        if memo is None or memo[0] != ids:   # the set itself: a swap of as many tensors is another set (a review)
            mods = [m for m in inner(root).modules() if any(id(p) in ids for p in m.parameters(recurse=False))]
            memo = self._owner_memo[key] = (ids, mods)
        return memo[1]

    def _called_now(self, module) -> None:
        if _compiling():   # traced into a graph, a count would be a guard that changes at every call (a recompile):
            self._called[id(module)] = self.called_at[id(module)] = math.inf   # a constant: "called since any step"
            return
        self._calls += 1
        self._called[id(module)] = self._calls
        self.called_at[id(module)] = self.step   # (steps taken before this call)

    def _given_roots(self, track: Track) -> set[int]:
        """Of the models given (Watch(models, opt)), those holding a parameter the optimizer trains now; all of them
        when none does (a bare tensor). A review: a frozen teacher given beside the student, in eval, was
        `trained-in-eval-mode`. Asked at each check (a model unfrozen later trains from then: a review), only past
        the check's early return (a model in eval) and only with several models given."""
        if len(self.roots) < 2:
            return set(self.roots)
        ids = {id(p) for p in track.params if getattr(p, "requires_grad", False)}
        held = {key for key, r in self.roots.items() if any(id(p) in ids for p in r.parameters())}
        return held or set(self.roots)

    def _trained_after(self, r: int, recent: list[int], calls: dict, modes: dict) -> bool:
        """A root called in eval whose parameters a later root's train-mode forward took again before the step (a
        review: a wrapper around the model, called once in eval as a check, made every step an eval-mode one)."""
        mine = {id(p) for p in self.roots[r].parameters()}
        return any(calls.get(o, 0) > calls.get(r, 0) and not modes.get(o, False)
                   and mine <= {id(p) for p in self.roots[o].parameters()} for o in recent if o != r)

    def _feed(self) -> None:
        """A backward: the roots called since the last one fed it, each in the mode of its last call, or-ed with what
        earlier backwards since the last step gave (a review: one micro-batch of four run in eval was missed unless it
        was the last)."""
        for r, (handle,) in self._root_handles.items():   # what a fullgraph trace let the pre-hook keep
            if handle.mark.train_seen or handle.mark.eval_seen:
                self._traced_call(r, handle.mark)
        for r, c in self._called.items():
            if c > self._fed_mark:
                # (a root not adopted yet, found at the first step: its mode as discovery saw it)
                mode = self._eval_roots.get(r, self._seen_eval.get(r, False))
                before = self._fed_calls.get(r, 0) > self._step_mark and self._fed_mode.get(r, False)
                self._fed_calls[r], self._fed_mode[r] = c, mode or before
        self._fed_mark = self._calls

    def _traced_call(self, r: int, mark: ModuleHook) -> None:
        """Forwards of root `r` traced whole into a compiled graph (torch.compile(model, fullgraph=True)) since the last
        backward: the hook could keep their modes alone, those with grad on (hooks.ModuleHook). Counted here as one
        call, at the backward it fed, in eval mode only when none was in train mode (which fed the backward is not
        known there: a metric's eval forward between the training forward and its backward is not a step in eval);
        the rest of _root_pre (the batch, a replay's input, dead units) is not known."""
        self._eval_roots[r] = not mark.train_seen
        mark.train_seen = mark.eval_seen = False
        self._calls += 1
        self._called[r], self.called_at[r] = self._calls, self.step
        if not self._eval_roots[r]:
            self._train_called[r] = self._calls
        self.run_compiled = True

    def _bad_here(self, track: Track, is_clock: bool) -> bool:
        """Between reads, on the CPU only (stats.host_visible): did this step's gradients or loss go non-finite
        first? Then the read (and the replay) happen at this step, before the optimizer applies it."""
        if not self.opts.replay or self._first_bad_found:
            return False
        return track.nonfinite_now() or (is_clock and bool(self._loss_window)
                                         and nonfinite_losses(self._loss_window[-1]))

    @_step_hook
    def _post_step(self, opt, args, kwargs):
        nested, _, again = self.doubles.leave(opt)
        if again:
            return
        calls = len(self._closure_calls.pop(id(opt), ()))
        if calls > 1:   # several evaluations, several updates: from its next step on, read after the step
            self._evaluates_often.add(id(opt))
            if opt is not self.clock:
                self._took_losses()   # its later evaluations' losses are its own, not the clock's next step's
            elif self._loss_window and isinstance(self._loss_window[-1], list):
                self._loss_window[-1].extend(self._losses)   # this step's later evaluations are its own
                self._losses = []
        if id(opt) in self._closure_steps:   # not read when its closure returned
            self._closure_steps.discard(id(opt))
            self._unhooked(_AFTER_NOTES[1 if id(opt) in self._evaluates_often else 0])
            self._begin(opt, before_update=False)
            if not nested:   # the gradients the closure made, which this step applied
                self.doubles.applied(opt, self.tracks, self.step, self._model_ids)
        track = self.tracks.get(id(opt))
        if track is None:
            return
        if calls > 1:   # several evaluations, several updates (LBFGS): a ratio per step is not the band's per update
            track.before = None
        track.post_step(self.step, carry_probe=True)   # with accumulate too: said when it was not needed
        if opt is self.clock and self.step % self.opts.every == 0:
            self._sample_forward, self._sampled = True, set()

    def _read_step_checks(self):
        """Host-side checks of a read step (attribute reads, no sync)."""
        import torch

        in_opt = set().union(*(t.keys() for t in self.tracks.values()))
        live = [t for t in self.tracks.values() if not t.released]
        for t in live:
            if t.opt is not self.clock:
                # a parameter another optimizer stepped since this one's last step is that one's to step
                t.idle_read(self._last_read, lambda t=t: set().union(*(o.ids.keys() for o in live
                                                                      if o is not t and o.last_step > t.last_step)))
        self._last_read = self.step
        for t in live:   # looked at here, not each step: one unused lazy module cost 9 calls a step (a review)
            t.lazy_made = bool(t.lazy) and t.made_since()
        self._observe_frozen()
        if self._bn_odd:
            self._bn_kept()
        sensitive = mode_sensitive()
        for rid, root in self.roots.items():
            if not inner(root).training:
                continue
            prefix = self.root_prefix(root)   # the rows' names: `Type#i.` where there are several models
            order = self._order.get(rid)
            if order not in self.checks["dropout_high"]:   # once a model, in train mode (core/dropout_rate.py)
                self.checks["dropout_high"][order] = dropping_most(inner(root), prefix)
            in_eval = set()
            seen_eval = self.checks["eval_frozen"].keys() | self.checks["eval_modules"].keys()
            for name, m in inner(root).named_modules():
                if not m.training:
                    in_eval.add(name)
                elif prefix + name in seen_eval:   # back in train mode since (unfrozen: a sweep's "stayed in eval")
                    self.checks["eval_left"].setdefault(prefix + name, self.step)
                if not m.training and isinstance(m, sensitive):
                    # kept in eval with its own weights frozen: a frozen layer, as in fine-tuning (a sweep); one whose
                    # weights are only in no optimizer is asked what feeds it (a review: a forgotten no-decay group
                    # of BatchNorm weights between trained convolutions passed as a frozen part)
                    own = [p.requires_grad for p in m.parameters()]
                    key = "eval_frozen" if own and not any(own) else "eval_modules"
                    if prefix + name not in self.checks[key]:
                        self.checks[key][prefix + name] = self.step
                        self._frozen_refs[prefix + name] = weakref.ref(m)   # its statistics, read at the end if
                                                                            # it is told frozen (never_normalised)
                    # as of this read: its calls seen (in the steps the global hooks are on) took no input that carries
                    # a gradient (a teacher rightly in eval beside the trained forward); a later one that does clears it
                    self.checks["eval_unfed"][prefix + name] = self._eval_grad.get(id(m)) is False
            asked = [n[len(prefix):] for n in self.checks["eval_modules"] if n.startswith(prefix)]
            for name, p in inner(root).named_parameters():
                # (frozen: its .grad is one a backward left before, a pretraining's; no update is lost: a sweep)
                if p.grad is not None and p.requires_grad and id(p) not in in_opt:
                    self._saw_unowned(prefix + name, p, root)
                    owner = name.rpartition(".")[0]
                    if owner in in_eval:   # its module put in eval while the model trains: asked as the above
                        self.checks["unowned_eval"].setdefault(prefix + name, prefix + owner)
                        asked.append(owner)
            self._eval_regions(inner(root), prefix, asked, in_eval, in_opt | self.doubles.held)   # (+ not given)
        self._unheld_now()
        self._queue_bn_stats(sensitive[1])
        if self.on_histograms is not None:
            named = [(self.root_prefix(root) + n, p) for root in self.roots.values() for n, p in inner(root).named_parameters()]
            with torch.no_grad():
                self.on_histograms(self.step, named)

    # ----------------------------------------------------------------- the read-back
    def read(self, final: bool = False):
        """One read-back (one sync per device) of everything queued since the last read."""
        parts, layout = [], []
        window = self._window
        losses = self._loss_window
        if any(losses):
            parts.append(_stack([v for step in losses for v in step]))
            layout.append(("loss", [len(step) for step in losses]))
        clips = self._clip_window
        if any(clips):
            parts.append(_stack([v for step in clips for v in step]))
            layout.append(("clip", [len(step) for step in clips]))
        queued = [q for t in self.tracks.values() for q in t.queued(final)]
        for kind, payload, tensor in queued + self.pending:
            parts.append(tensor)
            layout.append((kind, payload))
        self.pending = []
        values = read_parts(parts) if parts else []
        self._window, self._loss_window, self._clip_window = [], [], []
        owners, self._owners = self._owners, {}
        self.reads += 1 if parts else 0
        start = len(self.series["loss"])
        self._absorb(window, layout, values, owners)
        self._read_after = set()
        if not final:
            self._drop_retired()
        self._drop_one_offs()   # the final read's too: the report lists the last (a review: 51 tracks, 204 findings)
        self._note_frozen()
        if self.on_read is not None:
            self.on_read(self.snapshot(start, [(p, v) for (k, p), v in zip(layout, values) if k == "ratio"]))

    def snapshot(self, start: int, ratios) -> dict:
        """What a read brought, torch-free, for the renderers: the new steps' loss, gradient norm and
        learning rate, the update ratios sampled, the count of problems seen so far."""
        s = self.series
        new = list(zip(s.get("step", [])[start:], s["loss"][start:], s["grad_norm"][start:], s["lr"][start:]))
        per_layer = {}
        for (track, step), vals in ratios:
            for i, v in enumerate(vals):
                if math.isfinite(v) and track.seen_grad[i]:
                    per_layer[track.names[i]] = (step, v)
        return {"step": self.step, "epoch": self.epoch, "new": new, "ratios": per_layer,
                "loss": next((v for v in reversed(s["loss"]) if v is not None), None), "problems": self.problems()}

    def problems(self) -> int:
        """How many problems the reads have shown so far (the status line's count; the report has the findings)."""
        c = self.checks
        return (len(self.events) + bool(c["carried"]) + len(c["not_in_optimizer"]) + len(c["eval_modules"])
                + bool(c["eval_steps"]) + len(c["param_nonfinite"]) + len(c["bn_nonfinite"]))

    def _absorb(self, window, layout, values, owners: dict):
        from .stats import absorb

        steps = [s for s, _ in window]
        loss = [None] * len(steps)
        norms: dict = {}   # step -> the total gradient norm of the optimizer that took it (owners: the clock then)
        reach: dict = {}   # step -> the index of the set of parameters its gradient reached (_reach_set)
        clipped: list = [None] * len(steps)
        mixed: set = set()   # steps whose losses were non-finite and finite (_first_nonfinite)
        for (kind, payload), vals in zip(layout, values):
            if kind == "loss":   # the mean of each step's losses (micro-batches)
                pos = 0
                self.micro = max([self.micro, *payload])
                for i, n in enumerate(payload):
                    loss[i] = sum(vals[pos:pos + n]) / n if n else None
                    pos += n
                # backward calls a step with finite losses only takes, the run's usual (a loop dropping most batches
                # takes two or more at most steps: those steps are not its usual; a review)
                self._loss_counts.update(n for n, v in zip(payload, loss) if n and v is not None and math.isfinite(v))
                usual = self._loss_counts.most_common(1)[0][0] if self._loss_counts else None
                pos = 0
                for i, n in enumerate(payload):
                    if usual is not None and n > usual and loss[i] is not None and not math.isfinite(loss[i]) and any(
                            math.isfinite(v) for v in vals[pos:pos + n]):
                        # more backward calls than the run's steps take, a finite loss among them: the loop may have
                        # dropped the bad one's gradient (micro-batches the loop always takes are all applied: a
                        # review's -inf logit on a real label, 4 micro-batches a step, was not dropped)
                        mixed.add(steps[i])
                    pos += n
            elif kind == "clip":   # the norm before clipping, where the loop clipped (clip.py)
                pos = 0
                for i, n in enumerate(payload):
                    clipped[i] = combined(vals[pos:pos + n])
                    pos += n
            elif kind == "frozen":   # a model called under no_grad (frozen.py)
                take(payload[0], payload[1], payload[2], vals)
            elif kind == "reach":
                c = len(vals) // max(1, len(payload[1]))
                reach.update((s, self._reach_set(payload[0], vals[j * c:(j + 1) * c]))
                             for j, s in enumerate(payload[1]) if owners.get(s) == id(payload[0]))
            elif kind == "grad_norm":
                # by step, each the rows of its own optimizer: within a window the count can pass between
                # optimizers, and the current clock's rows alone, cut to length, shifted every later norm (a review)
                norms.update((s, v) for s, v in zip(payload[1], vals) if owners.get(s) == id(payload[0]))
                _fed(payload[0], payload[1], vals)
            else:
                absorb(self, kind, payload, vals)
        self.series["loss"].extend(loss)
        self.series["grad_norm"].extend(c if c is not None else norms.get(s, 0.0 if not norms else None)
                                        for c, s in zip(clipped, steps))
        self.series["lr"].extend(lr for _, lr in window)
        self.reach.extend(reach.get(s) for s in steps)
        if steps:
            self.series.setdefault("step", []).extend(steps)
        self._first_nonfinite(steps, loss, lambda s: s in mixed and math.isfinite(
            (norms.get(s) if (c := clipped[steps.index(s)]) is None else c) or math.nan))

    def _reach_set(self, track, codes: list) -> int | None:
        """The index of the set of `track`'s parameters a step's reach codes name (stats._reach_codes), added the
        first time it is seen; None past REACH_SETS sets (a mixture of experts routing each step anew). The codes are
        decoded once per optimizer and set, not once a step."""
        seen = (id(track), tuple(codes))
        if seen in self._reach_seen:
            return self._reach_seen[seen]
        b = track.word_bits
        names = frozenset(track.names[k * b + j] for k, v in enumerate(codes) for j in range(b)
                          if int(v) >> j & 1 and k * b + j < len(track.names))
        key = next((i for i, known in enumerate(self.reach_sets) if known == names), None)
        if key is None and len(self.reach_sets) < REACH_SETS:
            key = len(self.reach_sets)
            self.reach_sets.append(names)
        if len(self._reach_seen) < 4 * REACH_SETS:
            self._reach_seen[seen] = key
        return key

    def _first_nonfinite(self, steps, loss, dropped):
        """The first non-finite loss or gradient, once: replayed when it is this very step (the weights
        that produced it are still in place), else reported with the step it happened at. A non-finite loss of a
        step that took a finite one too and applied finite gradients is not it (_dropped)."""
        if self._first_bad_found:
            return
        bad_grad = min((t.first_bad for t in self.tracks.values() if t.first_bad), key=lambda fb: fb[0], default=None)
        bad_loss = None
        for s, v in zip(steps, loss):
            if v is None or math.isfinite(v):
                continue
            if (bad_grad is None or s < bad_grad[0]) and dropped(s):
                self._dropped(s)
                continue
            bad_loss = s
            break
        if bad_loss is None and bad_grad is None:
            return
        if bad_grad is not None and (bad_loss is None or bad_grad[0] < bad_loss):
            event = {"kind": "gradient", "step": bad_grad[0], "params": bad_grad[1]}
            if self._bad_in is not None and self._bad_in[0].first_bad is bad_grad and bad_grad[0] == self.step:
                # a step of an optimizer the clock has not counted (a second stage's, before it takes the count):
                # numbered, and its loss judged, when a handover counts it (_credit)
                self._uncounted.append((event, id(self._bad_in[0]), self._bad_in[1]))
        else:
            event = {"kind": "loss", "step": bad_loss, "params": bad_grad[1] if bad_grad and bad_grad[0] == bad_loss else []}
        event["epoch"] = self.epoch
        event["before_update"] = event["step"] not in self._read_after   # its gradients read before the update
        self._replay_event(event, dict(zip(steps, loss)).get(event["step"]))
        self.events.append(event)
        self._first_bad_found = True

    def _dropped(self, step: int) -> None:
        """A non-finite loss at `step` whose step applied finite gradients: the loop dropped that batch's gradient
        (a loop skipping bad batches by hand, after their backward: a review's NaN records were a false error), or
        the loss's non-finite part reached no parameter. Counted; the first replayed, to say why it went bad."""
        first = self.dropped_losses
        self.dropped_losses = (first[0] if first else step, (first[1] if first else 0) + 1,
                               first[2] if first else None)
        if first is None:
            event = {"kind": "loss", "step": step, "params": [], "epoch": self.epoch, "before_update": True}
            self._replay_event(event, math.nan)
            self.dropped_losses = (step, 1, event)

    def _replay_event(self, event: dict, loss) -> None:
        """The batch of `event`'s step replayed on its weights where they are still in place, else why not."""
        call = self._stepped_bad or self.last_call
        if (self.opts.replay and event["step"] == self.step and self._before_update and not self.closed
                and call is not None and call[0]() is not None):
            from .replay import replay

            root = call[0]()   # its modules named as the rows are where there are several models
            event["replay"] = _norm_overflow(replay(root, *call[1:], prefix=self.root_prefix(root),
                                                    loss=loss if isinstance(loss, float) else None), event,
                                             loss, self.tracks.values())
            # the batch the step went bad on was not told: a non-finite gradient with every loss finite (a review:
            # sqrt at 0 in micro-batch 1 of 4), or a loss off the CPU; the replay of the last says what it replayed
            if self._stepped_bad is None and self._step_losses > 1 and event["replay"].get("direction") == "loss" \
                    and (event["kind"] == "gradient" or not self._host_losses):
                event["replay"]["detail"] = (   # not "came from the loss": the batch that went bad was not kept
                    f"the step took {self._step_losses} losses (gradient accumulation) and the batch replayed is its "
                    "last, whose forward and backward are finite with these weights: the non-finite value came from "
                    "an earlier batch of the step (not kept), in the model or in its loss")
        elif self.opts.replay and self._host_losses and any(t.looks_on_host() for t in self.tracks.values()):
            # on the host a bad loss is read at its own step: not replayed only where watch did not know the model yet
            # or the weights had moved (a review: a NaN at step 1 under the command line, which finds the model at
            # its first step, was told the accelerator's reason)
            event["replay"] = None
            why = ("the forward of that batch ran before watch knew the model (the command line finds the model and "
                   "its optimizer at their first step)" if call is None or call[0]() is None else
                   f"the weights of step {event['step']} had been updated when watch read it")
            event["replay_note"] = f"not replayed: {why}; check the inputs of that batch, or lower the learning rate"
        elif self.opts.replay:
            event["replay"] = None
            event["replay_note"] = (f"found at the read of step {self.step}: the weights of step {event['step']} "
                                    "were already updated (on an accelerator watch looks only at read steps: a "
                                    "look per step would be a sync per step); every=1 replays the batch at the "
                                    "step itself")

    def finish(self):
        """The last read (what the steps since the previous read left), then detach."""
        with contextlib.suppress(Exception):   # a help, never a new failure of the run
            self._adopt_untrained()
            self._not_in_optimizer()
        with contextlib.suppress(Exception):
            self._stopped_at_end()
            if self.stop_handovers and self._last_read < self.stop_handovers[-1][0]:
                # no read step since the count passed to a stopped clock's successor: its normalisation statistics
                # as the steps left them, with the last read (a sweep: a student's non-finite statistics passed).
                # Not the modes scan: a trained model kept in eval inside the next stage's (a teacher, a model being
                # calibrated) is that stage's design (a review)
                self._queue_bn_stats(mode_sensitive()[1])
        with contextlib.suppress(Exception):
            self._observe_frozen()   # a run shorter than `every`, or a model put in eval since the last read
        with contextlib.suppress(Exception):
            if self._bn_odd:
                self._bn_kept()   # the steps since the last read (a run shorter than `every`)
        try:
            if not self.closed and not self.broken and (self._window or self.pending or self.tracks):
                self.read(final=True)
        except Exception as exc:   # the run itself went well: keep what was read, say why the rest is missing
            self.broken = f"watch's last read failed ({one_line(exc)}); the report covers the reads before it"
        finally:
            self.close()
        with contextlib.suppress(Exception):
            self._probe_modes()
        with contextlib.suppress(Exception):
            self._probe_kept_in_eval()

    def _probe_kept_in_eval(self) -> None:
        """Submodules in eval while their model trained: which does the model's own train() keep there (modes.py)?"""
        from .modes import kept_in_eval

        kept = self.checks["eval_kept"] = set()
        for root in list(self.roots.values()):
            prefix = self.root_prefix(root)
            names = [n[len(prefix):] for n in self.checks["eval_modules"] if n.startswith(prefix)]
            if names and not compiled(root):
                kept |= {prefix + n for n in kept_in_eval(inner(root), names)}

    def _probe_modes(self) -> None:
        """Steps trained in eval mode: does the mode change what the model computes? Its last training batch run
        once in each mode (watch/modes.py), after the hooks are gone."""
        if not self.checks["eval_steps"] or self.last_call is None:
            return
        ref, args, kwargs = self.last_call
        root = ref()
        if root is None or compiled(root):
            return
        from .modes import mode_inert

        self.checks["mode_inert"] = (id(root), mode_inert(inner(root), args, kwargs, mode_sensitive()))

    def _eval_regions(self, root, prefix: str, names: list[str], in_eval: set, trained: set) -> None:
        """Modules in eval seen at this read (`names`, relative to `root`): is the part put in eval around each (its
        outermost ancestor in eval, without the submodules put back in train mode) one that holds weights, none of
        them trained? A linear probe's body is; an input dropout put in eval alone is not (its mode changes what the
        trained layers after it see), and stays a warning. And-ed over the reads: a body unfrozen later while left
        in eval is a trained part from then (a review). Each part's weights are looked at once a read."""
        parts_seen: dict[str, bool] = {}
        for name in dict.fromkeys(names):
            parts = name.split(".") if name else []
            top = next((".".join(parts[:k]) for k in range(1, len(parts) + 1) if ".".join(parts[:k]) in in_eval), None)
            if top is None:
                continue
            if top not in parts_seen:
                region = root.get_submodule(top)
                params = [q for sub in region.modules() if not sub.training for q in sub.parameters(recurse=False)]
                parts_seen[top] = bool(params) and not any(q.requires_grad and id(q) in trained for q in params)
            key = prefix + name
            self.checks["eval_region"][key] = self.checks["eval_region"].get(key, True) and parts_seen[top]
            self.checks["eval_top"][key] = prefix + top

    def saw_eval_module(self, name: str, module, args) -> None:
        """A module in eval mode in a sampled training forward: does a parameter an optimizer trains feed its input
        (a walk of the graph so far, no read), or is one of its own weights trained? Where neither, its mode and its
        weights change no gradient that trains: a frozen part (a linear probe's body). Or-ed over the samples."""
        import torch

        if self.checks["eval_fed"].get(name):
            return
        if not isinstance(module, mode_sensitive()) and next(module.parameters(recurse=False), None) is None:
            return   # neither a dropout/BatchNorm nor a holder of weights: nothing to ask (a review: the cost)
        from .graph import fed_by

        if self.fed_memo is None:   # one sampled forward (DeadUnits.attach/remove): the trained set, and the graph
            # nodes known not to reach it, held for that forward only (ids of freed nodes are reused: a review)
            self.fed_memo = (set().union(*(t.keys() for t in self.tracks.values())) | self.doubles.held, {})
        trained, clean = self.fed_memo
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        own = any(id(p) in trained and p.requires_grad for p in module.parameters())   # its own weights train
        self.checks["eval_fed"][name] = own or fed_by(tensors, trained, clean)

    def _observe_frozen(self) -> None:
        """At a read: each module called under no_grad in discovery, its values queued for this read (frozen.py)."""
        from .frozen import observe

        probes = [p for p in self._nograd.values() if p is not None]
        if not probes:
            return
        # what the optimizers hold (a teacher inside the trained model is the model's; its weights in the optimizer,
        # over the distiller's parameters, train only if given a gradient: frozen.observe asks)
        trained = set().union(*(t.keys() for t in self.tracks.values())) | self.doubles.held
        live = {id(p) for t in self.tracks.values() for p in t.params if getattr(p, "requires_grad", False)}
        if (live | self.doubles.held).isdisjoint(self._model_ids()):   # no model trains: an input optimised
            return                                  # through a frozen network (style transfer) has no teacher
        if self._first_prints is not None:   # probes made after the first update (children.py, _search) asked as copies
            with contextlib.suppress(Exception):
                from .frozen import copies, read_prints

                if isinstance(self._first_prints, tuple):   # read with the first probe that needs it, not at step 1
                    ids, pending = self._first_prints
                    self._first_prints = list(zip(ids, read_prints(pending)))
                copies(probes, [], self._first_prints)
        for probe in probes:
            try:
                seen = observe(probe, trained)
            except Exception:   # noqa: BLE001 - a help, never a new failure of the run: this probe is dropped
                probe.relevant, seen = False, None
            if seen is not None:
                self.pending.append(("frozen", (probe, seen[0], seen[1]), seen[2]))

    def _frozen_copies(self, track: Track) -> None:
        from .frozen import copies, pending_prints

        probes = [p for p in self._nograd.values() if p is not None]
        trained = [p for t in self.tracks.values() for p in t.params if hasattr(p, "detach") and p.requires_grad]
        with contextlib.suppress(Exception):   # a help: a failure keeps the probes
            if probes:
                copies(probes, trained)
            if self.children.hooks or self.explicit_models:   # a teacher inside a given wrapper, or beside the given
                # models, may be seen after the first update (asked in the steps after reads): the weights kept
                self._first_prints = (list(map(id, trained)), pending_prints(trained))

    def frozen_in_train_mode(self) -> list[dict]:
        """The models called under no_grad in train mode that no optimizer trains, as of the last read (frozen.py)."""
        return [p.verdict for p in self._nograd.values() if p is not None and p.verdict is not None]

    def evaluates_often(self) -> bool:
        """Whether the clock's closure ran several times a step (LBFGS): its losses are its evaluations."""
        return self.clock is not None and id(self.clock) in self._evaluates_often

    def never_normalised(self, name: str) -> bool:
        """A BatchNorm kept in eval whose running statistics never saw a batch (num_batches_tracked 0, as built):
        it normalises with mean 0 and variance 1, nothing it was frozen for. Read at the end (one read each)."""
        ref = self._frozen_refs.get(name)
        m = ref() if ref is not None else None
        tracked = getattr(m, "num_batches_tracked", None)
        return tracked is not None and int(tracked) == 0

    def holds_any(self, params) -> bool:
        """Whether a watched model (given, or found training) holds any of `params`."""
        ids = self._model_ids()
        return any(id(p) in ids for p in params)

    def _model_ids(self) -> set[int]:
        """id() of the watched models' parameters (made again when the models change; a few hundred tensors)."""
        key = tuple(self.roots)
        if self._model_ids_key != key:
            self._model_ids_key = key
            self._model_ids_cache = {id(p) for root in self.roots.values() for p in inner(root).parameters()}
        return self._model_ids_cache

    def _saw_unowned(self, key: str, p, root=None) -> None:
        """A parameter with a gradient that no optimizer holds, first seen now (or when `root`, adopted as untrained,
        was first called with grad): its sum kept on the device, to tell at the end whether something else changed
        it (one op, once per such parameter)."""
        import torch

        if key not in self._unowned:
            since = self._adopted_since.get(id(root), self.step) if root is not None else self.step
            self._unowned[key] = (min(since, self.step), id(p))
            with torch.no_grad():
                self._unowned_sums[id(p)] = (weakref.ref(p), p.detach().float().sum())

    def unowned_id(self, key: str):
        """id() of the parameter seen unowned under `key` (one tensor may be seen under two models' names), else the
        key itself."""
        got = self._unowned.get(key)
        return got[1] if got is not None else key

    def _unheld_now(self) -> None:
        """Parameters first seen unowned at this read that no live optimizer holds, stepped or not (one pass over the
        collector's objects, at a read that saw new ones only): their gradients of now are lost. One an optimizer
        holds by the end was taken later (report: info; a sweep's stage-2 optimizer over the trunk alone left the
        head's gradients unapplied for 200 steps, and a stage-3 one took it: nothing was said)."""
        new = [(key, pid) for key, (_, pid) in self._unowned.items() if key not in self._unheld_seen]
        if not new:
            return
        self._unheld_seen.update(key for key, _ in new)
        alive = _held_by_any_optimizer()
        for key, pid in new:
            if pid not in alive:
                self.checks["unheld"].setdefault(key, self.step)

    def _moved_unowned(self) -> set[int]:
        """id() of the unowned parameters whose values changed since first seen (one read for them all)."""
        import torch

        live = [(pid, ref(), before) for pid, (ref, before) in self._unowned_sums.items() if ref() is not None]
        if not live:
            return set()
        with torch.no_grad():
            now = torch.stack([p.detach().float().sum().to(b.device) for _, p, b in live])
            same = (now == torch.stack([b for _, _, b in live])).tolist()
        return {pid for (pid, _, _), kept in zip(live, same) if not kept}

    def _not_in_optimizer(self) -> None:
        """At the end: a parameter seen with a gradient in no optimizer (at a read, or now: a run shorter than `every`)
        that no watched optimizer holds (one let go: while it gets no new gradient) and no optimizer that stepped
        held or holds. Not at the read itself: an optimizer that first steps later (a second one stepped after the
        first in each iteration, a head's own one every 20 steps) or a param group added later (a head unfrozen
        mid-run) holds it by the end (reviews)."""
        # held: by a watched optimizer (one the run let go: while they get no new gradient, Track.keys), or by one not
        # watched that stepped (when it first did, or now)
        held = set().union(*(t.keys() for t in self.tracks.values()))
        held |= self.doubles.held | {id(p) for o in [*self.doubles.live(), *self.scaled_opts]
                                     for g in o.param_groups for p in g["params"]}
        was = {param_key(p) for t in self.tracks.values() for p in t.params}   # trained, by one the run let go
        for root in self.roots.values():
            prefix = self.root_prefix(root)
            for name, p in inner(root).named_parameters():
                if p.grad is not None and p.requires_grad and id(p) not in held:
                    self._saw_unowned(prefix + name, p, root)
        idle = _held_by_any_optimizer() - held if any(pid not in held for _, pid in self._unowned.values()) else set()
        moved = self._moved_unowned()
        for key, (step, pid) in self._unowned.items():
            if pid in held:
                if key in self.checks["unheld"]:   # in no live optimizer at a read, in one by the end: taken later
                    self.checks["held_late"][key] = self.checks["unheld"][key]
                continue
            if pid in idle:   # in an optimizer that never stepped: not "in none" (report._idle_optimizer)
                self.checks["idle_optimizer"].setdefault(key, step)
                continue
            if pid in moved and pid not in was:   # changed with no optimizer: updated by hand (a sweep's temperature)
                self.checks["updated_by_hand"].append(key)
            else:
                self.checks["not_in_optimizer"].setdefault(key, step)
                if pid in was:
                    self.checks["orphaned"].add(key)
        out = self.checks["not_in_optimizer"]
        for model, (names, refs, before) in self._untrained.items():   # a whole model no optimizer holds
            params = [r() for r in refs]
            moved = any(p is None for p in params) or not bool((_sums(params) == before).all())
            if moved:   # changed since it was adopted: trained by other means
                for n in names:
                    out.pop(n, None)
            elif all(n in out for n in names):
                self.checks.setdefault("model_not_in_optimizer", {})[model] = names
                if model in self._untrained_eval:
                    self.checks.setdefault("model_in_eval", {})[model] = True

    def clock_at(self, step: int) -> int | None:
        """id() of the track whose optimizer was the clock at `step` (the handovers' order), else the clock's now."""
        key = None
        for first, new, old, _ in self.handovers:
            if first > step:
                return old if key is None else key
            key = new
        held = self.tracks.get(id(self.clock)) if self.clock is not None else None
        return key if key is not None else (id(held) if held is not None else None)

    def set_epoch(self, epoch) -> None:
        if epoch != self.epoch:
            self.epochs.append((self.step, epoch))
        self.epoch = epoch

    def epoch_at(self, step: int):
        """The epoch step `step` was taken in (the loop told set_epoch), else None."""
        found = None
        for after, epoch in self.epochs:
            if after < step:
                found = epoch
        return found

    def log(self, name: str, value, step: int | None = None):
        with contextlib.suppress(Exception):
            value = float(value)   # a 0-dim tensor: the caller asked for it, their sync
        self.metrics.setdefault(name, []).append((self.step if step is None else step, value))


_AFTER_NOTES = [   # a step(closure) read after its update: the closure not called, or LBFGS
    "an optimizer.step(closure) that did not call its closure: its gradients are read after the update (no replay, "
    "no update/weight ratio)",
    "an optimizer.step(closure) that evaluated its closure several times (LBFGS: several updates in one step): read "
    "after each step from its second on, with no update/weight ratio and no replay",
]


def _held_by_any_optimizer() -> set[int]:
    """id() of every parameter some live optimizer holds, stepped or not: one that never stepped is known to no hook
    (a sweep: a GAN script that failed after the critic's first step, its generator's Adam built but not yet
    stepped, was told the generator is in no optimizer). One pass over the collector's objects, at the end only,
    and only where a parameter would otherwise be said to be in none."""
    import gc

    from torch.optim import Optimizer

    gc.collect()   # an optimizer deleted inside a reference cycle is still listed until a collection (a review)
    kinds, todo = set(), [Optimizer]   # type() against the subclasses: isinstance reads __class__, which a lazy
    while todo:                        # module's proxy answers with a warning or an import (and costs 4x)
        kinds.add(todo[-1])
        todo.extend(todo.pop().__subclasses__())
    return {id(p) for o in gc.get_objects() if type(o) in kinds
            for g in getattr(o, "param_groups", ()) for p in g.get("params", ())}


def _wrap_closure(args, kwargs, done, calls: list) -> tuple:
    """The step's (args, kwargs) with its closure wrapped: `done()` when it first returns; each return noted."""
    closure = args[1] if len(args) > 1 else kwargs["closure"]

    def closure_watched(*a, **k):
        out = closure(*a, **k)
        calls.append(True)
        if len(calls) == 1:
            done()
        return out

    if len(args) > 1:
        return (args[0], closure_watched, *args[2:]), kwargs
    return args, {**kwargs, "closure": closure_watched}


def _sharded(opt) -> bool:
    """Does the optimizer hold DTensor parameters (torch's fully_shard, tensor parallel)?"""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:   # a torch built without distributed
        return False
    return any(isinstance(p, DTensor) for g in opt.param_groups for p in g["params"])


def _has_closure(args, kwargs) -> bool:
    """An optimizer step hook's step(closure) call (args[0] is the optimizer)."""
    return (args[1] if len(args) > 1 else kwargs.get("closure")) is not None


def _noted(into: list, key, _ref) -> None:
    """A weakref callback: only notes the key (a collection can run inside our own loops)."""
    into.append(key)


def _grad_enabled() -> bool:
    import torch

    return torch.is_grad_enabled()


def inner(root):
    """The user's own module under a DataParallel/DDP wrapper or torch.compile (their parameter and module
    names)."""
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    root = getattr(root, "_orig_mod", root)   # compile(DDP(m)) and DDP(compile(m)) alike
    if isinstance(root, (DataParallel, DistributedDataParallel)):
        root = root.module
    return getattr(root, "_orig_mod", root)


# torch.compile warns at every call of a compiled module while global module hooks exist (ours, until the
# first step names the trained models): a warning the user's healthy run would not have. Ignored while
# ours are on, only that message.
_COMPILE_WARNING = r"Using `torch.compile\(module\)` when there are global hooks on modules"


def _quiet_compile_warning(on: bool) -> None:
    import warnings

    if on:
        warnings.filterwarnings("ignore", message=_COMPILE_WARNING, category=UserWarning)
        return
    for f in list(warnings.filters):
        if f[0] == "ignore" and f[1] is not None and f[1].pattern == _COMPILE_WARNING and f[2] is UserWarning:
            warnings.filters.remove(f)
            getattr(warnings, "_filters_mutated", lambda: None)()   # the caches see the filter gone
            break


def _fed(track, steps: list, totals: list) -> None:
    """The track's last step with any gradient, and the steps it took since with none (gradients-stopped)."""
    for s, v in zip(steps, totals):
        if v != 0:   # (a NaN counts as a gradient)
            track.last_fed, track.unfed_after = s, 0
        elif track.last_fed is not None:
            track.unfed_after += 1


def _sums(params):
    """One sum per tensor, on the device (a fingerprint of the values: a change shows, no copy is kept)."""
    import torch

    return torch.stack([p.detach().float().sum() for p in params])


def _compiling() -> bool:
    """Is this code being traced by torch.compile (a hook of a model its caller compiled)?"""
    import torch

    return bool(torch.compiler.is_compiling())


_SKIPPED: list = []   # whether our code was marked for dynamo to skip (once a process)


def skip_in_dynamo() -> None:
    """Mark the code of watch's backward-time hooks for torch.compile to run, not compile: called by autograd while a
    compiled function runs, they were compiled frame by frame, with guards on each parameter's gradient, to dynamo's
    recompile limit and a warning the user's plain run does not print (a review: `look` per parameter, and the loss
    hook, inside a compiled step; 3 graphs became 14). The frames they call are skipped too. A no-op until
    torch._dynamo is loaded (asked again where a step hook first sees it), and where torch's API for it differs."""
    if _SKIPPED or "torch._dynamo" not in sys.modules:
        return
    _SKIPPED.append(True)
    try:
        from torch._C._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy

        skip = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)
        for code in _our_codes():
            set_code_exec_strategy(code, skip)
    except (ImportError, AttributeError, TypeError):
        return


def _our_codes():
    """The code of the hooks autograd calls (a gradient's look and keep, the reach marks, the Tensor.backward wrapper
    with the loss it sees), never of those a compiled forward traces: marked skipped, dynamo would break the user's
    graph at them (and refuse fullgraph)."""
    from .stats import autograd_hook_codes, nested_codes

    for fn, names in ((Engine.attach, ("backward",)), (Engine._probe_eval_output, ("reached",))):
        yield from nested_codes(fn, names)
    yield from autograd_hook_codes()


def compiled(root) -> bool:
    """A torch.compile'd module (its layers run inside a compiled graph, out of reach of hooks added later)."""
    from .stats import compiled_module

    return compiled_module(root)


LOSS_LOOKS = 3   # a loss module's first calls: a softmax before it is there from the first step
NLL_FLOOR = 0.05   # a floor added to probabilities before their log, at most this, still reads as log-probabilities
SMALL_BATCHES = 10_000   # steps whose batch size is kept (a last batch an epoch: this many epochs)
SMALL_BATCH = 2   # a batch this small gives a sample's own loss: an epoch's last batch of 1 or 2 (not a quarter of
                  # the first: a sequence-first model's dim 0 is time, and a shorter bucket hid a real spike; a review)
FEW = 8           # ... and, through a BatchNorm, one of up to this many where the first was FEW times larger (a sweep:
                  # an epoch's last batch of 3 after 64 lost 7.3 in train mode where eval mode lost 0.001)
REACH_SETS = 64   # the sets of parameters steps' gradients reached that are told apart (report._reach_groups)
GRAPH_LOOKS = 16  # losses whose graph is read: a generator's comes after its critic's 5 (a review); ~90 µs each (64 nodes of a ResNet-10's graph on CPU, against a 19 ms backward), the first 16 steps only


def _class_losses() -> tuple:
    """Loss modules that take class scores: CrossEntropyLoss wants logits, NLLLoss log-probabilities."""
    import torch

    return (torch.nn.CrossEntropyLoss, torch.nn.NLLLoss)


def _losses() -> type:
    import torch

    return torch.nn.modules.loss._Loss


def _elementwise_losses() -> tuple:
    """Loss modules that compare input and target element by element, broadcasting a shape mismatch (with a
    warning) where BCE raises."""
    import torch

    return (torch.nn.MSELoss, torch.nn.L1Loss, torch.nn.SmoothL1Loss, torch.nn.HuberLoss)


def _finite_here(t) -> bool:
    """A CPU scalar's finiteness through a NumPy view (no op, no wait: the per-step flag's way); bfloat16, which
    NumPy lacks, takes one cast. Inlined, not stats.nonfinite_losses: a call per backward counts (the step budget)."""
    try:
        v = t.detach().numpy().item()
    except TypeError:
        v = t.detach().float().numpy().item()
    return math.isfinite(v)


def mode_sensitive() -> tuple:
    """Modules whose forward depends on train/eval mode (dropout, batch norm)."""
    import torch

    return (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._BatchNorm)


def _norm_overflow(rep: dict, event: dict, loss, tracks) -> dict:
    """A replay that found the model's forward and output.sum()'s backward finite blames the loss. Where the step's
    loss was finite and a gradient norm was not (a sweep: SGD at lr 0.5, a loss of 2.9e23, said to come from the loss
    "computed on its output"), every gradient may be finite and only their norm past float32's range (|g| ~3e20 there):
    the event says so."""
    if event["kind"] != "gradient" or loss is None or not math.isfinite(loss):
        return rep
    largest = _largest_finite_gradient(tracks)
    if largest is None:   # a gradient is non-finite: the replay's finding stands (a loss whose own backward is
        return rep        # inf at a finite value, sqrt at 0, comes from the loss)
    event["norm_overflow"] = largest
    return dict(rep, direction="backward", detail=(
        f"every gradient of that step is finite (the largest |g| {largest:.3g}, the loss {loss:.3g}), and their "
        "norm is past float32's range: a run blowing up; lower the learning rate, or clip gradients"))


def _largest_finite_gradient(tracks) -> float | None:
    """The largest |gradient| of every watched optimizer's parameters (a review: the model last called was another
    model, a tensor the optimizer holds was in no model) where every one is finite, else None. One sync, at an event
    only per device; in its widest float (a float64 model's 1e40 is finite; mps has no float64)."""
    import torch

    grads = [p.grad for t in tracks for p in t.params if p.grad is not None]
    if not grads:
        return None
    by_device: dict = {}
    try:
        with torch.no_grad():
            for n in torch._foreach_norm(grads, float("inf")):
                by_device.setdefault(n.device, []).append(n)
            value = max(float(torch.stack([n.to(wide_float(d)) for n in norms]).max()) for d, norms in by_device.items())
    except (RuntimeError, TypeError):   # a norm that cannot be taken: the event stays as it is
        return None
    return value if math.isfinite(value) else None


def _stack(values):
    import torch

    dev = values[0].device
    if all(v.dim() == 0 and v.device == dev for v in values):   # the usual case: two ops, not three per step
        return torch.stack(values).float()
    return torch.stack([v.reshape(()).float().to(dev) for v in values])


def _has_batch_norm(model) -> bool:
    import torch

    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())


def _few(size: int, first: int | None, batch_normed: bool) -> bool:
    """A batch of `size` gives a few samples' loss beside batches of `first` (_root_pre's small_batches): 1 or 2, or
    up to FEW where a BatchNorm of the model reads dimension 0 as samples (a review: a sequence-first LSTM's short
    bucket, 6 time steps after 64, hid a corrupted batch's spike as "6 samples")."""
    return first is not None and size < first and (
        size <= SMALL_BATCH or (batch_normed and size <= FEW and size * FEW <= first))


def _batch_size(args, kwargs):
    import torch

    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor) and v.dim() > 0:
            return int(v.shape[0])
    return None

