"""A tiny GPT-style language model that returns logits only (no labels, no loss): N×T×V.

torchdiag's auto loss recognises it by what it does: integer ids (N, T) feed an embedding of V rows and
the output is (N, T, V), so the default loss is next-token cross-entropy on the ids shifted by one."""
import torch
from torch import nn


class TinyGPT(nn.Module):
    def __init__(self, vocab=64, dim=32, heads=4, layers=2, context=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=ids.device)
        x = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        return self.head(self.norm(self.blocks(x, mask=mask, is_causal=True)))


def build(vocab: int = 64, dim: int = 32, layers: int = 2) -> nn.Module:
    return TinyGPT(vocab, dim, layers=layers)


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, 64, (4, 16), generator=g),)
