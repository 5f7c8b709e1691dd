"""A forward that draws random numbers (a VAE's reparameterisation, injected noise, a random mask) makes the loss a
draw: fresh noise at every step leaves a floor above 0 that no training on one batch goes under (a VAE's ELBO levels
at a quarter of its start). When a run fails with no mechanical cause and its forward drew, a fresh copy is trained
with the same draws at every step (the RNG set back to where step 0's forward began): memorised, the model, loss and
optimizer train and what stopped the run is the noise (warning `sampled-loss`: a draw where a weight belongs,
`torch.randn` in forward, is a bug doctor calls local-weight, and looks the same here). Cost: one more run, only for
such failures."""
from __future__ import annotations

CODE = "sampled-loss"


class Draws:
    """The RNG states (the CPU's, and the device's on CUDA) where a forward began; `drew()` after it: did it advance
    them; `again()`: set them back, so the next forward draws the same numbers."""

    def __init__(self, device):
        import torch

        self.cuda = device.type == "cuda" and torch.cuda.is_initialized()
        self.index = device.index if device.index is not None else (torch.cuda.current_device() if self.cuda else None)
        self.states = self._states()

    def _states(self) -> tuple:
        import torch

        return (torch.get_rng_state(), torch.cuda.get_rng_state(self.index) if self.cuda else None)

    def drew(self) -> bool:
        import torch

        now = self._states()
        return any(a is not None and not torch.equal(a, b) for a, b in zip(self.states, now))

    def again(self) -> None:
        import torch

        torch.set_rng_state(self.states[0])
        if self.cuda:
            torch.cuda.set_rng_state(self.states[1], self.index)
