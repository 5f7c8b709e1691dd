"""watch on training loops a sweep of realistic patterns broke (twenty-fifth session): a backbone unfrozen with
add_param_group, Lightning's manual optimisation, update ratios of a first layer, checkpointed blocks."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torchdiag.diagnostics.watch import Watch


def _data(steps: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(16, 4, generator=g)
    out = []
    for _ in range(steps):
        x = torch.randn(32, 16, generator=g)
        out.append((x, (x @ w).argmax(1)))
    return out


def _frozen_then_unfrozen(nan_at: int | None, given: bool, steps: int = 120, unfreeze: int = 40):
    """A head trained alone, then the backbone unfrozen with add_param_group at `unfreeze`; optionally a NaN
    gradient in the backbone's first weight at step `nan_at` (1-based)."""
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
    model = nn.Sequential(backbone, nn.Linear(32, 4))
    backbone.requires_grad_(False)
    opt = torch.optim.Adam(model[1].parameters(), 3e-3)
    step = [0]   # the hook reads the loop's step
    with Watch(*([model] if given else []), every=10, replay=False) as w:
        for i, (x, y) in enumerate(_data(steps)):
            if i == unfreeze:
                backbone.requires_grad_(True)
                opt.add_param_group({"params": backbone.parameters(), "lr": 1e-3})
                backbone[0].weight.register_hook(lambda g: g * float("nan") if step[0] == nan_at else g)
            step[0] = i + 1
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    return w.result()


@pytest.mark.parametrize("given", [False, True])
def test_parameters_added_with_add_param_group_are_watched(given):
    """A sweep: the added parameters were never watched. Their NaN gradient was applied unseen, and the next step's
    non-finite loss named the head."""
    r = _frozen_then_unfrozen(nan_at=70, given=given)
    bad = [f for f in r.findings if f.code == "non-finite-gradient"]
    assert len(bad) == 1 and "at step 70" in bad[0].message and "0.0.weight" in bad[0].message, \
        [(f.code, f.message) for f in r.findings]
    assert "1.weight" not in bad[0].message


@pytest.mark.parametrize("given", [False, True])
def test_a_healthy_unfreeze_is_one_optimizer_one_curve_and_every_row(given):
    r = _frozen_then_unfrozen(nan_at=None, given=given)
    assert [f.code for f in r.findings if f.severity != "info"] == [], [(f.code, f.message) for f in r.findings]
    # the rate of the group it had before the larger one was added (a sweep: "0.003 → 0.001" read as a decay)
    assert r.header["optimizers"] == ["Adam (lr 0.003)"] and r.data["steps"] == 120
    rows = {row["name"]: row for row in r.table("layers").rows}
    assert {"0.0.weight", "0.0.bias", "1.weight", "1.bias"} <= set(rows), sorted(rows)
    assert rows["0.0.weight"]["changed"] and rows["1.weight"]["changed"]


def _closure_run(opt_kind: str, nan_at: int | None = None, call_closure: bool = True, steps: int = 30,
                 every: int = 10, replay: bool = True):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    if opt_kind == "lbfgs":
        opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, line_search_fn="strong_wolfe")
    elif opt_kind == "lbfgs-plain":
        opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    elif opt_kind == "lazy":   # an optimizer that ignores its closure (the gradients were made before step)
        class Lazy(torch.optim.SGD):
            def step(self, closure=None):
                return super().step()
        opt = Lazy(model.parameters(), lr=0.1)
    else:
        opt = torch.optim.Adam(model.parameters(), 1e-2)
    calls = [0]
    model[2].weight.register_hook(lambda g: g * float("nan") if calls[0] == nan_at else g)
    with Watch(model, every=every, replay=replay) as w:
        for i, (x, y) in enumerate(_data(steps)):
            calls[0] = i + 1

            def closure(x=x, y=y):
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                return loss
            if not call_closure:
                closure()
            opt.step(closure)
    return w.result()


@pytest.mark.parametrize("kind", ["adam", "lbfgs"])
def test_a_closure_step_is_read_before_its_update(kind):
    """A sweep: step(closure) was read after the update (no update/weight ratio, no replay), Lightning's manual
    optimisation too, whose closure does nothing. Read when the closure first returns: LBFGS evaluates it 4 times
    a step, one step each."""
    r = _closure_run(kind)
    assert r.data["steps"] == 30 and [f.code for f in r.findings if f.severity != "info"] == [], \
        [(f.code, f.message) for f in r.findings]
    rows = r.table("layers").rows
    if kind == "lbfgs":   # several updates a step: a ratio per step is not the band's (it read 0.34 here)
        assert any("evaluated its closure several times" in n for n in r.notes), r.notes
        assert all(row["update_ratio"] is None for row in rows)
        loss = dict(r.summary)["loss"]   # a line search's evaluations, not micro-batches of a backward (a sweep)
        assert "losses its closure evaluated" in loss and "backward calls" not in loss, loss
    else:
        assert not any("closure" in n for n in r.notes), r.notes
        assert all(row["update_ratio"] is not None and row["update_ratio"] > 0 for row in rows)


def test_a_non_finite_gradient_in_a_closure_step_is_caught_before_the_update_and_replayed():
    r = _closure_run("adam", nan_at=12)
    bad = [f for f in r.findings if f.code == "non-finite-gradient"]
    assert len(bad) == 1 and "at step 12" in bad[0].message and "2.weight" in bad[0].message, \
        [(f.code, f.message) for f in r.findings]
    assert r.data["replay"] is not None, r.notes


def test_an_optimizer_that_never_calls_its_closure_is_read_after_its_step():
    r = _closure_run("lazy", call_closure=False)
    assert r.data["steps"] == 30
    assert any("did not call its closure" in n for n in r.notes), r.notes


def test_a_first_layer_ratio_samples_every_input_column():
    """A sweep: the ratio's sample of Linear(64, 128) took every 32nd element, which is input columns 0 and 32 of
    every row. Inputs blank there (digits' border pixels) left those weights without a gradient: the ratio read 0
    for a layer that trained. The sample's ratio must agree with the whole weight's, measured here."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 10, generator=g)
    truth = []
    with Watch(model, every=10) as watch:
        for step in range(1, 21):
            x = torch.randn(32, 64, generator=g)
            x[:, ::32] = 0                     # blank columns: their weights get no gradient
            opt.zero_grad()
            F.cross_entropy(model(x), (x @ w).argmax(1)).backward()
            before = model[0].weight.detach().clone()
            opt.step()
            if step % 10 == 0:
                truth.append(float((model[0].weight.detach() - before).norm() / before.norm()))
    got = {row["name"]: row["update_ratio"] for row in watch.result().table("layers").rows}["0.weight"]
    assert got == pytest.approx(truth[-1], rel=0.5), (got, truth)


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_blocks_are_not_models_of_their_own(reentrant):
    """A sweep: with no model given, each torch.utils.checkpoint block's recomputation (a forward run inside the
    backward) was found as a model: `models: Net, Block, Block` and every name prefixed `Net#0.`."""
    from torch.utils.checkpoint import checkpoint

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.out = nn.Linear(16, 32), nn.Linear(32, 4)
            self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 32), nn.ReLU()) for _ in range(2))

        def forward(self, x):
            x = self.inp(x)
            for b in self.blocks:
                x = x + checkpoint(b, x, use_reentrant=reentrant)
            return self.out(x)

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    with Watch(every=10) as w:
        for x, y in _data(30):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    r = w.result()
    assert r.header["models"] == ["Net"], r.header["models"]
    assert "blocks.0.1.weight" in {row["name"] for row in r.table("layers").rows}


def test_an_optimizer_that_came_later_is_judged_on_its_own_steps():
    """A sweep: a LoRA whose A and B both start at zero (no gradient ever), trained after 30 steps of pre-training
    by an optimizer let go, was said to get no gradient "in 260 steps"; its AdamW took 230."""
    class LoRA(nn.Module):
        def __init__(self, base):
            super().__init__()
            self.base = base.requires_grad_(False)
            self.a, self.b = nn.Parameter(torch.zeros(2, 16)), nn.Parameter(torch.zeros(4, 2))

        def forward(self, x):
            return self.base(x) + x @ self.a.t() @ self.b.t()

    torch.manual_seed(0)
    base = nn.Linear(16, 4)
    data = _data(80)
    with Watch(every=10) as w:
        pre = torch.optim.SGD(base.parameters(), lr=0.1)
        for x, y in data[:30]:
            pre.zero_grad()
            F.cross_entropy(base(x), y).backward()
            pre.step()
        del pre
        model = LoRA(base)
        lora = torch.optim.AdamW([model.a, model.b], 1e-3)
        for x, y in data[30:]:
            lora.zero_grad()
            F.cross_entropy(model(x), y).backward()
            lora.step()
    r = w.result()
    found = [f for f in r.findings if f.code == "loss-ignores-parameters"]
    assert r.data["steps"] == 80 and len(found) == 1 and "its 50 steps of the run's 80" in found[0].message, \
        [(f.code, f.message) for f in r.findings]


def test_a_run_that_failed_before_its_first_step_says_nothing_of_losses(tmp_path):
    """A sweep: a script that raised before any step got, beside its error, "no loss was seen ... need w.log"."""
    from torchdiag.diagnostics.watch.script import run_command
    from torchdiag.errors import ModelError

    path = tmp_path / "train.py"
    path.write_text("import torch\nmodel = torch.nn.Linear(4, 2)\nraise RuntimeError('no data')\n")
    with pytest.raises(ModelError, match="no data") as e:
        run_command(["python", str(path)], Watch(every=10))
    assert not any("no loss was seen" in n for n in e.value.partial.notes), e.value.partial.notes


def test_the_run_learning_rate_is_its_largest_groups_unless_held_at_0():
    """A sweep: a body group held at lr 0 (a warm-up freeze) before the head's group made the run's rate 0 in the
    hparams and the series: the fastest group's then."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.AdamW([{"params": model[0].parameters(), "lr": 0.0},
                             {"params": model[2].parameters(), "lr": 3e-3}])
    with Watch(model, every=10) as w:
        for x, y in _data(30):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    r = w.result()
    assert r.header["optimizers"] == ["AdamW (lr 0.003)"] and r.data["hparams"]["lr"] == pytest.approx(3e-3)
    assert all(v == pytest.approx(3e-3) for v in r.series["lr"])


def test_a_small_group_added_at_a_higher_rate_is_no_rise_of_the_schedule():
    """A review: with the run's rate the fastest group's, an auxiliary head added at 10x the rate read as a warm-up
    rise, and the loss's bump from its new term as a loss-diverged warning."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    aux = nn.Linear(64, 1)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    with Watch(every=10) as w:
        for i, (x, y) in enumerate(_data(90)):
            if i == 30:
                opt.add_param_group({"params": aux.parameters(), "lr": 1e-2})
            h = model[1](model[0](x))
            loss = F.cross_entropy(model[2](h), y) + (aux(h).pow(2).mean() * 5 if i >= 30 else 0)
            opt.zero_grad()
            loss.backward()
            opt.step()
    r = w.result()
    assert all(v == pytest.approx(1e-3) for v in r.series["lr"]) and r.header["optimizers"] == ["Adam (lr 0.001)"]
    assert "loss-diverged" not in {f.code for f in r.findings}


def test_a_group_added_then_one_finding_over_every_step():
    """A review: the track left at add_param_group was judged too (two loss-ignores-parameters for one optimizer)
    and the new one counted only its own steps ("its 50 steps of the run's 80")."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    model[0].requires_grad_(False)
    opt = torch.optim.SGD(model[2].parameters(), 0.1)
    with Watch(every=10) as w:
        for i, (x, _) in enumerate(_data(80)):
            if i == 30:
                model[0].requires_grad_(True)
                opt.add_param_group({"params": model[0].parameters()})
            opt.zero_grad()
            (torch.softmax(model(x), 1) * 3).sum().backward()   # a softmax over one unit: always 1
            opt.step()
    found = [f for f in w.result().findings if f.code == "loss-ignores-parameters"]
    assert len(found) == 1 and "in 80 steps" in found[0].message and "none of the 4" in found[0].message, found


def test_a_group_added_every_step_leaves_no_tracks_behind():
    """A review: each add_param_group left a track for good; a group a step kept 400 of them, 4x the time."""
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    extra = []
    with Watch(model, every=10) as w:
        for x, y in _data(100):
            p = nn.Parameter(torch.zeros(4))
            extra.append(p)
            opt.add_param_group({"params": [p]})
            opt.zero_grad()
            (F.cross_entropy(model(x), y) + sum(q.sum() for q in extra) * 0.0).backward()
            opt.step()
        kept = len(w.engine.tracks)
    assert w.result().data["steps"] == 100 and kept <= 11, kept


@pytest.mark.parametrize("how", ["inplace", "data"])
def test_sam_ascent_before_its_closure_is_not_an_update(how):
    """A review: SAM moves the weights to the ascent point before it calls the closure; read when the closure
    returned, the way back read as part of the update: a false update-ratio-high at rho 0.5. A second review: a
    version check missed an ascent written through .data (no version bump). The samples are taken at the start."""
    class SAM(torch.optim.Optimizer):
        def __init__(self, params, rho):
            super().__init__(params, dict(rho=rho))
            self.base = torch.optim.SGD(self.param_groups, lr=0.05)

        @torch.no_grad()
        def step(self, closure):
            norm = torch.norm(torch.stack([p.grad.norm() for g in self.param_groups for p in g["params"]]))
            moved = []
            for g in self.param_groups:
                for p in g["params"]:
                    e = p.grad * g["rho"] / (norm + 1e-12)
                    (p.data if how == "data" else p).add_(e)
                    moved.append((p, e))
            with torch.enable_grad():
                closure()
            for p, e in moved:
                (p.data if how == "data" else p).sub_(e)
            self.base.step()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = SAM(model.parameters(), rho=0.5)
    with Watch(model, every=10) as w:
        for x, y in _data(40):
            def closure(x=x, y=y):
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
            closure()
            opt.step(closure)
    r = w.result()
    assert "update-ratio-high" not in {f.code for f in r.findings}, [(f.code, f.message) for f in r.findings]


def test_lbfgs_is_read_after_each_step_its_losses_its_own_and_a_nan_at_its_step():
    """A review: read when the closure first returned, an LBFGS step's later evaluations went to the next step's
    loss, and a NaN in a later evaluation was found a step late, "before the optimizer applied it"."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    evaluations: list = []
    state = {"step": 0, "calls": 0}
    model[2].weight.register_hook(lambda g: g * float("nan") if (state["step"], state["calls"]) == (7, 3) else g)
    with Watch(model, every=10, replay=False) as w:
        for i, (x, y) in enumerate(_data(12)):
            state["step"], state["calls"] = i + 1, 0
            evaluations.append([])

            def closure(x=x, y=y):
                state["calls"] += 1
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                evaluations[-1].append(float(loss))
                return loss
            opt.step(closure)
    r = w.result()
    losses = r.series["loss"]
    for k in range(6):   # each step's loss is the mean of its own evaluations
        assert losses[k] == pytest.approx(sum(evaluations[k]) / len(evaluations[k]), rel=1e-5), (k, losses, evaluations)
    bad = [f for f in r.findings if f.code in ("non-finite-gradient", "non-finite-loss")]
    assert bad and "at step 7" in bad[0].message and "before the optimizer applied it" not in bad[0].message, \
        [(f.code, f.message) for f in r.findings]


def test_a_closure_that_raised_leaves_the_next_steps_alone():
    """A review: a step(closure) whose closure raised (caught by the loop) left its mark, and the next plain step was
    read twice: a false double-step, 40 steps counted for 39 taken."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    taken = 0
    with Watch(model, every=10) as w:
        for i, (x, y) in enumerate(_data(40)):
            def closure(x=x, y=y, i=i):
                opt.zero_grad()
                if i == 4:
                    raise RuntimeError("out of memory")
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                return loss
            try:
                if i > 4:
                    opt.zero_grad()
                    F.cross_entropy(model(x), y).backward()
                    opt.step()
                else:
                    opt.step(closure)
                taken += 1
            except RuntimeError:
                pass
    r = w.result()
    assert r.data["steps"] == taken == 39 and not [f for f in r.findings if f.severity != "info"], \
        [(f.code, f.message) for f in r.findings]


def test_a_forward_that_writes_a_weight_keeps_its_closure_steps_read_before_the_update():
    """A review: an Embedding with max_norm renormalises its weight in place in the forward, inside the closure; a
    version check took that for SAM's ascent and every step lost its ratios."""
    torch.manual_seed(0)
    emb, head = nn.Embedding(50, 16, max_norm=1.0), nn.Linear(16, 4)
    model = nn.Sequential(emb, head)
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    g = torch.Generator().manual_seed(0)
    with Watch(model, every=10) as w:
        for _ in range(30):
            ids = torch.randint(0, 50, (32,), generator=g)

            def closure(ids=ids):
                opt.zero_grad()
                loss = F.cross_entropy(model(ids), ids % 4)
                loss.backward()
                return loss
            opt.step(closure)
    r = w.result()
    assert not any("closure" in n for n in r.notes), r.notes
    assert all(row["update_ratio"] is not None and row["update_ratio"] > 0 for row in r.table("layers").rows)


def test_a_nan_found_at_a_later_read_of_a_plain_loop_was_before_its_update():
    """A review: with replay off a NaN gradient of step 7, found at the read of step 10, was said to be "read after
    that step's update"; its norm was taken before the update."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), 0.1)
    at = [0]
    model[2].weight.register_hook(lambda g: g * float("nan") if at[0] == 7 else g)
    with Watch(model, every=10, replay=False) as w:
        for i, (x, y) in enumerate(_data(20)):
            at[0] = i + 1
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    bad = [f for f in w.result().findings if f.code == "non-finite-gradient"]
    assert len(bad) == 1 and "at step 7, before the optimizer applied it" in bad[0].message, bad


def test_an_lbfgs_beside_the_clock_keeps_its_losses():
    """A review: an LBFGS over another model stepping after the clock's Adam left its first step's later
    evaluations in the Adam's next loss."""
    torch.manual_seed(0)
    a, b = nn.Linear(16, 4), nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 4))
    adam, lbfgs = torch.optim.Adam(a.parameters(), 1e-2), torch.optim.LBFGS(b.parameters(), lr=0.5, max_iter=4)
    own = []
    with Watch(every=10) as w:
        for x, y in _data(12):
            adam.zero_grad()
            loss = F.cross_entropy(a(x), y)
            loss.backward()
            adam.step()
            own.append(float(loss))

            def closure(x=x, y=y):
                lbfgs.zero_grad()
                out = F.cross_entropy(b(x), y) * 100   # far from the Adam's: a leak would show
                out.backward()
                return out
            lbfgs.step(closure)
    r = w.result()
    assert r.series["loss"] == pytest.approx(own, rel=1e-5), (r.series["loss"], own)


def test_a_body_warming_up_from_0_is_the_runs_rate():
    """A review: the body's LambdaLR warm-up starts at exactly 0 while a small head keeps 1e-3; the rule "the
    fastest group's while the largest is at 0" made the series start at the head's 1e-3 and max_lr 1e-3."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.Adam([{"params": model[0].parameters(), "lr": 1e-4},
                            {"params": model[2].parameters(), "lr": 1e-3}])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, [lambda s: min(1.0, s / 20), lambda s: 1.0])
    with Watch(model, every=10) as w:
        for x, y in _data(40):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            sched.step()
    r = w.result()
    assert r.series["lr"][0] == 0.0 and r.data["hparams"]["max_lr"] == pytest.approx(1e-4), r.series["lr"][:3]


def test_a_group_added_after_the_last_read_keeps_what_the_reads_saw():
    """A review: a group added after the last read left a track nobody judged and a new one that had read nothing:
    never-gets-grad of an unused layer was lost, and the table's columns were empty."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    unused = nn.Linear(4, 4)
    extra = nn.Parameter(torch.zeros(4))
    opt = torch.optim.Adam(list(model.parameters()) + list(unused.parameters()), 1e-3)
    with Watch(every=10) as w:
        for i, (x, y) in enumerate(_data(95)):
            if i == 92:
                opt.add_param_group({"params": [extra]})
            opt.zero_grad()
            (F.cross_entropy(model(x), y) + extra.sum() * 0).backward()
            opt.step()
    r = w.result()
    never = [n for f in r.findings if f.code == "never-gets-grad" for n in (f.members or [f.where])]
    assert never == ["param_groups[0][4]", "param_groups[0][5]"], [(f.code, f.where) for f in r.findings]
    rows = {row["name"]: row for row in r.table("layers").rows}
    assert rows["0.weight"]["got_grad"] and rows["0.weight"]["max_grad_norm"] > 0.3, rows["0.weight"]


@pytest.mark.parametrize("replay", [False, True])
def test_a_nan_in_an_lbfgs_step_is_said_read_after_its_update(replay):
    """A review: read inside the _begin that read the step, an LBFGS step's NaN was "before the optimizer applied
    it" while its replay note said the weights were already updated (at a read step, or at once on the CPU)."""
    r = _closure_run("lbfgs-plain", nan_at=5, steps=8, every=5, replay=replay)
    bad = [f for f in r.findings if f.code in ("non-finite-loss", "non-finite-gradient")]
    assert bad and "at step 5, read after that step's update" in bad[0].message, [f.message for f in bad]


def test_the_rate_follows_the_schedule_after_load_state_dict():
    """A review: load_state_dict replaces the group dicts; a track holding the old dict stopped following StepLR."""
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 10, 0.5)
    truth = []
    with Watch(model, every=5) as w:
        for i, (x, y) in enumerate(_data(60)):
            if i == 20:
                saved = opt.state_dict()
            if i == 25:
                opt.load_state_dict(saved)   # a rollback
            truth.append(opt.param_groups[0]["lr"])
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            sched.step()
    assert w.result().series["lr"] == pytest.approx(truth)


def test_a_closure_that_raised_after_sams_ascent_leaves_no_stale_samples():
    """A review: the early samples of a step(closure) that raised after SAM's ascent stayed, and the next read's
    ratio started from the ascent point (16x off). Layers of at most 64 elements: the sample is the whole tensor."""
    class SAM(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, dict(rho=0.5, lr=0.05))

        @torch.no_grad()
        def step(self, closure=None):
            moved = []
            if closure is not None:
                norm = torch.norm(torch.stack([p.grad.norm() for g in self.param_groups for p in g["params"]]))
                for g in self.param_groups:
                    for p in g["params"]:
                        e = p.grad * g["rho"] / (norm + 1e-12)
                        p.add_(e)
                        moved.append((p, e))
                with torch.enable_grad():
                    closure()
                for p, e in moved:
                    p.sub_(e)
            for g in self.param_groups:
                for p in g["params"]:
                    p.add_(p.grad, alpha=-g["lr"])

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))
    opt = SAM(model.parameters())
    g = torch.Generator().manual_seed(0)
    truth = {}
    with Watch(model, every=5) as w:
        for i in range(12):
            x = torch.randn(32, 8, generator=g)
            y = x[:, :4].argmax(1)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()

            def closure(x=x, y=y, i=i):
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                if i == 4:
                    raise RuntimeError("out of memory")
            before = model[2].weight.detach().clone()
            try:
                opt.step(closure)
            except RuntimeError:
                before = model[2].weight.detach().clone()   # this step starts from the ascent point left behind
                opt.step()
            truth[i + 1] = float((model[2].weight.detach() - before).norm() / before.norm())
    got = dict(w.engine.ratios["2.weight"])
    assert got[5] == pytest.approx(truth[5], rel=1e-4) and got[10] == pytest.approx(truth[10], rel=1e-4), (got, truth)


def _ascent(objective: str, maximize: bool, steps: int = 150):
    """An MLP on a learnable 4-class task under Adam; `objective` turns the cross-entropy into the loss given to
    backward: "ll" (-ce, a log-likelihood), "score" (2 - ce: 0.6 rising to 2), "ce" (the cross-entropy itself)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), 1e-2, maximize=maximize)
    data = _data(steps + 1)   # the last batch held out
    with Watch(model, every=10, replay=False) as w:
        for x, y in data[:steps]:
            ce = F.cross_entropy(model(x), y)
            loss = {"ll": -ce, "score": 2 - ce, "ce": ce}[objective]
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        return w.result(), float(F.cross_entropy(model(data[-1][0]), data[-1][1]))


@pytest.mark.parametrize("objective", ["ll", "score"])
def test_gradient_ascent_with_maximize_is_judged_on_the_objective_it_raises(objective):
    """A sweep: Adam(maximize=True) on 3 - cross_entropy learned (held-out accuracy 0.956 on digits) and was a
    `loss-diverged` error, exit 1, "lower the learning rate"; on -cross_entropy an info said it "collapsed". The
    rising objective is judged as −loss now. Here the -ce case gives the old info; the score's curve on this task
    does not reach the old error (a guard: nothing above info)."""
    r, held_out = _ascent(objective, maximize=True)
    assert held_out < 0.5   # it learned (ln 4 = 1.39 at chance)
    assert [f.code for f in r.findings if f.severity != "info"] == [], [(f.code, f.message) for f in r.findings]
    assert not any(f.code == "loss-diverged" for f in r.findings), [(f.code, f.message) for f in r.findings]


@pytest.mark.parametrize("objective,maximize,code", [("ce", True, "maximize-on-loss"), ("ll", False, "negated-loss")])
def test_a_run_that_climbs_torchs_own_loss_is_told_why(objective, maximize, code):
    """maximize=True given the cross-entropy itself, or minus the cross-entropy minimised: the loss climbs. It was
    told to lower the learning rate; the graph shows the loss is a cross-entropy, and the optimizer's group says
    which way it steps."""
    r, held_out = _ascent(objective, maximize)
    assert held_out > 2.0   # it un-learned
    found = [f for f in r.findings if f.code == code]
    assert len(found) == 1 and found[0].severity == "warning" and "cross-entropy" in found[0].message, \
        [(f.code, f.message) for f in r.findings]
    assert not any(f.code == "loss-diverged" for f in r.findings)


def test_a_plain_minimised_cross_entropy_has_no_climb_finding():
    r, held_out = _ascent("ce", maximize=False)
    assert held_out < 0.5
    assert not any(f.code in ("maximize-on-loss", "negated-loss") for f in r.findings)


def test_a_non_finite_loss_after_carried_over_gradients_names_them_as_the_cause():
    """A sweep: LBFGS's closure without zero_grad went NaN at step 7, and the hint said to check that batch's data
    and lower the rate; every step had applied the sum of all gradients so far."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with Watch(model, every=5, replay=False) as w:
        for x, y in _data(60):
            loss = F.cross_entropy(model(x) * 50, y)   # no zero_grad: the gradients pile up
            loss.backward()
            opt.step()
    found = {f.code: f for f in w.result().findings}
    assert "grad-carried-over" in found, sorted(found)
    bad = found.get("non-finite-loss") or found.get("non-finite-gradient")
    assert bad is not None and bad.hint.startswith("the gradients carried over"), sorted(found)


def test_the_losss_sign_is_read_past_constants_written_in_code_not_past_the_datas():
    """graph.loss_faults's ("minimised", loss, sign): negation, `3 - ce`, Python numbers as factors are followed; a
    tensor factor is not (REINFORCE's cross-entropy times an advantage whose sign is the episode's)."""
    from torchdiag.diagnostics.watch.graph import loss_faults

    x = torch.randn(4, 3, requires_grad=True)
    ce = F.cross_entropy(x, torch.tensor([0, 1, 2, 0]))

    def sign(loss):
        return [f[2] for f in loss_faults(loss.grad_fn) if f[0] == "minimised"]

    assert sign(ce) == [1] and sign(-ce) == [-1] and sign(3 - ce) == [-1] and sign(ce * -0.5) == [-1]
    negated = -ce
    assert sign(ce / 4 + 1) == [1] and sign(-negated) == [1]
    assert sign(ce * torch.tensor(-0.7)) == [] and sign(ce + x.sum()) == []


def test_an_attacks_perturbation_climbing_the_loss_is_not_told_to_drop_maximize():
    """A review: Adam(maximize=True) over an input perturbation, the model frozen (an adversarial attack), was told
    "drop maximize=True": climbing the loss is its purpose. Only an optimizer over a model's weights is asked."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).requires_grad_(False)
    x, y = _data(1)[0]
    delta = torch.zeros_like(x, requires_grad=True)
    opt = torch.optim.Adam([delta], 1e-2, maximize=True)
    with Watch(every=10, replay=False) as w:   # every optimizer, as `torchdiag watch -- python attack.py`
        for _ in range(100):
            loss = F.cross_entropy(model(x + delta), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert not any(f.code in ("maximize-on-loss", "negated-loss") for f in w.result().findings)
