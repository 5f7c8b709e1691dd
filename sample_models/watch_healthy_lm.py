"""A healthy training script: a small transformer language model learns synthetic sequences (each
sequence repeats a random 4-token pattern), AdamW with linear warm-up then cosine decay, gradient
clipping. Run: python watch_healthy_lm.py --steps 120"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, SEQ = 16, 16


class LM(nn.Module):
    def __init__(self, d=32, heads=2, layers=1):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.randn(SEQ, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, tokens):
        t = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        h = self.blocks(self.emb(tokens) + self.pos[:t], mask=mask, is_causal=True)
        return self.head(self.norm(h))


def batch(n, g):
    pattern = torch.randint(0, VOCAB, (n, 4), generator=g)
    return pattern.repeat(1, SEQ // 4 + 1)[:, :SEQ + 1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = LM()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    warm = max(1, args.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, args.steps - warm))))
    for step in range(args.steps):
        seq = batch(args.batch, g)
        logits = model(seq[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    print(f"final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
