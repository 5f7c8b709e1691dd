"""watch: one gradient applied twice (double.py). Two optimizers holding the same parameters, or step() called
twice, are found; the loops that legitimately step twice per backward (wrappers that call an inner optimizer's
step, closures, optimizers over the same parameters used in turn) are not."""
from __future__ import annotations

import weakref

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torchdiag.diagnostics.watch import Watch


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def _data(steps=30):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)) for _ in range(steps)]


def _codes(result):
    return {f.code for f in result.findings if f.severity in ("error", "warning")}


def _run(model, step, given=(), steps=30, **zero):
    """A plain loop whose update is `step()`; the watch's Result."""
    with Watch(model, list(given) or None, every=10) as w:
        for x, y in _data(steps):
            for opt in zero.get("zero", ()):
                opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            step()
    return w.result()


@pytest.mark.parametrize("given", [False, True])
def test_a_head_in_two_optimizers_is_updated_twice(given):
    """The head given its own optimizer and left in the model's: both apply the one gradient."""
    model = _mlp()
    body, head = torch.optim.Adam(model.parameters(), 1e-3), torch.optim.SGD(model[2].parameters(), 0.1)

    def step():
        body.step()
        head.step()

    r = _run(model, step, given=(body, head) if given else (), zero=(body, head))
    found = [f for f in r.findings if f.code == "double-update"]
    assert len(found) == 1 and found[0].severity == "warning", [f.to_dict() for f in r.findings]
    assert "2.weight, 2.bias" in found[0].message and "(Adam, then SGD)" in found[0].message
    assert "0.weight" not in found[0].message and "double-step" not in _codes(r)


def test_step_called_twice_on_one_gradient():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), 0.01)

    def step():
        opt.step()
        opt.step()

    r = _run(model, step, zero=(opt,))
    assert _codes(r) == {"double-step"}, [f.to_dict() for f in r.findings]
    assert "optimizer SGD: step() ran again" in next(f.message for f in r.findings if f.code == "double-step")


def test_a_second_step_after_a_new_backward_is_not_double():
    """Two losses, each with its own backward and step of optimizers over shared parameters (multi-task
    alternation), and a missing zero_grad (gradients carried, but recomputed): no double update."""
    model = _mlp()
    a, b = torch.optim.SGD(model.parameters(), 0.01), torch.optim.SGD(model.parameters(), 0.01)
    with Watch(model, every=10) as w:
        for x, y in _data():
            for opt in (a, b):
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
    assert not {"double-update", "double-step"} & _codes(w.result())

    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), 0.001)
    r = _run(model, opt.step)   # zero_grad forgotten
    assert "grad-carried-over" in _codes(r) and not {"double-update", "double-step"} & _codes(r)


class _SAM(torch.optim.Optimizer):
    """Sharpness-aware minimisation as usually written: an inner optimizer over the same param groups, stepped
    inside step(closure), or through first_step/second_step."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})
        self.base_optimizer = torch.optim.SGD(self.param_groups, lr=lr)
        self.param_groups = self.base_optimizer.param_groups

    @torch.no_grad()
    def first_step(self):
        self.moved = [(p, p.grad * 0.05) for g in self.param_groups for p in g["params"] if p.grad is not None]
        for p, e in self.moved:
            p.add_(e)
        self.zero_grad()

    @torch.no_grad()
    def second_step(self):
        for p, e in self.moved:
            p.sub_(e)
        self.base_optimizer.step()

    def step(self, closure):
        self.first_step()
        with torch.enable_grad():
            closure()
        self.second_step()


class _Lookahead(torch.optim.Optimizer):
    """A wrapper with its own param groups (ZeRO-like): the inner step runs inside the outer one."""

    def __init__(self, inner):
        super().__init__([p for g in inner.param_groups for p in g["params"]], {"lr": 0.0})
        self.inner = inner

    @torch.no_grad()
    def step(self, closure=None):
        self.inner.step()


@pytest.mark.parametrize("how", ["closure", "two-steps", "wrapper", "lbfgs"])
def test_wrappers_and_closures_are_one_update(how):
    model = _mlp()
    with Watch(model, every=10) as w:
        sam = _SAM(model.parameters(), lr=0.01)
        inner = torch.optim.SGD(model.parameters(), 0.01)
        outer = _Lookahead(inner)
        lbfgs = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
        for x, y in _data(20):
            def closure(x=x, y=y):
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                return loss

            sam.zero_grad()
            if how == "closure":
                closure()
                sam.step(closure)
            elif how == "two-steps":
                closure()
                sam.first_step()
                closure()
                sam.second_step()
            elif how == "wrapper":
                closure()
                outer.step()
            else:
                def lb_closure(x=x, y=y):
                    lbfgs.zero_grad()
                    return closure(x, y)

                lbfgs.step(lb_closure)
    r = w.result()
    assert not {"double-update", "double-step"} & _codes(r), [f.to_dict() for f in r.findings]
    assert r.data["steps"] == 20


def test_a_step_that_raised_does_not_hide_later_doubles():
    """A step() that raised never reached its post-hook: the next steps are not taken for its inner ones."""
    model = _mlp()
    opt, head = torch.optim.SGD(model.parameters(), 0.01), torch.optim.SGD(model[2].parameters(), 0.01)
    boom = {"left": 1}

    def fail(optimizer, args, kwargs):
        if boom["left"]:
            boom["left"] -= 1
            raise RuntimeError("skip this step")

    handle = opt.register_step_pre_hook(fail)
    with Watch(model, every=10) as w:
        for x, y in _data():
            opt.zero_grad()
            head.zero_grad()
            F.cross_entropy(model(x), y).backward()
            try:
                opt.step()
            except RuntimeError:
                continue
            head.step()
    handle.remove()
    assert "double-update" in _codes(w.result())


def test_optimizers_made_per_step_leave_nothing_behind():
    """An attack's optimizer, made for every batch over a new perturbation: what double.py keeps of each goes
    with it (a long run must not keep an entry per step)."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), 0.01)
    with Watch(model, every=10) as w:
        for x, y in _data(40):
            delta = torch.zeros_like(x, requires_grad=True)
            attack = torch.optim.SGD([delta], lr=0.1)
            for _ in range(2):
                attack.zero_grad()
                (-F.cross_entropy(model(x + delta), y)).backward()
                attack.step()
            opt.zero_grad()
            F.cross_entropy(model(x + delta.detach()), y).backward()
            opt.step()
        kept = w.engine.doubles
        assert len(kept._again) <= 3 and not kept._last and not kept.shared
    assert not {"double-update", "double-step"} & _codes(w.result())


class _Counting(torch.optim.SGD):
    """An optimizer subclass that calls its parent's step (a counting or learning-rate-setting subclass): with a
    plain SGD made before it, torch hooks both classes' step, so the hooks run twice for one update."""

    def step(self, closure=None):
        self.calls = getattr(self, "calls", 0) + 1
        return super().step(closure)


@pytest.mark.parametrize("given", [False, True])
def test_a_subclass_calling_super_step_is_one_update(given):
    """A review: the inner call of the same optimizer was taken for a step that raised, then for a second step."""
    torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)   # hooks SGD.step itself
    model = _mlp()
    opt = _Counting(model.parameters(), 0.01)
    r = _run(model, opt.step, given=(opt,) if given else (), zero=(opt,))
    assert not {"double-update", "double-step"} & _codes(r), [f.to_dict() for f in r.findings]
    assert r.data["steps"] == 30


@pytest.mark.parametrize("given", ["body", "head"])
def test_one_optimizer_given_still_sees_the_other(given):
    """A review: with Watch(model, body) the head's own optimizer, not given, was never looked at, so the common
    call could not find the bug it makes."""
    model = _mlp()
    body, head = torch.optim.Adam(model.parameters(), 1e-3), torch.optim.SGD(model[2].parameters(), 0.1)

    def step():
        body.step()
        head.step()

    r = _run(model, step, given=(body if given == "body" else head,), zero=(body, head))
    assert "double-update" in _codes(r), [f.to_dict() for f in r.findings]


def test_another_models_backward_between_the_two_steps():
    """A review: a backward of another loss between the two steps made the head's unchanged gradient look new."""
    model, other = _mlp(), nn.Linear(8, 1)
    body, head = torch.optim.Adam(model.parameters(), 1e-3), torch.optim.SGD(model[2].parameters(), 0.1)
    other_opt = torch.optim.SGD(other.parameters(), 0.01)
    with Watch(model, every=10) as w:
        for x, y in _data():
            for opt in (body, head, other_opt):
                opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            body.step()
            other(x).pow(2).mean().backward()
            other_opt.step()
            head.step()
    assert "double-update" in _codes(w.result())


def test_two_heads_of_one_type_are_told_apart():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
    body = torch.optim.Adam(model.parameters(), 1e-3)
    heads = [torch.optim.SGD(model[2].parameters(), 0.1), torch.optim.SGD(model[4].parameters(), 0.1)]

    def step():
        body.step()
        for h in heads:
            h.step()

    r = _run(model, step, zero=(body, *heads))
    found = sorted(f.message for f in r.findings if f.code == "double-update")
    assert len(found) == 2 and "(Adam, then SGD #1)" in found[0] and "(Adam, then SGD #2)" in found[1], found


def test_the_shared_parameters_are_found_again_only_when_optimizers_change(monkeypatch):
    """One optimizer per parameter, stepped inside backward (torch's tutorial): finding the shared parameters at
    every step would cost (optimizers)² per iteration (a review: +12%)."""
    from torchdiag.diagnostics.watch import double

    calls = []
    original = double.DoubleSteps._refresh
    monkeypatch.setattr(double.DoubleSteps, "_refresh", lambda self, tracks: (calls.append(1), original(self, tracks)))
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(10)])
    opts = {p: torch.optim.SGD([p], 1e-3) for p in model.parameters()}

    def hook(p):
        opts[p].step()
        opts[p].zero_grad()

    handles = [p.register_post_accumulate_grad_hook(hook) for p in model.parameters()]
    with Watch(model, every=10):
        for _ in range(20):
            model(torch.randn(4, 8)).pow(2).mean().backward()
    for h in handles:
        h.remove()
    assert len(calls) <= 2 * len(opts), len(calls)


def test_an_optimizer_has_one_name_in_every_finding():
    """A review: optimizer-idle numbered the optimizers of a type among every track (the Adam of a model let go
    too) and double-update among the live ones: one Adam was "Adam #2" in one finding and "Adam #1" in the other."""
    def step(model, opts, x, y):
        for o in opts:
            o.zero_grad()
        F.cross_entropy(model(x), y).backward()
        for o in opts:
            o.step()

    data = _data(130)
    with Watch(every=10) as w:
        first = _mlp()
        opt = torch.optim.Adam(first.parameters(), 1e-3)
        for x, y in data[:10]:
            step(first, [opt], x, y)
        del first, opt   # a first model let go with its Adam
        model = _mlp()
        body_and_head, head = torch.optim.Adam(model.parameters(), 1e-3), torch.optim.Adam(model[2].parameters(), 1e-3)
        for i, (x, y) in enumerate(data[10:]):   # both step the head; the first stops at 30, still alive
            step(model, [body_and_head, head] if i < 30 else [head], x, y)
    found = {f.code: f.message for f in w.result().findings}
    assert found["optimizer-idle"].startswith("Adam #1 stepped 30 times"), found
    assert "(Adam #1, then Adam #2)" in found["double-update"], found


def test_an_optimizer_on_a_let_go_ones_id_numbers_as_new():
    """CI: an Adam let go and a new Adam made at the same address. The entry under that id was the dead one's, so
    the new Adam was not filed until it stepped after another: the two findings' numbers depended on the allocator."""
    from torchdiag.diagnostics.watch.double import DoubleSteps

    class Gone:
        pass

    model = _mlp()
    first, second = torch.optim.Adam(model.parameters()), torch.optim.Adam(model[2].parameters())
    d = DoubleSteps()
    dead = Gone()
    d._opts[id(first)] = weakref.ref(dead)   # what a let-go optimizer at this address left
    del dead
    F.cross_entropy(model(torch.randn(4, 8)), torch.tensor([0, 1, 2, 0])).backward()
    d.applied(first, {}, 1)
    d.applied(second, {}, 1)
    assert [d.label(id(o), "Adam") for o in (first, second)] == ["Adam #1", "Adam #2"]
