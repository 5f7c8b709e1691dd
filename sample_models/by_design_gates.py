"""Healthy models whose branches start closed by a learned gate (issue 26), from plain torch modules.
Each reproduces a timm architecture that today's structural rules misjudged; none is broken:

- cait_like:      patch-token blocks scaled by their own layer scale (1e-5), read only through
                  class-attention blocks whose branches carry their own 1e-5 layer scales downstream:
                  two gates multiply on every patch-block gradient (timm cait_xxs24_224).
- xca_like:       a cross-covariance attention branch with a learnable temperature and a 1e-6 layer
                  scale (timm edgenext_xx_small's XCA).
- nf_like:        a convolution whose gain is initialised to zero (NFNet's zero-init residual) in front of
                  a squeeze-excitation block: its ReLU units are all 0 at init (timm nfnet_l0 attn_last).
- poolformer_like: token mixing by pooling, each branch under a 1e-5 layer scale; the second norm's
                  weight sits under it (timm poolformer)."""
import torch
from torch import nn
from torch.nn import functional as F


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class TalkingAttn(nn.Module):
    """CaiT's attention: heads mixed before and after the softmax (proj_l, proj_w)."""

    def __init__(self, dim, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj_l, self.proj_w = nn.Linear(heads, heads), nn.Linear(heads, heads)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
        a = self.proj_l(a.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).softmax(-1)
        a = self.proj_w(a.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.proj((a @ v).transpose(1, 2).reshape(b, n, c))


class LayerScaleBlock(nn.Module):
    def __init__(self, dim, init=1e-5):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), TalkingAttn(dim)
        self.norm2, self.mlp = nn.LayerNorm(dim), Mlp(dim, 2 * dim)
        self.gamma_1 = nn.Parameter(torch.full((dim,), init))
        self.gamma_2 = nn.Parameter(torch.full((dim,), init))

    def forward(self, x):
        x = x + self.gamma_1 * self.attn(self.norm1(x))
        return x + self.gamma_2 * self.mlp(self.norm2(x))


class ClassAttnBlock(nn.Module):
    """The class token attends to [cls, patches]; only the class token goes on."""

    def __init__(self, dim, init=1e-5):
        super().__init__()
        self.norm1, self.q, self.kv = nn.LayerNorm(dim), nn.Linear(dim, dim), nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2, self.mlp = nn.LayerNorm(dim), Mlp(dim, 2 * dim)
        self.gamma_1 = nn.Parameter(torch.full((dim,), init))
        self.gamma_2 = nn.Parameter(torch.full((dim,), init))

    def forward(self, x):                     # x: (b, 1 + n, c), the class token first
        u = self.norm1(x)
        q = self.q(u[:, :1])
        k, v = self.kv(u).chunk(2, -1)
        a = ((q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5).softmax(-1)
        cls = x[:, :1] + self.gamma_1 * self.proj(a @ v)
        cls = cls + self.gamma_2 * self.mlp(self.norm2(cls))
        return torch.cat([cls, x[:, 1:]], 1)


class CaitLike(nn.Module):
    def __init__(self, dim=32, depth=3, classes=10, init=1e-5):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 4, 4)
        self.pos = nn.Parameter(torch.randn(1, 16, dim) * 0.02)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.5)   # not tiny: grad/weight is not the question here
        self.blocks = nn.ModuleList(LayerScaleBlock(dim, init) for _ in range(depth))
        self.blocks_token_only = nn.ModuleList(ClassAttnBlock(dim, init) for _ in range(2))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        for b in self.blocks:
            x = b(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1)
        for b in self.blocks_token_only:
            x = b(x)
        return self.head(self.norm(x[:, 0]))


class XCA(nn.Module):
    """Cross-covariance attention: channels attend to channels, L2-normalised, a learnable temperature."""

    def __init__(self, dim, heads=4):
        super().__init__()
        self.heads = heads
        self.temperature = nn.Parameter(torch.ones(heads, 1, 1))
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 4, 1)
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        a = ((q @ k.transpose(-2, -1)) * self.temperature).softmax(-1)
        return self.proj((a @ v).permute(0, 3, 1, 2).reshape(b, n, c))


class XcaBlock(nn.Module):
    def __init__(self, dim, init=1e-6):
        super().__init__()
        self.norm_xca, self.xca = nn.LayerNorm(dim), XCA(dim)
        self.gamma_xca = nn.Parameter(torch.full((dim,), init))
        self.norm, self.mlp = nn.LayerNorm(dim), Mlp(dim, 2 * dim)
        self.gamma = nn.Parameter(torch.full((dim,), init))

    def forward(self, x):
        x = x + self.gamma_xca * self.xca(self.norm_xca(x))
        return x + self.gamma * self.mlp(self.norm(x))


class XcaLike(nn.Module):
    def __init__(self, dim=32, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 4, 4)
        self.blocks = nn.Sequential(XcaBlock(dim), XcaBlock(dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)
        return self.head(self.blocks(x).mean(1))


class GainConv(nn.Module):
    """NFNet's ScaledStdConv2d: a standardised weight times a learned per-channel gain."""

    def __init__(self, cin, cout, gain_init=1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cout, cin, 1, 1) * cin ** -0.5)
        self.bias = nn.Parameter(torch.zeros(cout))
        self.gain = nn.Parameter(torch.full((cout, 1, 1, 1), gain_init))

    def forward(self, x):
        w = (self.weight - self.weight.mean((1, 2, 3), keepdim=True)) / (self.weight.std((1, 2, 3), keepdim=True) + 1e-5)
        return F.conv2d(x, w * self.gain * self.weight[0].numel() ** -0.5, self.bias)


class SE(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Conv2d(dim, hidden, 1), nn.ReLU(), nn.Conv2d(hidden, dim, 1)
        nn.init.zeros_(self.fc1.bias)                     # timm initialises conv biases to zero
        nn.init.zeros_(self.fc2.bias)

    def forward(self, x):
        return x * torch.sigmoid(self.fc2(self.act(self.fc1(x.mean((2, 3), keepdim=True)))))


class NfBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.conv1, self.conv2 = GainConv(dim, dim), GainConv(dim, dim)
        self.conv3 = GainConv(dim, dim, gain_init=0.0)       # zero-init last: the branch starts closed
        self.attn_last = SE(dim, dim // 2)
        self.alpha = 0.2

    def forward(self, x):
        y = self.conv3(F.gelu(self.conv2(F.gelu(self.conv1(x)))))
        return x + self.alpha * self.attn_last(y)


class NfLike(nn.Module):
    def __init__(self, dim=16, classes=10):
        super().__init__()
        self.stem = GainConv(3, dim)
        self.stages = nn.Sequential(NfBlock(dim), NfBlock(dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        return self.head(self.stages(self.stem(x)).mean((2, 3)))


class PoolBlock(nn.Module):
    def __init__(self, dim, init=1e-5):
        super().__init__()
        self.norm1, self.pool = nn.GroupNorm(1, dim), nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.norm2 = nn.GroupNorm(1, dim)
        self.mlp = nn.Sequential(nn.Conv2d(dim, 2 * dim, 1), nn.GELU(), nn.Conv2d(2 * dim, dim, 1))
        self.layer_scale1 = nn.Parameter(torch.full((dim, 1, 1), init))
        self.layer_scale2 = nn.Parameter(torch.full((dim, 1, 1), init))

    def forward(self, x):
        u = self.norm1(x)
        x = x + self.layer_scale1 * (self.pool(u) - u)
        return x + self.layer_scale2 * self.mlp(self.norm2(x))


class PoolFormerLike(nn.Module):
    def __init__(self, dim=16, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 4, 4)
        self.blocks = nn.Sequential(PoolBlock(dim), PoolBlock(dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def cait_like(init: float = 1e-5):
    torch.manual_seed(0)
    return CaitLike(init=init)


def xca_like():
    torch.manual_seed(0)
    return XcaLike()


def nf_like():
    torch.manual_seed(0)
    return NfLike()


def poolformer_like():
    torch.manual_seed(0)
    return PoolFormerLike()


def example_inputs():
    return (torch.randn(2, 3, 16, 16),)
