"""Models built to fail (or not) in reduced precision, each with its numbers known in closed form.
Inputs: each model's `example_input_array` (ones, or a seeded draw), so the numbers hold without -i.

    torchdiag nancheck sample_models/precision.py:overflow --dtype float16    # big: 81,920 > 65,504
    torchdiag nancheck sample_models/precision.py:overflow --amp fp16         # the same under autocast
    torchdiag nancheck sample_models/precision.py:headroom --dtype float16    # big: 10,240, within 8x of 65,504
    torchdiag nancheck sample_models/precision.py:underflow --dtype float16   # fc's gradients all flush to 0
    torchdiag nancheck sample_models/precision.py:grad_overflow --dtype float16 --loss sum   # backward: 1e6
    torchdiag nancheck sample_models/precision.py:fine --dtype bfloat16       # fine in all three precisions
    torchdiag nancheck sample_models/precision.py:attention --dtype float16   # scores 460,800 inside attn
"""
import torch
from torch import nn


class Scale(nn.Module):
    """Multiplies by a constant (a temperature, a residual scale, a loss weight ...)."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


class Constant(nn.Module):
    """`big`, a bias-free Linear whose weights all equal `weight`: on an input of
    ones, every output of `big` is exactly in_features × weight (a power of two times 5: exact in every
    dtype); `head` follows."""

    def __init__(self, weight: float, in_features: int = 5):
        super().__init__()
        self.big = nn.Linear(in_features, 3, bias=False)
        self.head = nn.Linear(3, 2)
        with torch.no_grad():
            self.big.weight.fill_(weight)
        self.example_input_array = torch.ones(2, in_features)

    def forward(self, x):
        return self.head(self.big(x))


def overflow() -> nn.Module:
    """big's output is 5 × 2**14 = 81,920 in float32: above float16's largest finite 65,504, so it is Inf
    in float16 (6 values: 2 rows × 3 outputs); bfloat16 holds it exactly."""
    torch.manual_seed(0)
    return Constant(2.0**14)


def headroom() -> nn.Module:
    """big's output is 5 × 2**11 = 10,240: finite in float16 but within 8× of 65,504 (65,504 / 10,240 = 6.397)."""
    torch.manual_seed(0)
    return Constant(2.0**11)


class Underflow(nn.Module):
    """fc then shrink (× 1e-8). With the auto loss (cross-entropy, mean over 2 rows) the gradient reaching
    fc's output is 1e-8 × (softmax − onehot) / 2, at most 5e-9 in size: below half of float16's smallest
    subnormal (2**-25 ≈ 2.98e-8), so it rounds to 0 and every gradient of fc (4×3 weight + 3 bias = 15
    values) is exactly 0 in float16 — and nonzero in float32 and bfloat16. Loss scaling (a GradScaler's
    65,536) lifts it to ~3e-4, well inside float16."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.shrink = Scale(1e-8)
        self.example_input_array = torch.rand(2, 4) + 0.5   # no zero inputs: every float32 gradient is nonzero

    def forward(self, x):
        return self.shrink(self.fc(x))


def underflow() -> nn.Module:
    torch.manual_seed(0)
    return Underflow()


class GradOverflow(nn.Module):
    """fc, then shrink (× 1e-6) and amplify (× 1e6): the forward stays near fc's output (about 1, finite in
    float16), but in backward amplify multiplies the gradient by 1e6. With `--loss sum` (gradient 1 at
    every output) the gradient leaving amplify is exactly 1e6 in float32, above float16's 65,504: Inf in
    float16, from a finite forward; fc's gradients follow."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.shrink = Scale(1e-6)
        self.amplify = Scale(1e6)
        self.example_input_array = torch.rand(2, 4) + 0.5

    def forward(self, x):
        return self.amplify(self.shrink(self.fc(x)))


def grad_overflow() -> nn.Module:
    torch.manual_seed(0)
    return GradOverflow()


class Fine(nn.Module):
    """A small tanh MLP with default init: nothing near float16's limits, no exact-zero gradients."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
        self.example_input_array = torch.randn(4, 8)

    def forward(self, x):
        return self.net(x)


def fine() -> nn.Module:
    torch.manual_seed(0)
    return Fine()


class Attention(nn.Module):
    """Softmax attention over the batch whose scores overflow float16 while its output cannot: `q` is a
    bias-free Linear(8, 8) with every weight 30, so on ones each q element is 8 x 30 = 240 and each score
    q_i . q_j = 8 x 240**2 = 460,800 (> 65,504; exact in float32). In float16 the scores are Inf and
    softmax(Inf - Inf) is NaN; the module's output (softmax rows summed) is exactly 1 in float32."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(8, 8, bias=False)
        nn.init.constant_(self.q.weight, 30.0)

    def forward(self, x):
        q = self.q(x)
        return torch.softmax(q @ q.transpose(-1, -2), dim=-1).sum(-1, keepdim=True)


class AttentionModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention()
        self.head = nn.Linear(1, 3)
        self.example_input_array = torch.ones(4, 8)

    def forward(self, x):
        return self.head(self.attn(x))


def attention() -> nn.Module:
    torch.manual_seed(0)
    return AttentionModel()
