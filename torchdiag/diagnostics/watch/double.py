"""One gradient applied twice (issue 27): a parameter two optimizers hold, stepped by both on the gradient the first
applied (the head given its own optimizer and left in the model's too), or one optimizer's step() called twice on
the same gradients. Told by the gradient itself: the same tensor at the same version (a backward that reaches it
adds in place, bumping the version, or makes a new one; zero_grad empties or zeroes it). A gradient changed in
place between the two steps (clipped again) looks new: such a double update is missed, never invented.

A step taken inside another's is a wrapper's (SAM and Lookahead call their inner optimizer's step, ZeRO its shard's,
a subclass its parent's through super().step()): one update, not two. Optimizers sharing one param_groups list are
one optimizer's two faces (the same wrappers): their parameters are not compared. On a healthy run the cost is a
look at each step's first gradient; the shared parameters are found again only when an optimizer comes or goes."""
from __future__ import annotations

import weakref


class DoubleSteps:
    def __init__(self):
        self.shared: list = []              # watched parameters that optimizers of distinct param_groups hold
        self._watched: set[int] = set()     # id() of the tracks' parameters, as of the last _refresh
        self._opts: dict[int, weakref.ref] = {}   # id -> every optimizer that took an outermost step, weakly
        self.held: set[int] = set()   # id() of the watched models' parameters any of them held at its first step
        self._stale = True                  # an optimizer came or went: `shared` is found again
        # (id(optimizer), backwards when it began, its step has a closure, it is its own step again) of the steps
        self._open: list[tuple[int, int, bool, bool]] = []   # running, outermost first
        # id(param) or id(opt) -> (weakref to the gradient last applied, its version, id(opt), what stepped it)
        self._last: dict[int, tuple] = {}   # shared parameters
        self._again: dict[int, tuple] = {}  # each optimizer's first parameter with a gradient
        self.found: dict[int, tuple] = {}   # id(param) -> (step, what stepped it first, what stepped it again)
        self.repeated: dict[int, tuple] = {}   # id(opt) -> (step, what stepped twice): step() twice on one gradient

    def enter(self, opt, backwards: int, closure: bool) -> tuple[bool, bool]:
        """opt.step() begins: (it runs inside another step: a wrapper's inner step; it is this optimizer's own step
        again before any backward: a subclass's super().step(), which torch hooks too)."""
        # a step that began before a backward, with no closure to make one, is over: it raised before its post-hook
        self._open = [e for e in self._open if e[2] or e[1] == backwards]
        ids = [e[0] for e in self._open]
        again = id(opt) in ids
        if again and self._open[ids.index(id(opt))][1] != backwards:   # its closure step raised long ago
            del self._open[ids.index(id(opt)):]
            again = False
        nested = bool(self._open)
        self._open.append((id(opt), backwards, closure, again))
        return nested, again

    def leave(self, opt) -> tuple[bool, bool, bool]:
        """opt.step() ended: (it ran inside another step, it had a closure, it was its own step again)."""
        for k in range(len(self._open) - 1, -1, -1):
            if self._open[k][0] == id(opt):
                _, _, closure, again = self._open[k]
                del self._open[k:]
                return k > 0, closure, again
        return True, False, True   # a step this engine did not see begin: say nothing of it

    def applied(self, opt, tracks: dict, step: int, models=None) -> None:
        """`opt` applies the gradients its parameters hold now (outermost steps only). `tracks`: the engine's;
        only their parameters are looked at."""
        ref = self._opts.get(id(opt))
        if ref is None or ref() is not opt:   # new, or a let-go optimizer's id reused (it must number as new)
            self._opts.pop(id(opt), None)
            self._opts[id(opt)] = weakref.ref(opt, self._gone)
            if models is not None and id(opt) not in tracks:   # one not watched; only the watched models'
                # parameters (an attack's optimizer made per step must not add any)
                self.held.update({id(p) for g in opt.param_groups for p in g["params"]} & models())
            self._stale = True
        if self._stale:
            self._refresh(tracks)
        first = next((p for g in opt.param_groups for p in g["params"] if p.grad is not None), None)
        if first is not None and id(first) in self._watched:   # step() twice: its first gradient tells for all
            self._check(first, opt, step, self._again, id(opt))
        if self.shared:
            mine = {id(p) for g in opt.param_groups for p in g["params"]}
            for p in self.shared:
                if id(p) in mine and p.grad is not None:
                    self._check(p, opt, step, self._last, id(p))

    def _check(self, p, opt, step: int, seen: dict, key: int) -> None:
        grad = p.grad
        last = seen.get(key)
        if last is not None and last[0]() is grad and last[1] == grad._version:
            if last[2] == id(opt):
                self.repeated.setdefault(id(opt), (step, self.label(id(opt), type(opt).__name__)))
            elif id(p) not in self.found:
                self.found[id(p)] = (step, self.label(last[2], last[3]), self.label(id(opt), type(opt).__name__))
        seen[key] = (weakref.ref(grad), grad._version, id(opt), type(opt).__name__)

    def label(self, key: int, kind: str) -> str:
        """The optimizer's type, numbered in the order they first stepped where several live ones have it: the one
        name every finding gives an optimizer (report._idle's too)."""
        alive = [o for r in self._opts.values() if (o := r()) is not None and type(o).__name__ == kind]
        ids = [id(o) for o in alive]
        return f"{kind} #{ids.index(key) + 1}" if len(alive) > 1 and key in ids else kind

    def live(self) -> list:
        """The optimizers that took a step and are still alive."""
        return [o for r in self._opts.values() if (o := r()) is not None]

    def _gone(self, ref) -> None:
        """An optimizer was let go (a weakref callback: only flags, a collection can run inside our loops)."""
        self._stale = True

    def _refresh(self, tracks: dict) -> None:
        """The shared parameters, found again; what was kept of optimizers let go goes (an attack's optimizer,
        made per step, must not leave an entry each)."""
        self._stale = False
        self._watched = watched = set().union(*(t.keys() for t in tracks.values()))
        self._opts = {k: r for k, r in self._opts.items() if r() is not None}
        holders: dict[int, set] = {}
        params: dict[int, object] = {}
        for opt in [r() for r in self._opts.values()]:
            groups = opt.param_groups if opt is not None else []
            for p in (p for g in groups for p in g["params"] if id(p) in watched):
                holders.setdefault(id(p), set()).add(id(groups))
                params[id(p)] = p
        self.shared = [params[i] for i, h in holders.items() if len(h) > 1]
        ids = {id(p) for p in self.shared}
        self._last = {k: v for k, v in self._last.items() if k in ids}
        self._again = {k: v for k, v in self._again.items() if k in self._opts}
