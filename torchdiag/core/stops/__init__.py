"""Where does a zero gradient stop? (issue 26) For parameters whose gradient stays exactly zero, one more
forward + backward on a copy (record.py) finds, by measurement:
- the parameter's own module reads an input of 0 everywhere at every call while its output gets a gradient (a
  weight multiplying zeros: DETR's first decoder layer on zero queries), and which module made that input;
- else the first module on its paths whose output gets a gradient while the input that carries the parameter's
  contribution gets none. What closes it (explain.py): a value it holds that is 0 everywhere (a buffer, a frozen
  parameter, a tensor attribute) and that, set to 1 alone on the copy, lets a gradient through (a frozen
  BatchNorm's zero scale in DETR's backbone); else an input of 0 everywhere and the module that made it; else
  the op inside it that passes none;
- else the op nearest to the parameter that passes none, and the zero operand it saved, named when it is one of
  the model's tensors;
- else the last module output on its paths, which already gets none.
Cost: one forward + backward with a hook per module call and per autograd node the parameters feed, one read
back, and a run of the stopping module alone per zero value it holds."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..module_paths import owner
from . import explain
from .record import MAX_CALLS, Call, Measured, made_between, measure, storage

MAX_OP_WALKS = 512     # parameters whose nearest stopping op is looked for (a walk of the graph each)


@dataclass
class Stop:
    module: str                 # where it stops (the stopping module, the parameter's module, the last one passed)
    kind: str                   # that module's class
    how: str                    # "zero-input" | "module" | "op" | "after"
    opening: list[str] = field(default_factory=list)   # the module's zero values that open it ("buffer `weight`")
    reads_zero: bool = False    # the stopping module's input is 0 everywhere
    producer: str | None = None  # the module that made a zero input
    op: str | None = None       # the op that passes none
    operand: tuple[str, str] | None = None   # what that op saved that closes it (explain.zero_operand)
    cut: bool = False           # the forward made more module calls than were recorded
    ids: object = field(default=None, repr=False)   # a padding stop: the index tensor the lookup saved

    def describe(self) -> str:
        made = f" (made by {self.producer})" if self.producer else ""
        if self.how == "zero-input":
            text = (f"its module {self.module} ({self.kind}) gets an input of 0 everywhere{made}, and a weight that "
                    "multiplies zero gets no gradient")
        elif self.how == "module":
            text = (f"the gradient stops at {self.module} ({self.kind}): its output gets a gradient, the input that "
                    "carries this parameter's part none")
            if self.opening:
                buffers = any(o.startswith("buffer") for o in self.opening)
                text += (f"; its {', '.join(self.opening)} is 0 everywhere, and set to 1 on a copy the module passes a "
                         "gradient" + ("; a buffer is not a parameter: no optimizer step changes it" if buffers else ""))
            elif self.reads_zero:
                text += f"; what it reads is 0 everywhere{made}" + (f", where `{self.op}` passes none" if self.op else "")
            elif self.op in explain.ROUTES:
                text += (f"; inside it, the part of the gradient {_an(self.op)} op hands back towards this parameter is "
                         "already 0 (what reads that part leaves it out)")
            else:
                text += f"; inside it {_an(self.op)} op passes none" if self.op else "; an op inside it passes none"
                text += self._operand()
        elif self.how == "op":
            if self.op in explain.ROUTES:
                text = (f"the part of the gradient {_an(self.op)} op on its path hands back towards this parameter is "
                        "already 0: what reads that part after it (a mask, a max-pool, a selection, an output the loss "
                        "does not cover) leaves it out")
            else:
                text = f"the gradient stops at {_an(self.op)} op on its path: its output gets a gradient and passes none back"
                text += self._operand()
            text += f"; the output of {self.module} ({self.kind}), the last module it passes, already gets none" \
                if self.module else ""
        else:
            text = (f"the gradient is already 0 at the output of {self.module} ({self.kind}), the last module on its "
                    "path: what comes after it (an op outside any module, or a hook on that output) passes it none")
        return text + (f" (the first {MAX_CALLS:,} module calls of the forward were recorded)" if self.cut else "")

    def _operand(self) -> str:
        kind, text = self.operand or ("", "")
        return {"model": f"; the op's saved operand, {text}, is 0 everywhere",
                "stuck": f"; the op's saved operand, {text}, is 0 everywhere and gets no gradient either: each keeps "
                         "the other at 0",
                "made": "; the op's saved operand, a value made in the forward, is 0 everywhere",
                "path": "; the value it gets on this path is 0 everywhere",
                "padding": f"; every index it looks up is its padding index ({text}), whose row gets no gradient",
                "result": "; its output is 0 everywhere (every unit below the activation's zero point: dead units)",
                "one-hot": "; its output is one-hot (every other probability is exactly 0): a saturated softmax "
                           "passes no gradient",
                "one-hot-rows": f"; {text} rows of its output are one-hot (a softmax over one position, or with every "
                                "other one masked, passes no gradient): where the loss reads only those rows, none "
                                "reaches what comes before it",
                }.get(kind, "")

    def selects(self) -> bool:
        """The zero comes from a choice among parts that an input can change: a part of a routing op's output that
        what reads it leaves out (a mask, a selection), or a multiplication by a value made in the forward that is 0
        everywhere (a routing weight of 0, a mask). Not a saturation (a one-hot softmax, dead units), a zero the model
        holds, or a zero input."""
        kind = self.operand[0] if self.operand else ""
        return (self.how in ("op", "module") and not self.opening and not self.reads_zero
                and (self.op in explain.ROUTES or kind == "made"))

    def padding(self) -> str | None:
        """The padding index, when every index the embedding looks up is it: a fact of the ids given, which
        on inputs torchdiag made up says nothing of the model."""
        return self.operand[1] if self.operand and self.operand[0] == "padding" else None

    def hint(self) -> str:
        kind = self.operand[0] if self.operand else ""
        if kind == "padding":
            return ("give it real ids: a model that fills an id input it was not given with the padding index "
                    "(check the forward's optional *_ids arguments) never trains that table")
        if self.opening or kind in ("model", "stuck"):
            return ("give that value what it is meant to start from (the checkpoint the model is built for, or a "
                    "non-zero init); a scale that is meant to learn belongs in a trained parameter")
        if self.how == "zero-input" or self.reads_zero:
            return ((f"find what makes {self.producer}'s output zero" if self.producer else "find where that input is "
                     "zeroed") + "; when it is zero by construction (zero-initialised queries, a padded stream) the "
                    "weight is unused and can be frozen")
        if self.op in explain.ROUTES:
            return (f"look at what reads the output of the `{self.op}` op: a mask, a max-pool or a selection that never "
                    "picks this part means the input never exercises it")
        if kind == "one-hot":
            return ("the logits into the softmax are too far apart: scale them down (a temperature, a 1/√d factor) "
                    "or normalise what makes them")
        if kind == "one-hot-rows":
            return ("a row over a single position is the first query of causal attention (it sees itself alone): an "
                    "output read at that position alone (a classifier pooled at the first token) trains no query or key "
                    "there; pool another position, or attend both ways if the model is meant to (a causal mask set by "
                    "mistake?)")
        op = f"the `{self.op}` op" if self.op else "what the code does with that output"
        return (f"look at {op}: units below an activation's zero point (dead units), or a round, sign, argmax or "
                "comparison, which needs a straight-through estimator to pass a gradient; a mask or selection that "
                "never picks it means the input never exercises it")


def stops(work, inputs, names: list[str], ctx, loss_fn) -> dict[str, Stop]:
    """For each parameter name of `work` (a copy, in the mode of the judged pass) whose gradient is zero:
    where it stops, when that is found."""
    params = dict(work.named_parameters())
    wanted = [n for n in names if n in params]
    if not wanted:
        return {}
    modules = dict(work.named_modules())
    keep = {m for m, mod in modules.items() if explain.zero_values(mod)}
    ms = measure(work, inputs, wanted, params, ctx, loss_fn, {owner(n) for n in wanted}, keep)
    try:
        return _Explainer(ms, modules, ctx, {storage(params[n]) for n in wanted}).all(wanted, params)
    finally:
        ms.loss = None   # the graph goes


class _Explainer:
    def __init__(self, ms: Measured, modules: dict, ctx, stuck: set):
        self.ms, self.modules, self.ctx = ms, modules, ctx
        self.stuck = stuck      # the storages of the parameters whose gradient is zero
        self.names: dict | None = None
        self.cache: dict[int, Stop] = {}
        self.inner: dict = {}   # autograd node -> the innermost call that returned it
        self.outer: dict = {}   # ... and the outermost
        for c in sorted(ms.calls, key=lambda c: c.done):
            for node, _ in c.outs:
                self.inner.setdefault(node, c)
                self.outer[node] = c
        # per call: the parameters it stops (an output that carries them gets a gradient; the inputs that carry
        # them get none)
        self.stopping = []
        for c in ms.calls:
            out = 0
            for node, f in c.outs:
                out |= ms.reach(node) if ms.passes(f) else 0
            passing = zero = 0
            for i in c.ins:
                if ms.passes(i.flag):
                    passing |= ms.reach(i.node)
                else:
                    zero |= ms.reach(i.node)
            if zero & ~passing & out:
                self.stopping.append((c, zero & ~passing & out))

    def all(self, wanted: list[str], params: dict) -> dict[str, Stop]:
        out, walks = {}, 0
        for j, n in enumerate(wanted):
            near = None
            if walks < MAX_OP_WALKS:
                walks += 1
                near = self.ms.ops.first_stop([self.ms.ops.start(id(params[n]))], j, self.ms.feeds)
            stop = self.zero_input(n, near) or self.module_stop(j) or self.op_stop(near, j) or \
                (self.after(j) if walks < MAX_OP_WALKS else None)
            if stop is not None:
                stop.cut = self.ms.cut
                out[n] = stop
        return out

    def zero_input(self, name: str, near) -> Stop | None:
        """The parameter's own module reads 0 everywhere, and the op nearest the parameter that passes none saved
        that very input as its zero operand (a weight times zeros; not a bias behind a dead unit)."""
        m = owner(name)
        calls = [c for c in self.ms.calls if c.module == m]
        if near is None or not any(self.ms.outs_pass(c) for c in calls):
            return None
        zero = explain.zero_tensor(near[0], near[1], self.stuck)
        if zero is None or storage(zero) not in self.ms.fed_storages.get(m, ()):
            return None
        producer = next((self.inner[i.node] for c in calls for i in c.ins if i.node in self.inner), None)
        return Stop(m or "(root)", type(self.modules[m]).__name__, "zero-input", producer=self._label(producer))

    def module_stop(self, j: int) -> Stop | None:
        cands = [c for c, bits in self.stopping if bits >> j & 1]
        if not cands:
            return None
        chosen = cands[0]
        for c in cands[1:]:   # a module called inside the chosen one that stops it too: the innermost
            if c.index > chosen.index and c.done < chosen.done and _inside(c.module, chosen.module):
                chosen = c
        if id(chosen) not in self.cache:
            self.cache[id(chosen)] = self._explain_call(chosen, j)
        return replace(self.cache[id(chosen)])

    def _explain_call(self, c: Call, j: int) -> Stop:
        ms, mod = self.ms, self.modules[c.module]
        cut = [i for i in c.ins if not ms.passes(i.flag) and ms.reach(i.node) >> j & 1]
        stop = Stop(c.module or "(root)", type(mod).__name__, "module")
        stop.opening = [f"{kind} `{n}`" for kind, n in explain.opening(mod, c, {i.tensor for i in cut}, self.ctx)]
        if stop.opening:
            return stop
        stop.reads_zero = all(ms.sizes[i.size] == 0 for i in cut)
        if stop.reads_zero:
            stop.producer = self._label(next((self.inner[i.node] for i in cut if i.node in self.inner), None))
        own = made_between([node for node, _ in c.outs], [i.node for i in c.ins])
        found = ms.ops.first_stop([ms.ops.start(i.node) for i in cut], j, ms.feeds, own)
        if found is not None:
            node, kid = found
            stop.op, stop.operand = explain.op_name(node), explain.zero_operand(node, kid, self._storage(), self.stuck)
            stop.ids = explain.padding_ids(node) if stop.padding() is not None else None
        return stop

    def op_stop(self, near, j: int) -> Stop | None:
        if near is None:
            return None
        node, kid = near
        last = self._passed(kid, j)
        stop = Stop(last.module or "(root)" if last else "", type(self.modules[last.module]).__name__ if last else "",
                    "op", op=explain.op_name(node), operand=explain.zero_operand(node, kid, self._storage(), self.stuck))
        stop.ids = explain.padding_ids(node) if stop.padding() is not None else None
        return stop

    def _passed(self, node, j: int) -> Call | None:
        """The last module the path passed before the op that stops it: the outermost call whose output is the
        nearest module output below that op on parameter j's paths (a walk down the graph from the op's input,
        through the nodes that depend on the parameter)."""
        feeds = self.ms.feeds
        frontier, seen = [node], set()
        while frontier:
            nxt: list = []
            for n in frontier:
                if n is None or n in seen or not feeds.get(n, 0) >> j & 1:
                    continue
                seen.add(n)
                if n in self.outer:
                    return self.outer[n]
                nxt.extend(k for k, _ in n.next_functions)
            frontier = nxt
        return None

    def after(self, j: int) -> Stop | None:
        last = self._last_silent(j)
        return Stop(last.module or "(root)", type(self.modules[last.module]).__name__, "after") if last else None

    def _last_silent(self, j: int) -> Call | None:
        """The last call to return whose outputs carry parameter j's part and get no gradient."""
        ms = self.ms
        silent = [c for c in ms.calls if c.outs and not ms.outs_pass(c)
                  and any(ms.reach(node) >> j & 1 for node, _ in c.outs)]
        return max(silent, key=lambda c: c.done, default=None)

    def _label(self, call: Call | None) -> str | None:
        return None if call is None else f"{call.module or '(root)'} ({type(self.modules[call.module]).__name__})"

    def _storage(self) -> dict:
        if self.names is None:
            self.names = explain.storage_names_from(self.modules)
        return self.names


def _an(op: str | None) -> str:
    return f"a{'n' if op and op[0] in 'aeiou' else ''} `{op}`"


def _inside(inner: str, outer: str) -> bool:
    return outer == "" or inner.startswith(outer + ".")
