"""Architecture rules that tell a healthy design from a fault, shared by every check that trains or
judges a model (gradflow's judged pass, doctor's training checks):

- stochastic depth (torchvision StochasticDepth, timm/HF *DropPath) drops a whole residual branch
  for a whole small batch at random: it is switched off (eval) for a judged pass, so the verdict
  does not depend on the draw;
- dropout is regularisation: a run that asks whether the model can memorise one batch switches it
  off (eval), as the usual recipe does ("overfit a tiny batch with regularisation off"); noise on the
  output puts a floor under a regression loss that no training removes;
- a normalisation using batch statistics (BatchNorm in training, GroupNorm, InstanceNorm) makes the
  loss invariant to the scale of the tensor it receives."""
from __future__ import annotations

TINY_RMS = 1e-4   # per-element RMS below this: tiny by construction (layer scale 1e-6, cls/register tokens)


def is_stochastic_depth(mod) -> bool:
    kind = type(mod).__name__
    return kind == "StochasticDepth" or kind.endswith("DropPath") or kind.endswith("StochasticDepth")


def stochastic_depth_off(model) -> list[str]:
    """Put every stochastic-depth module in eval mode (the caller restores modes: leave_no_trace, or a
    copy); returns their paths."""
    names = []
    for n, m in model.named_modules():
        if is_stochastic_depth(m):
            m.eval()
            names.append(n)
    return names


def dropout_off(model) -> list[str]:
    """Put every dropout module (torch's Dropout family, by type) and every stochastic-depth module in
    eval mode, and a recurrent layer's dropout between its layers to 0 (on a copy the caller owns); returns
    their paths. Dropout a model draws through torch.nn.functional inside another module is
    core/functional_dropout.py's."""
    from torch import nn
    from torch.nn.modules.dropout import _DropoutNd

    names = []
    for n, m in model.named_modules():
        if (isinstance(m, _DropoutNd) and m.p > 0) or is_stochastic_depth(m):
            m.eval()
            names.append(n)
        elif isinstance(m, nn.RNNBase) and m.dropout > 0:
            m.dropout = 0.0
            names.append(n)
    return names


def is_batch_norm_like(mod) -> bool:
    """A normalisation that makes the loss invariant to the scale of (and any per-channel constant
    added to) the tensor it receives: BatchNorm using batch statistics, GroupNorm, InstanceNorm."""
    from torch import nn
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.instancenorm import _InstanceNorm

    if isinstance(mod, _BatchNorm):
        return mod.training or mod.running_mean is None
    if isinstance(mod, _InstanceNorm):
        return mod.training or not mod.track_running_stats
    return isinstance(mod, nn.GroupNorm)
