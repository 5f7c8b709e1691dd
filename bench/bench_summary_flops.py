"""summary and flops vs a plain forward pass (eval, no grad) of the same model, in one process.

Targets (issue 2): summary ≤ 1.2×, flops ≤ 1.25× a plain forward; fvcore shown for comparison."""
from common import compare, load, report


def bench(spec, *inputs, fvcore=True, repeat=5):
    import torch

    from torchdiag.api import run

    model, x = load(spec, *inputs)
    model.eval()

    def plain():
        with torch.no_grad():
            x.call(model)

    candidates = {"summary": lambda: run("summary", model, x), "flops (torch engine)": lambda: run("flops", model, x)}
    if fvcore:
        candidates["flops --engine fvcore"] = lambda: run("flops", model, x, engine="fvcore")
    base, rows = compare(plain, candidates, repeat)
    report(f"{spec} {' '.join(inputs)}", base, rows)


if __name__ == "__main__":
    import torch

    torch.manual_seed(0)
    bench("resnet.py:resnet50", "8x3x224x224")
    bench("bert.py:build", "8x128:int64")
