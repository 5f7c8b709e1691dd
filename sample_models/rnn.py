"""Sequence models: an LSTM classifier (`build`, input -i 4x20:int64; example_inputs() gives it) and
a bidirectional GRU tagger (`gru`, float features: -i 4x20x16)."""
import torch
from torch import nn


class LSTMClassifier(nn.Module):
    def __init__(self, vocab=500, dim=32, hidden=64, classes=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, batch_first=True, num_layers=2)
        self.head = nn.Linear(hidden, classes)

    def forward(self, tokens):
        out, (h, c) = self.lstm(self.embed(tokens))
        return self.head(out[:, -1])


class GRUTagger(nn.Module):
    def __init__(self, features=16, hidden=32, tags=7):
        super().__init__()
        self.gru = nn.GRU(features, hidden, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, tags)

    def forward(self, x):
        out, _ = self.gru(x)
        return self.head(out)


def build(vocab: int = 500, classes: int = 5) -> nn.Module:
    return LSTMClassifier(vocab=vocab, classes=classes)


def gru() -> nn.Module:
    return GRUTagger()


def example_inputs():
    return (torch.randint(0, 500, (4, 20)),)
