"""A forward that draws random numbers (a VAE's reparameterisation, injected noise, a random mask) makes the loss a
draw: fresh noise at every step leaves a floor above 0 that no training on one batch goes under (a VAE's ELBO levels
at a quarter of its start). When a run fails with no mechanical cause, its forward drew, and its loss fell through
the noise all the same (`learned`), a fresh copy is trained with the same draws at every step (the RNG set back to
where step 0's forward began): memorised, the model, loss and optimizer train and what stopped the run is the noise
(warning `sampled-loss`). A draw where the data or a weight belongs learns little of the data with fresh draws and is
not asked (the error's hint says why): with the draws held fixed it would memorise the noise. Cost: one more run,
only for such failures. torch's generators (the CPU's, the run's CUDA device's), numpy's global one and Python's
`random` are set back; a torch.Generator of the model's own, and other CUDA devices', draw afresh."""
from __future__ import annotations

CODE = "sampled-loss"
FELL = 0.5   # the loss with fresh draws at most this × its start: the model learned the data through the noise


def learned(losses: list, loss) -> bool:
    """Did the run with fresh draws learn the data through its noise? Its last loss at most FELL × its first, and,
    for a cross-entropy over class indices, below the label entropy (the best one answer for every sample reaches).
    A draw that stands where the data belongs learns nothing of it: a review's forward that replaced its input by
    `torch.randn_like(x)` (meant x + noise) ended at 0.89 × its start, one that permuted the batch at 0.81 × (a random
    weight in forward, doctor's local-weight, at 0.68 ×), and with the draws held fixed each memorised the noise; a
    VAE's ELBO fell to 0.25 ×. Judged before the held run, which is then not made."""
    import math

    if len(losses) < 2 or not (losses[0] > 0 and math.isfinite(losses[-1])) or losses[-1] > FELL * losses[0]:
        return False
    target = getattr(loss, "target", None)
    if getattr(loss, "chosen", "") == "cross_entropy" and target is not None and not target.is_floating_point() \
            and target.dim() == 1:
        from .causes import entropy_floor

        return losses[-1] < entropy_floor(target.cpu())
    return True


class Draws:
    """The RNG states where a forward began: torch's (the CPU's, and the device's on CUDA), numpy's global one (where
    numpy is loaded: Hugging Face's SpecAugment masks draw there) and Python's `random`; `drew()` after it: did it
    advance any; `again()`: set them back, so the next forward draws the same numbers."""

    def __init__(self, device):
        import torch

        self.cuda = device.type == "cuda" and torch.cuda.is_initialized()
        self.index = device.index if device.index is not None else (torch.cuda.current_device() if self.cuda else None)
        self.states = self._states()

    def _states(self) -> tuple:
        import random
        import sys

        import torch

        np = sys.modules.get("numpy")
        return (torch.get_rng_state(), torch.cuda.get_rng_state(self.index) if self.cuda else None,
                np.random.get_state() if np is not None else None, random.getstate())

    def drew(self) -> bool:
        (cpu, dev, np_state, py), now = self.states, self._states()
        return (_moved(cpu, now[0]) or (dev is not None and _moved(dev, now[1]))
                or (np_state is not None and _np_moved(np_state, now[2])) or py != now[3])

    def again(self) -> None:
        import random
        import sys

        import torch

        cpu, dev, np_state, py = self.states
        torch.set_rng_state(cpu)
        if dev is not None:
            torch.cuda.set_rng_state(dev, self.index)
        if np_state is not None:
            sys.modules["numpy"].random.set_state(np_state)
        random.setstate(py)


def _moved(a, b) -> bool:
    """Two RNG states (host byte tensors, also the CUDA generator's) differ: compared on the host, no op of torch's."""
    try:
        return a.numpy().tobytes() != b.numpy().tobytes()
    except (RuntimeError, TypeError):   # a torch without numpy
        import torch

        return not torch.equal(a, b)


def _np_moved(a, b) -> bool:
    """numpy's legacy state tuples ('MT19937', keys, pos, has_gauss, cached): any part changed."""
    return a[0] != b[0] or a[2:] != b[2:] or not (a[1] == b[1]).all()
