"""Models built to fail (or not) in the training step under reduced precision (issue 17, part B).

- `rounds_away`: run in bfloat16 (--dtype bfloat16), its updates round away. `big.weight` has 3 of 4
  rows at exactly 1.0 and one row at 2**-10; `small.weight` is all 2**-10. With ones as inputs and the
  `sum` loss every weight gradient is the batch size (8). One Adam step (lr 1e-3) moves each weight by
  ~1e-3, one SGD step (lr 1e-5) by 8e-5: both below half a bf16 ulp of 1.0 (2**-9 below it), both far
  above half an ulp of 2**-10 (2**-18). So exactly 75% of big.weight and 0% of small.weight stay put.
- `skips_every_step`: under --amp fp16 the gradient entering `scale` (an fp16 tensor that the module
  casts to float32 and multiplies by 1e12) overflows fp16 for any loss scale above ~2**-24, so the
  GradScaler (starting at 2**16, halving on each skipped step) skips the first ~40 updates, and doctor's
  back-off (down to 2**-8) never finds a scale that fits.
- `skips_then_recovers`: the same with a factor of 1e3: about the first 10 updates are skipped (the
  scale falls to ~64), then training proceeds.
- `adam_nan_fp16`: in float16 (--dtype float16) one Adam step makes weights NaN/Inf. `fc.weight` is
  [[1, 1]]; input column 0 is 1, column 1 is 0, so with the `sum` loss the gradient is [8, 0]. Adam's
  second moment (1 - 0.999) * g**2 is 0.064 for g = 8 (fine) and 0 for g = 0; its eps 1e-8 is below
  half of float16's smallest subnormal (2**-25 ~ 2.98e-8), so it is 0 in float16: the update of the
  second weight is 0 / (0 + 0) = NaN, while the first moves to 1 - 1e-3 ~ 0.999 (float16 0.99902).
  In float32 (eps kept) the second weight's update is 0 / 1e-8 = 0: nothing is wrong there."""
import torch
from torch import nn

IN, OUT, BATCH = 8, 4, 8


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.big = nn.Linear(IN, OUT, bias=False)
        self.small = nn.Linear(IN, OUT, bias=False)
        with torch.no_grad():
            self.big.weight.fill_(1.0)
            self.big.weight[OUT - 1].fill_(2.0 ** -10)
            self.small.weight.fill_(2.0 ** -10)

    def forward(self, x):
        return torch.cat([self.big(x), self.small(x)], dim=1)


def rounds_away(dtype: str = "float32") -> nn.Module:
    """`dtype`: the weights as the factory builds them (a model that comes in bfloat16, not cast by --dtype)."""
    return TwoHeads().to(getattr(torch, dtype))


class Scale(nn.Module):
    """Casts its (fp16 under autocast) input to float32 and multiplies it: the gradient flowing back is
    multiplied by `factor` and cast to fp16 at this module's input."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x.float() * self.factor


class Classifier(nn.Module):
    def __init__(self, factor: float):
        super().__init__()
        self.fc = nn.Linear(IN, OUT)
        self.scale = Scale(factor)

    def forward(self, x):
        return self.scale(self.fc(x))


def skips_every_step() -> nn.Module:
    torch.manual_seed(0)
    return Classifier(1e12)


def skips_then_recovers() -> nn.Module:
    torch.manual_seed(0)
    return Classifier(1e3)


def example_inputs():
    return (torch.ones(BATCH, IN),)


class Router(nn.Module):
    """Keeps its matmul in float32 on purpose, as mixture-of-experts routers do: autocast is switched off
    here, so under --amp this module's mm runs in float32 while the Linear layers run in the amp dtype."""

    def __init__(self, dim: int, experts: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim, experts) / dim ** 0.5)

    def forward(self, x):
        with torch.autocast(x.device.type, enabled=False):
            return x.float() @ self.weight


class Routed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(IN, 16)
        self.router = Router(16, OUT)

    def forward(self, x):
        return self.router(torch.relu(self.fc(x)))


def falls_back() -> nn.Module:
    """Under --amp: `fc` runs in the amp dtype, `router` in float32 (profile/memory name it)."""
    torch.manual_seed(0)
    return Routed()


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            self.fc.weight.fill_(1.0)

    def forward(self, x):
        return self.fc(x)


def adam_nan_fp16() -> nn.Module:
    """Feed it `adam_nan_input()`: column 0 ones, column 1 zeros (gradient [8, 0] under the sum loss)."""
    return Gate()


def adam_nan_input():
    return torch.cat([torch.ones(BATCH, 1), torch.zeros(BATCH, 1)], dim=1)
