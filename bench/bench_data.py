"""data's content checks (the streaming pass: statistics, hashes, labels, picture samples) as a ratio of one
plain pass over the same loader (iterating the same batches and doing nothing), same process.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_data.py

Cases: scikit-learn's digits (1,347 training samples of 1x8x8, batches of 64, a TensorDataset: loading is
nearly free, so the ratio is the checks' own cost) and FakeData-like 3x32x32 images (4,096 samples, batches
of 64: each sample drawn in __getitem__, as a decoding dataset would). Both at num_workers=0."""
from __future__ import annotations

from common import ROOT, round_ratios  # noqa: E402  (bench/ is on sys.path when run as a script)


def main() -> None:
    import sys

    import torch

    sys.path.insert(0, str(ROOT / "sample_models"))
    from torch.utils.data import DataLoader

    import data_digits
    from data_fake import FakeData
    from torchdiag.core.datasets import LoadedData
    from torchdiag.diagnostics.data import Options
    from torchdiag.diagnostics.data.scan import SplitScan, scan_into

    cases = [("digits 1347x1x8x8, b64", data_digits.train()),
             ("FakeData 4096x3x32x32, b64", DataLoader(FakeData(4096, (3, 32, 32)), batch_size=64, shuffle=True))]
    opts = Options(samples=None, sweep=False, speed=False)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"{'case':30} {'plain pass':>11} {'content pass':>13}")
    for name, loader in cases:
        data = LoadedData(loader, name, "dataloader", name)

        def plain():
            for _ in DataLoader(loader.dataset, batch_size=64):
                pass

        def checks():
            scan_into(SplitScan("train"), data, opts, None, None, 0)

        base, ratios = round_ratios(plain, {"content": checks}, repeat=5)
        print(f"{name:30} {1000 * base:9.1f} ms {ratios['content']:12.2f}×")


if __name__ == "__main__":
    main()
