"""Bug: nn.NLLLoss given the model's raw logits (no log_softmax): it negates the target's value, so the loss falls
below 0 without bound while the other classes get no gradient (accuracy stays at chance). `--fixed` adds the
LogSoftmax; `--log` takes the log of a softmax's output with a floor added (log(p + 0.01): its exps sum above 1,
yet no value is above log(1.01)); `--padded` gives log-probabilities whose padded rows are filled with 0 and ignored
(their targets ignore_index); `--both` adds a second loss, a softmax's output given to CrossEntropyLoss (two bugs);
`--small` starts the logits near 0 (a head initialised at std 1e-3: no value above 0.05); `--aux` calls three
auxiliary CrossEntropyLoss modules first; `--weighted` gives log-probabilities scaled by a per-sample weight of
either sign (REINFORCE written with NLLLoss: not logits); `--masked` masks class 3 to -inf in the logits (a
review: such rows were skipped), `--masked-logp` in the logits before a log_softmax (log-probabilities); `--function`
calls F.nll_loss, `--keywords` the module with keywords (no forward hook sees either: read from the loss's graph)."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--fixed", action="store_true")
    ap.add_argument("--log", action="store_true")
    ap.add_argument("--padded", action="store_true")
    ap.add_argument("--both", action="store_true")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--aux", action="store_true")
    ap.add_argument("--weighted", action="store_true")
    ap.add_argument("--masked", action="store_true")
    ap.add_argument("--masked-logp", action="store_true")
    ap.add_argument("--function", action="store_true")
    ap.add_argument("--keywords", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    layers = [nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4)]
    if args.small:
        nn.init.normal_(layers[-1].weight, std=1e-3)
        nn.init.zeros_(layers[-1].bias)
    logp = args.fixed or args.padded or args.weighted
    end = [nn.LogSoftmax(dim=1)] if logp else [nn.Softmax(dim=1)] if args.log else []
    model = nn.Sequential(*layers, *end)
    aux = [nn.CrossEntropyLoss() for _ in range(3)] if args.aux else []
    criterion = nn.NLLLoss()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    w = torch.randn(8, 4)
    for _ in range(args.steps):
        x = torch.randn(32, 8)
        out, y = model(x), (x @ w)[:, :3].argmax(1) if args.masked or args.masked_logp else (x @ w).argmax(1)
        if args.masked or args.masked_logp:   # class 3 is never a target: masked out
            out = out.masked_fill(torch.arange(4) == 3, float("-inf"))
            out = out.log_softmax(1) if args.masked_logp else out
        if args.padded:   # the last 8 rows are padding: zeroed, and not scored
            pad = torch.arange(32) >= 24
            out, y = out.masked_fill(pad[:, None], 0.0), y.masked_fill(pad, -100)
        if args.weighted:   # an advantage per sample, of either sign
            out = out * torch.randn(32, 1)
        scores = torch.log(out + 0.01) if args.log else out
        nll = F.nll_loss(scores, y) if args.function else criterion(input=scores, target=y) if args.keywords else \
            criterion(scores, y)
        loss = sum(a(model[:3](x), y) for a in aux) + nll
        if args.both:
            loss = loss + nn.CrossEntropyLoss()(torch.softmax(out, 1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
