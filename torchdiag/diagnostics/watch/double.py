"""One gradient applied twice (issue 27): a parameter two optimizers hold, stepped by both with no backward between
(the head given its own optimizer and left in the model's too), or one optimizer's step() called twice on the same
gradients. Told by the gradient itself: the same tensor, at the same version, with no backward since.

A step taken inside another's is a wrapper's (SAM and Lookahead call their inner optimizer's step, ZeRO its
shard's): one update, not two. Optimizers sharing one param_groups list are one optimizer's two faces (the same
wrappers): their parameters are not looked at, so a healthy run pays for nothing but the list of live tracks."""
from __future__ import annotations

import weakref


class DoubleSteps:
    def __init__(self):
        self.shared: list = []              # parameters two live optimizers (of distinct param_groups) hold
        self._for: tuple | None = None      # the live tracks `shared` was found for
        self._open: list[tuple[int, bool]] = []   # (id(optimizer), nested) of the steps running, outermost first
        # id(param) -> (weakref to the gradient last applied, its version, backwards then, id(opt), its type)
        self._last: dict[int, tuple] = {}   # shared parameters
        self._again: dict[int, tuple] = {}  # id(opt) -> the same, for its first parameter with a gradient
        self.found: dict[int, tuple] = {}   # id(param) -> (step, type that stepped it first, type that stepped again)
        self.repeated: dict[int, tuple] = {}   # id(opt) -> (step, its type, its type): step() twice on one gradient

    def enter(self, opt) -> bool:
        """opt.step() begins; True when it runs inside another optimizer's step (a wrapper's inner step)."""
        ids = [i for i, _ in self._open]
        if id(opt) in ids:   # its last step raised before the post-hook: that one and what it held are over
            del self._open[ids.index(id(opt)):]
        nested = bool(self._open)
        self._open.append((id(opt), nested))
        return nested

    def leave(self, opt) -> bool:
        """opt.step() ended; True when it ran inside another optimizer's step."""
        for k in range(len(self._open) - 1, -1, -1):
            if self._open[k][0] == id(opt):
                nested = self._open[k][1]
                del self._open[k:]
                return nested
        return True   # a step this engine did not see begin: say nothing of it

    def applied(self, opt, tracks, backwards: int, step: int) -> None:
        """`opt` applies the gradients its parameters hold now (outermost steps only): a gradient an earlier step
        applied, the same tensor at the same version with no backward since, is applied a second time."""
        self._refresh(tracks)
        first = next((p for g in opt.param_groups for p in g["params"] if p.grad is not None), None)
        if first is not None:   # step() twice: its first parameter with a gradient tells for all of them
            self._check(first, opt, backwards, step, self._again, id(opt))
        if self.shared:
            mine = {id(p) for g in opt.param_groups for p in g["params"]}
            for p in self.shared:
                if id(p) in mine and p.grad is not None:
                    self._check(p, opt, backwards, step, self._last, id(p))

    def _check(self, p, opt, backwards: int, step: int, seen: dict, key: int) -> None:
        grad = p.grad
        now = (grad._version, backwards)
        last = seen.get(key)
        if last is not None and last[0]() is grad and last[1:3] == now:
            same = last[3] == id(opt)
            if same or id(p) not in self.found:
                where = self.repeated if same else self.found
                where.setdefault(id(opt) if same else id(p), (step, last[4], type(opt).__name__))
        seen[key] = (weakref.ref(grad), *now, id(opt), type(opt).__name__)

    def _refresh(self, tracks) -> None:
        """The shared parameters, found again when the live tracks change; what was kept of others goes (an
        optimizer made per step, an attack's, must not leave an entry each)."""
        live = [(k, t.opt) for k, t in tracks.items() if not isinstance(k, tuple) and t.opt is not None]
        key = tuple(k for k, _ in live)
        if key == self._for:
            return
        self._for = key
        holders: dict[int, set] = {}
        params: dict[int, object] = {}
        for _, opt in live:
            for g in opt.param_groups:
                for p in g["params"]:
                    holders.setdefault(id(p), set()).add(id(opt.param_groups))
                    params[id(p)] = p
        self.shared = [params[i] for i, h in holders.items() if len(h) > 1]
        ids = {id(p) for p in self.shared}
        self._last = {k: v for k, v in self._last.items() if k in ids}
        self._again = {k: v for k, v in self._again.items() if k in {id(o) for _, o in live}}
