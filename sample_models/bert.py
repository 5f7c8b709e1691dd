"""A BERT-base-sized encoder (12 layers, hidden 768, 12 heads, FFN 3072, vocab 30522) built from
nn.TransformerEncoder, with random weights. `small()` is a 2-layer version for tests.
Input: -i 1x128:int64."""
import torch
from torch import nn


class Bert(nn.Module):
    def __init__(self, vocab=30522, dim=768, layers=12, heads=12, ffn=3072, context=512):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim)
        self.position_embeddings = nn.Embedding(context, dim)
        self.norm = nn.LayerNorm(dim)
        layer = nn.TransformerEncoderLayer(dim, heads, ffn, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.pooler = nn.Linear(dim, dim)

    def forward(self, input_ids):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.norm(self.word_embeddings(input_ids) + self.position_embeddings(pos))
        x = self.encoder(x)
        return torch.tanh(self.pooler(x[:, 0]))


def build() -> nn.Module:
    return Bert()


def small() -> nn.Module:
    return Bert(vocab=1000, dim=64, layers=2, heads=4, ffn=128, context=64)


def example_inputs():
    return (torch.randint(0, 1000, (2, 16)),)
