"""A model given to watch whose own forward never runs (a Lightning-style wrapper whose `training_step` calls
`self.student` and `self.teacher`): a model given turns the search for models off (the engine asks every call only
in the first steps and the step after each read), and a teacher inside it is asked here, in its sampled steps too. Its submodules' calls are asked as the search asks them (frozen.py): the outermost call under no_grad, and
a call with grad at the top (a teacher whose output the loop detaches); a frozen one whose output a backward goes
through is on the trained path. Hooked from the start until the first read (a teacher first used after a warm-up),
then in the steps sampled after each read; unhooked as soon as the model's own forward runs. Cost: two Python calls
per submodule call while hooked."""
from __future__ import annotations

import functools

from .frozen import LATER, frozen_probe, passed_through, recomputed, worth_asking


class Children:
    def __init__(self, engine):
        self.engine = engine
        self.hooks: dict[int, list] = {}   # model id -> its submodules' hook handles
        self.grads: list = []              # grad mode of each hooked call open (None: not asked)
        self.asked = 0                     # how many of them were asked

    def hook(self, key: int, root) -> None:
        if key in self.hooks:
            return
        mods = [m for m in inner(root).modules() if m is not inner(root)]
        self.hooks[key] = [h for m in mods for h in (
            m.register_forward_pre_hook(functools.partial(self._pre, key)),
            m.register_forward_hook(functools.partial(self._post, key), always_call=True))]

    def unhook(self, key: int | None = None) -> None:
        for k in [key] if key is not None else list(self.hooks):
            for h in self.hooks.pop(k, []):
                h.remove()
        if not self.hooks:
            self.grads, self.asked = [], 0

    def _pre(self, key, module, args):
        import torch

        if torch.compiler.is_compiling():   # traced into a compiled child's graph: nothing of ours in it (a review:
            return                          # graph breaks at each module type); _post skips alike
        grad = None
        try:
            grad = self._ask(key, module)
        except Exception:   # noqa: BLE001 - a help, never a failure of the run: this call is not asked
            grad = None
        finally:
            self.grads.append(grad)
            self.asked += grad is not None

    def _ask(self, key, module) -> bool | None:
        """The call's grad mode (None: not asked), a probe made where the search would make one."""
        import torch

        eng = self.engine
        if eng.broken or key in eng._called:   # its own forward runs: the model is judged as a called one
            return None
        grad = torch.is_grad_enabled()
        if torch._C._current_graph_task_id() != -1:   # inside a backward
            if grad:
                recomputed(eng._nograd.get(id(module)))
            return None
        top = not self.asked   # no asked call open around this one
        outer = top or self.grads[-1] is not False
        if id(module) not in eng._nograd and worth_asking(module, grad, outer, top):
            made = frozen_probe(module, eng.step, mode_sensitive())
            if made is not LATER:   # lazy weights, or in eval now: asked again at its next call
                eng._nograd[id(module)] = made
        return grad

    def _post(self, key, module, args, output):
        import torch

        if torch.compiler.is_compiling():
            return
        grad = self.grads.pop() if self.grads else None
        self.asked -= grad is not None
        if not grad:
            return
        try:
            passed_through(self.engine._nograd.get(id(module)), output)
        except Exception:   # noqa: BLE001 - a help, never a failure of the run
            pass


def inner(root):
    from .engine import inner as unwrap

    return unwrap(root)


def mode_sensitive():
    from .engine import mode_sensitive as sensitive

    return sensitive()

