"""A Llama-shaped decoder built from a config (RMSNorm, rotary embeddings, SwiGLU, no biases).
`--arg size="'7b'"` gives Llama-2-7B's shape: 6,738,415,616 parameters — build it with
--device meta, which allocates nothing. The rotary tables are computed in the constructor with
tensor arithmetic, so building on meta needs torchdiag's fallback. Input: -i 1x2048:int64."""
import math

import torch
import torch.nn.functional as F
from torch import nn

CONFIGS = {
    "tiny": dict(vocab=512, dim=64, layers=2, heads=4, hidden=172, context=128),
    "7b": dict(vocab=32000, dim=4096, layers=32, heads=32, hidden=11008, context=4096),
}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def rope_tables(head_dim, context, base=10000.0):
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(context).float(), inv)
    scale = float(angles[1, 0].item())  # tensor arithmetic with real values: fails on meta
    assert math.isclose(scale, 1.0)
    return angles.cos(), angles.sin()


def rotate(x, cos, sin):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        shape = (b, t, self.heads, d // self.heads)
        q = rotate(self.wq(x).view(shape), cos[:t, None], sin[:t, None]).transpose(1, 2)
        k = rotate(self.wk(x).view(shape), cos[:t, None], sin[:t, None]).transpose(1, 2)
        v = self.wv(x).view(shape).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, d))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Layer(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, heads)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, vocab, dim, layers, heads, hidden, context):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Layer(dim, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        cos, sin = rope_tables(dim // heads, context)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.output(self.norm(x))


def build(size: str = "tiny") -> nn.Module:
    return Llama(**CONFIGS[size])


def example_inputs():
    return (torch.randint(0, 512, (2, 16)),)
