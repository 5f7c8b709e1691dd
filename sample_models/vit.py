"""Vision Transformer with torchvision's ViT layout (nn.MultiheadAttention inside
nn.TransformerEncoder-style blocks). `vit_b_16()` has ViT-B/16's 86,567,656 parameters;
`build()` is a tiny one for tests. Input: -i 1x3x224x224 (vit_b_16) or -i 2x3x32x32 (build)."""
import torch
from torch import nn


class EncoderBlock(nn.Module):
    def __init__(self, dim, heads, mlp_dim):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

    def forward(self, x):
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + y
        return x + self.mlp(self.ln_2(x))


class ViT(nn.Module):
    def __init__(self, image=224, patch=16, layers=12, heads=12, dim=768, mlp_dim=3072, classes=1000):
        super().__init__()
        self.patch = patch
        self.conv_proj = nn.Conv2d(3, dim, patch, patch)
        seq = (image // patch) ** 2 + 1
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.empty(1, seq, dim).normal_(std=0.02))
        self.layers = nn.Sequential(*[EncoderBlock(dim, heads, mlp_dim) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embedding
        x = self.ln(self.layers(x))
        return self.head(x[:, 0])


def vit_b_16(classes: int = 1000) -> nn.Module:
    return ViT(classes=classes)


def build(classes: int = 10) -> nn.Module:
    return ViT(image=32, patch=8, layers=2, heads=4, dim=64, mlp_dim=128, classes=classes)


def example_inputs():
    return (torch.randn(2, 3, 32, 32),)
