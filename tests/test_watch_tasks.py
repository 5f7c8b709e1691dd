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
    assert any("3 different sets of parameters in turns" in n for n in r.notes), r.notes


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
