"""Healthy models built the way real architectures are (issue 14), from plain torch modules. Each
factory mimics one pattern that looks broken at initialisation and is not; gradflow and doctor must
say "by design" (info), never fail:

- zero_head:      a zero-initialised classifier head (torchvision vit_b_16, timm mixer): every
                  upstream gradient is exactly zero at init, non-zero after one step.
- zero_residual:  the last BatchNorm scale of each residual branch is zero (timm resnet50's
                  zero_init_last, torchvision's zero_init_residual=True).
- layer_scale:    ConvNeXt-style blocks whose output is multiplied by a layer scale of 1e-6, and a
                  cls token of std 1e-6 (timm ViT): tiny by construction.
- drop_path:      residual blocks with stochastic depth (timm DropPath, torchvision StochasticDepth)
                  at p = 0.5: at a batch of 2 a whole branch is often dropped for the whole batch.
- bias_before_bn: Linear/Conv biases followed by a train-mode BatchNorm, which cancels them.
- deep_bn:        a deep plain conv/BatchNorm stack whose first convolution gets a large gradient
                  at init (scale-invariant: it feeds a BatchNorm)."""
import torch
from torch import nn


class ZeroHead(nn.Module):
    def __init__(self, dim=16, classes=5):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, dim), nn.GELU(), nn.Linear(dim, dim), nn.GELU())
        self.head = nn.Linear(dim, classes)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x):
        return self.head(self.body(x))


class ZeroInitResidual(nn.Module):
    def __init__(self, width=8, blocks=2, classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.ModuleList()
        for _ in range(blocks):
            bn = nn.BatchNorm2d(width)
            nn.init.zeros_(bn.weight)
            self.blocks.append(nn.Sequential(nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                                             nn.ReLU(), nn.Conv2d(width, width, 3, padding=1, bias=False), bn))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = torch.relu(x + b(x))
        return self.head(x.mean((2, 3)))


class ScaledBlock(nn.Module):
    """ConvNeXt's block: depthwise conv, LayerNorm, MLP, times a per-channel layer scale of 1e-6."""

    def __init__(self, dim):
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, 3, padding=1, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x):                                  # x: (batch, tokens, dim)
        y = self.dwconv(x.transpose(1, 2)).transpose(1, 2)
        return x + self.gamma * self.mlp(self.norm(y))


class LayerScaleNet(nn.Module):
    def __init__(self, dim=16, blocks=3, classes=5):
        super().__init__()
        self.embed = nn.Linear(8, dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 1e-6)
        self.blocks = nn.Sequential(*[ScaledBlock(dim) for _ in range(blocks)])
        self.head = nn.Linear(dim, classes)

    def forward(self, x):                                  # x: (batch, tokens, 8)
        t = self.embed(x)
        t = torch.cat([self.cls_token.expand(t.shape[0], -1, -1), t], 1)
        return self.head(self.blocks(t).mean(1))


class DropPath(nn.Module):
    """timm's DropPath: zero a whole residual branch per sample with probability p in training."""

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        keep = torch.rand((x.shape[0],) + (1,) * (x.dim() - 1), device=x.device) >= self.p
        return x * keep / (1 - self.p)


class DropPathNet(nn.Module):
    def __init__(self, dim=16, blocks=6, p=0.5, classes=5):
        super().__init__()
        self.embed = nn.Linear(8, dim)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(dim, dim), nn.GELU()) for _ in range(blocks))
        self.drops = nn.ModuleList(DropPath(p) for _ in range(blocks))
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.embed(x)
        for block, drop in zip(self.blocks, self.drops):
            x = x + drop(block(x))
        return self.head(x)


class BiasBeforeBN(nn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)          # bias=True, then BatchNorm: cancelled
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 16)                          # bias=True, then BatchNorm1d: cancelled
        self.bn1 = nn.BatchNorm1d(16)
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x))).mean((2, 3))
        return self.head(torch.relu(self.bn1(self.fc(x))))


class DeepBN(nn.Module):
    """A plain deep conv/BatchNorm/ReLU stack with a small-norm first convolution (like ResNet's stem)."""

    def __init__(self, depth=12, width=16, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        with torch.no_grad():
            self.conv1.weight.mul_(0.05)                    # the loss ignores its scale: BatchNorm follows
        layers = []
        for _ in range(depth):
            layers += [nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        return self.head(self.body(x).mean((2, 3)))


def zero_head():
    torch.manual_seed(0)
    return ZeroHead()


def zero_residual():
    torch.manual_seed(0)
    return ZeroInitResidual()


def layer_scale():
    torch.manual_seed(0)
    return LayerScaleNet()


def drop_path():
    torch.manual_seed(0)
    return DropPathNet()


def bias_before_bn():
    torch.manual_seed(0)
    return BiasBeforeBN()


def deep_bn():
    torch.manual_seed(0)
    return DeepBN()
