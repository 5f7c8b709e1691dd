"""Clipping after the step (a sweep's planted bug, missed): `optimizer.step(); clip_grad_norm_(...)` clips gradients
the step has already applied, and the next backward replaces them: the run trains unclipped and nothing said so.
watch tells it by the tensors themselves (the very gradients the step took, unwritten since): clip-after-step, a
warning. Clipping in its place, a measuring call after the step, and a clip of gradients a later backward wrote are
not it."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdiag

STEPS = 12


def _run(where: str, fn: str = "norm", set_to_none: bool = True, keep: bool = False):
    """A small classifier trained for STEPS steps with its clipping `where` ("before" or "after" the step);
    fn "norm" (clip_grad_norm_), "value" (clip_grad_value_) or "measure" (get_total_norm, clips nothing). The
    result, or with `keep` the watch itself."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)

    def clip():
        params = list(model.parameters())
        if fn == "norm":
            nn.utils.clip_grad_norm_(params, 0.5)
        elif fn == "value":
            nn.utils.clip_grad_value_(params, 0.01)
        elif fn == "inf":   # the idiom for measuring the norm before get_total_norm existed
            nn.utils.clip_grad_norm_(params, float("inf"))
        else:
            nn.utils.get_total_norm([p.grad for p in params])

    with torchdiag.watch(model, opt, every=4) as w:
        for _ in range(STEPS):
            x = torch.randn(16, 8, generator=g)
            opt.zero_grad(set_to_none=set_to_none)
            F.cross_entropy(model(x), (x[:, :3].sum(1) > 0).long()).backward()
            if where == "before":
                clip()
            opt.step()
            if where == "after":
                clip()
    return w if keep else w.result()


def _late(result):
    return [f for f in result.findings if f.code == "clip-after-step"]


@pytest.mark.parametrize("fn", ["norm", "value"])
@pytest.mark.parametrize("set_to_none", [True, False], ids=["to-none", "zeroed"])
def test_a_clip_after_the_step_is_said_with_its_step(fn, set_to_none):
    found = _late(_run("after", fn, set_to_none))
    assert len(found) == 1 and found[0].severity == "warning", found
    f = found[0]
    assert ("clip_grad_norm_" if fn == "norm" else "clip_grad_value_") in f.message
    # the first step the engine looks after is the second (step 1 comes before any clip was seen)
    assert f"{STEPS - 1} time(s), the first after step 2" in f.message
    assert "between loss.backward() and optimizer.step()" in f.hint


@pytest.mark.parametrize("fn", ["norm", "value"])
@pytest.mark.parametrize("set_to_none", [True, False], ids=["to-none", "zeroed"])
def test_a_clip_in_its_place_is_not(fn, set_to_none):
    """zero_grad(set_to_none=False) keeps the same tensors step after step (zeroing writes them); set_to_none makes
    new ones whose ids Python may hand out again: neither reads as the step's own."""
    r = _run("before", fn, set_to_none)
    assert not _late(r), [f.message for f in _late(r)]


@pytest.mark.parametrize("fn", ["measure", "inf"])
def test_measuring_after_the_step_clips_nothing_and_is_not(fn):
    """get_total_norm, or clip_grad_norm_ with max_norm inf (a review: a norm logged after the step was "a clipping
    that never acts")."""
    assert not _late(_run("after", fn))


def test_one_clip_over_a_gan_whose_critic_gradients_are_stale_acts_and_is_not():
    """A review: the generator's phase clips the whole GAN (the critic frozen, its gradients those the critic's step
    took): the clip changes the generator's new gradients, before its step, and was said never to act."""
    torch.manual_seed(0)
    G, D = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8)), nn.Sequential(nn.Linear(8, 16), nn.ReLU(),
                                                                                      nn.Linear(16, 1))
    gan = nn.ModuleDict({"G": G, "D": D})
    o_g, o_d = torch.optim.Adam(G.parameters(), 1e-3), torch.optim.Adam(D.parameters(), 1e-3)
    g = torch.Generator().manual_seed(1)
    with torchdiag.watch(gan, [o_d, o_g], every=4) as w:
        for _ in range(20):
            real, z = torch.randn(16, 8, generator=g) + 2, torch.randn(16, 4, generator=g)
            D.requires_grad_(True)
            o_d.zero_grad()
            (F.binary_cross_entropy_with_logits(D(real), torch.ones(16, 1))
             + F.binary_cross_entropy_with_logits(D(G(z).detach()), torch.zeros(16, 1))).backward()
            nn.utils.clip_grad_norm_(gan.parameters(), 0.1)
            o_d.step()
            D.requires_grad_(False)
            o_g.zero_grad()
            F.binary_cross_entropy_with_logits(D(G(z)), torch.ones(16, 1)).backward()
            nn.utils.clip_grad_norm_(gan.parameters(), 0.1)
            o_g.step()
    assert not _late(w.result())


def test_the_late_clip_is_not_the_loops_clipping():
    """The spike hint says "the loop clips gradients already" where it clips: a clip that never acts is none."""
    late, placed = _run("after", keep=True), _run("before", keep=True)
    assert late.engine.clips.late and not late.engine.clips.seen
    assert placed.engine.clips.seen and not placed.engine.clips.late

