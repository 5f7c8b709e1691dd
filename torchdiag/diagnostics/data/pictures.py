"""What the data's pictures show, as data (render/data.py draws them): the sample inputs per class and their
range for the grid (one row per class), and the per-channel values kept for histograms."""
from __future__ import annotations

import numpy as np

from .findings import label_counts, labelled


def add_pictures(r, st) -> None:
    gal, channels = {}, {}
    for split, s in st.scans.items():
        inputs = [s.fields[n] for n in (s.roles.inputs if s.roles else []) if n in s.fields]
        if s.gallery and inputs and inputs[0].values:
            f = inputs[0]
            gal[split] = {"samples": s.gallery, "per_class": st.opts.per_class, "range": (f.lo, f.hi),
                          "field": f.name, "target": s.roles.target}
        for f in s.fields.values():
            if f.role == "input" and f.reservoir:
                values = [np.asarray(v, dtype=np.float64) for v in f.reservoir]
                channels[f"{split}:{f.name}"] = values
                for c, v in enumerate(values):
                    r.histograms[f"data/{split}/{f.name}/channel_{c}"] = v
            if labelled(f):   # samples per class, or per label of a multi-label target
                per = label_counts(f)
                counts = [per[c] for c in sorted(per)]
                r.histograms[f"data/{split}/{f.name}/labels"] = np.repeat(np.array(sorted(per), dtype=np.float64),
                                                                          np.minimum(counts, 10_000))
    r.artefacts["gallery"] = gal
    r.artefacts["channels"] = channels
