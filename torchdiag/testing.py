"""Assertions for your own test suite, failing with torchdiag's finding text.

    from torchdiag.testing import assert_finite, assert_gradients_flow, assert_can_overfit

    def test_model_is_healthy():
        model = build()
        x = torch.randn(8, 3, 32, 32)
        assert_finite(model, x)
        assert_gradients_flow(model, x, allow=["aux_head.*"])
        assert_can_overfit(model, x, steps=200)
        assert_params_under(model, 30_000)
        assert_macs_under(model, x, 5e9)
"""
from __future__ import annotations

from . import api


def _fail_on_errors(result, what: str, allow=()):
    errors = [f for f in result.findings if f.severity == "error" and not f.accepted_by(allow)]
    if errors:
        lines = [f"{what}: {len(errors)} problem(s)"] + [f"  {f.code} {f.where}: {f.message}" for f in errors]
        raise AssertionError("\n".join(lines))
    return result


def assert_finite(model, inputs=None, *, loss="auto", target=None, **options):
    """Inputs, parameters, every module's output, the loss and all gradients are finite."""
    return _fail_on_errors(api.nancheck(model, inputs, loss=loss, target=target, **options), "non-finite values")


def assert_gradients_flow(model, inputs=None, *, allow=(), loss="auto", target=None, **options):
    """Every trainable parameter gets a finite, non-zero, non-exploding gradient (globs in allow accepted)."""
    allow = [allow] if isinstance(allow, str) else list(allow)  # one glob, not its characters
    r = api.gradflow(model, inputs, loss=loss, target=target, allow=allow, **options)
    return _fail_on_errors(r, "gradient flow")


def assert_can_overfit(model, inputs=None, *, loss="auto", target=None, **options):
    """A copy of the model memorises one batch (the user's model is not trained), or, for a model with fewer
    trainable values than the batch's targets, two of its samples (capacity-limited: the command's exit 0), or, for a
    forward that draws random numbers (a VAE), the batch with the same draws at every step (sampled-loss)."""
    r = api.overfit_batch(model, inputs, loss=loss, target=target, **options)
    if not r.data.get("passed") and not any(f.code in ("capacity-limited", "sampled-loss") for f in r.findings):
        d = r.data
        what = ("did not overfit one batch yet (the loss was still falling)" if any(f.code == "not-overfit-yet" for f in r.findings)
                else "cannot overfit one batch")
        msg = f"{what}: loss {d.get('initial_loss')} → {d.get('final_loss')} in {d.get('steps')} steps"
        causes = [f"  {f.code} {f.where}: {f.message}" for f in r.findings if f.severity in ("error", "warning")]
        raise AssertionError("\n".join([msg, *causes]))
    return r


def assert_params_under(model, limit: float, *, trainable_only: bool = False):
    params = {id(p): p for p in model.parameters()}.values()
    n = sum(p.numel() for p in params if p.requires_grad or not trainable_only)
    if n > limit:
        raise AssertionError(f"{n:,} parameters > limit {int(limit):,}")
    return n


def assert_macs_under(model, inputs=None, limit: float | None = None):
    """Forward multiply-adds (1 MAC = 2 FLOPs) at these inputs ≤ limit."""
    if limit is None:
        raise TypeError("assert_macs_under(model, inputs, limit): give the limit in MACs, e.g. 5e9")
    r = api.flops(model, inputs)
    macs = r.data["forward_macs"]
    if macs > limit:
        raise AssertionError(f"{macs:,} forward MACs > limit {int(limit):,}")
    return macs
