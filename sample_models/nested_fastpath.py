"""A healthy keyword-input encoder whose forward takes PyTorch's nested-tensor fast path:
nn.TransformerEncoder in eval mode, under no_grad, called with `src_key_padding_mask`, returns a nested
tensor inside the encoder (`.shape` raises on it), which is padded back before the head. Word
embeddings are tied to the output projection and the output is a dict.
`example_inputs()` gives {input_ids, padding_mask} with the second sample padded; `-i` works too
(`-i 2x12:int64 -i 2x12:bool`, the mask is then all False: nothing padded)."""
import torch
from torch import nn


class NestedEncoder(nn.Module):
    def __init__(self, vocab=100, dim=32, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 64, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=True)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embed.weight    # tied

    def forward(self, input_ids, padding_mask=None):
        x = self.embed(input_ids)
        h = self.encoder(x, src_key_padding_mask=padding_mask)
        if h.is_nested:
            h = h.to_padded_tensor(0.0, x.shape)
        return {"logits": self.lm_head(h), "hidden": h}


class NestedOut(nn.Module):
    """The encoder's nested output leaves the model as it is (a fast-path output users may return)."""

    def __init__(self, vocab=100, dim=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, 4, 64, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=True)

    def forward(self, input_ids, padding_mask):
        return self.encoder(self.embed(input_ids), src_key_padding_mask=padding_mask)


def build() -> nn.Module:
    return NestedEncoder()


def nested_output() -> nn.Module:
    return NestedOut()


def example_inputs():
    ids = torch.randint(0, 100, (2, 12))
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[1, 7:] = True
    return {"input_ids": ids, "padding_mask": mask}
