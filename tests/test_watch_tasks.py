"""watch on loops that sample a task per step, each through a head of its own (fifty-third session): the losses of
tasks at different scales are judged per task, found by which parameters each step's gradient reached."""
from __future__ import annotations

import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from torchdiag.diagnostics.watch import Watch


class _Tasks(nn.Module):
    def __init__(self, heads: dict[str, int]):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.heads = nn.ModuleDict({k: nn.Linear(64, n) for k, n in heads.items()})

    def forward(self, x, task):
        return self.heads[task](self.body(x))


def _loss(task: str, out, x, w):
    if task == "reg":   # a regression to targets of scale ~100: an MSE of ~1e4 where the others are ~1
        return F.mse_loss(out, x @ w)
    cols = {"cls": 0, "seg": 2}[task]
    return F.cross_entropy(out, (x[:, cols] > 0).long())


def _sampled(steps: int = 300, corrupt_at: int | None = None, tasks=("cls", "reg", "seg"), every: int = 50):
    """A task drawn per step (random.choice, as multi-task loops do); at `corrupt_at` (1-based, a reg step from
    then on) that task's batch is scaled 100x once."""
    torch.manual_seed(0)
    rnd = random.Random(0)
    model = _Tasks({k: 1 if k == "reg" else 2 for k in tasks})
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    w = torch.randn(16, 1) * 30
    pending = corrupt_at
    with Watch(every=every, replay=False) as watch:
        for step in range(1, steps + 1):
            task = rnd.choice(tasks)
            x = torch.randn(32, 16)
            if pending is not None and step >= pending and task == "reg":
                x, pending = x * 100, None
            loss = _loss(task, model(x, task), x, w)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return watch.result()


def _codes(r, *codes):
    return [(f.code, f.message) for f in r.findings if f.code in codes]


def test_tasks_drawn_per_step_at_different_scales_are_no_spike():
    """A review: a regression head's loss of 1e4 drawn between cross-entropies of 2 was a loss-spike, and its
    gradient norm a grad-norm-explosion, on a healthy run."""
    r = _sampled()
    assert _codes(r, "loss-spike", "grad-norm-explosion") == []
    assert [f.code for f in r.findings if f.severity != "info"] == [], [(f.code, f.message) for f in r.findings]
    assert any("3 sets of parameters in turns" in n and "at 2 levels of loss" in n for n in r.notes), r.notes


def test_a_spike_within_one_task_is_still_found_and_names_the_task():
    r = _sampled(corrupt_at=200, every=10)
    spikes = _codes(r, "loss-spike")
    assert len(spikes) == 1, [(f.code, f.message) for f in r.findings]
    assert "whose gradient reached heads.reg.bias, heads.reg.weight" in spikes[0][1], spikes[0][1]


def test_two_tasks_at_one_scale_are_one_curve():
    """Two classification heads (cross-entropies at one level) drawn per step: nothing to tell apart."""
    r = _sampled(tasks=("cls", "seg"))
    assert not any("sets of parameters" in n for n in r.notes), r.notes
    assert [f.code for f in r.findings if f.severity != "info"] == []


def test_a_head_frozen_then_trained_is_a_phase_not_tasks():
    """One change of the parameters reached (the body frozen for 100 steps, then trained) is not tasks in turns: the
    curve stays one."""
    torch.manual_seed(0)
    model = _Tasks({"reg": 1})
    opt = torch.optim.SGD(model.parameters(), 1e-4)
    w = torch.randn(16, 1) * 30
    model.body.requires_grad_(False)
    with Watch(every=10, replay=False) as watch:
        for step in range(200):
            if step == 100:
                model.body.requires_grad_(True)
            x = torch.randn(32, 16)
            loss = _loss("reg", model(x, "reg"), x, w)
            opt.zero_grad()
            loss.backward()
            opt.step()
    r = watch.result()
    assert not any("sets of parameters" in n for n in r.notes), r.notes
    assert watch.engine.reach_sets and len(watch.engine.reach_sets) == 2   # both sets were seen, and not split on


class _Routed(_Tasks):
    """Two tasks, and an expert layer routed per batch (one of `experts` drawn each step)."""

    def __init__(self, experts: int):
        super().__init__({"cls": 2, "reg": 1})
        self.experts = nn.ModuleList(nn.Linear(64, 64) for _ in range(experts))

    def forward(self, x, task):
        h = self.body(x)
        h = torch.relu(self.experts[int(torch.randint(len(self.experts), ()))](h)) + h
        return self.heads[task](h)


def test_experts_routed_per_batch_under_two_tasks_are_two_levels_and_a_corrupt_batch_is_found():
    """A review: with 16 experts every (task, expert) set was its own; a rare one went with the other task's steps (a
    false spike) and the corrupt batch at step 305 was missed. Sets at one level are one group; a rare set goes with
    the group whose own parameters (its task's head) it reached."""
    torch.manual_seed(0)
    rnd = random.Random(0)
    model = _Routed(16)
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    w = torch.randn(16, 1) * 30
    corrupt = None
    with Watch(every=10, replay=False) as watch:
        for step in range(1, 501):
            task = rnd.choice(["cls", "reg"])
            x = torch.randn(32, 16)
            if corrupt is None and step >= 305 and task == "reg":
                x, corrupt = x * 100, step
            loss = _loss(task, model(x, task), x, w)
            opt.zero_grad()
            loss.backward()
            opt.step()
    r = watch.result()
    spikes = _codes(r, "loss-spike", "grad-norm-explosion")
    assert [s for s in spikes if s[0] == "loss-spike"] and all(f"at step {corrupt} " in m for _, m in spikes), spikes
    assert all("reached heads.reg.bias, heads.reg.weight" in m for _, m in spikes), spikes
    assert any("at 2 levels of loss" in n for n in r.notes), r.notes


def test_a_rare_task_whose_loss_explodes_is_judged_on_its_own_steps():
    """A review: an auxiliary task drawn at 4% of the steps, its loss climbing to 1e16, was in no group judged."""
    torch.manual_seed(0)
    rnd = random.Random(1)
    model = _Tasks({"cls": 2, "reg": 1, "aux": 1})
    opt = torch.optim.SGD([{"params": [p for n, p in model.named_parameters() if "aux" not in n], "lr": 1e-4},
                           {"params": model.heads["aux"].parameters(), "lr": 0.3}])
    w = torch.randn(16, 1) * 30
    with Watch(every=10, replay=False) as watch:
        for _ in range(600):
            task = rnd.choices(["cls", "reg", "aux"], weights=[56, 40, 4])[0]
            x = torch.randn(32, 16)
            out = model(x, task)
            loss = F.mse_loss(out, x[:, :1] * 4) if task == "aux" else _loss(task, out, x, w)
            opt.zero_grad()
            loss.backward()
            opt.step()
    r = watch.result()
    found = [(f.code, f.message) for f in r.findings if f.severity != "info" and "heads.aux" in f.message]
    assert found, [(f.code, f.message) for f in r.findings]


def test_blocks_skipped_at_random_in_one_task_are_no_tasks():
    """A review: one cross-entropy whose blocks are skipped at random (stochastic depth) reaches sets whose gradient
    norms differ 2x; it was split and said to be "tasks taken in turns". Only losses at different levels split."""
    class Skipping(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.out = nn.Linear(16, 64), nn.Linear(64, 2)
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)) for _ in range(2))
            self.rnd = random.Random(0)

        def forward(self, x):
            h = self.inp(x)
            for b in self.blocks:
                if not (self.training and self.rnd.random() < 0.5):
                    h = h + 3.0 * b(h)
            return self.out(h)

    torch.manual_seed(0)
    model = Skipping()
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    with Watch(every=10, replay=False) as watch:
        for _ in range(300):
            x = torch.randn(32, 16)
            loss = F.cross_entropy(model(x), (x[:, 0] > 0).long())
            opt.zero_grad()
            loss.backward()
            opt.step()
    r = watch.result()
    assert len(watch.engine.reach_sets) >= 2 and not any("sets of parameters" in n for n in r.notes), r.notes
    assert [f.code for f in r.findings if f.severity != "info"] == []


def _curriculum(joined: str, steps: int = 300):
    """A classifier trained alone, then from step 101 a regression head's MSE (targets of scale ~30, ~1e3 against a
    cross-entropy of ~0.3) added to the loss (`joined="term"`); or the same jump at step 101 with no head joining
    (`"none"`: targets x30 from then on, the classifier's loss alone, a corrupted stream: the curve's own affair)."""
    torch.manual_seed(0)
    model = _Tasks({"cls": 2, "reg": 1})
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    w = torch.randn(16, 1) * 10
    with Watch(model, opt, every=50, replay=False) as watch:   # given: its forward is not called whole
        for step in range(1, steps + 1):
            x = torch.randn(32, 16)
            h = model.body(x)
            loss = F.cross_entropy(model.heads["cls"](h), (x[:, 0] > 0).long())
            if step > 100 and joined == "term":
                loss = loss + F.mse_loss(model.heads["reg"](h), x @ w)
            elif step > 100:
                loss = loss * 1e3
            opt.zero_grad()
            loss.backward()
            opt.step()
    return watch.result()


def test_a_term_that_joins_the_loss_is_a_phase_not_a_divergence():
    """A sweep: an MSE head switched on at step 101 (a curriculum, a loss term's warm-up) made the loss jump 0.6 ->
    3561 and fall from there (958 -> 270), read as `loss-diverged` (an error), `loss-spike` and `grad-norm-explosion`.
    The step's gradient first reached heads.reg there, the loss left its range, and the new term fell: two phases,
    each judged apart. The same jump with nothing joining is still judged on one curve."""
    r = _curriculum("term")
    assert not _codes(r, "loss-diverged", "loss-spike", "grad-norm-explosion"), r.findings
    assert any("at step 101 the gradients first reached heads.reg.bias, heads.reg.weight" in n for n in r.notes), r.notes
    r = _curriculum("none")
    assert not any("joined the loss" in n for n in r.notes)
    assert _codes(r, "loss-diverged", "loss-spike"), [(f.code, f.message) for f in r.findings]
