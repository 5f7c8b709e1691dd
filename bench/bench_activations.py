"""Cost of the see-inside commands as ratios to a baseline measured in the same process.

- activations (stats only, and with feature-map/filter pictures) vs one plain no-grad forward;
- attention (weights captured, MHA fast path off) vs one plain no-grad forward;
- gradcam vs one plain forward+backward; embeddings (projector files written) vs one forward;
- gradcheck vs one forward+backward of the same function (numerical Jacobian: 2 forwards per
  input element, analytical: 1 backward per output element).
Best of 5, one thread. Run: python bench/bench_activations.py"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import torch  # noqa: E402

from conftest import load, sample  # noqa: E402


def best(fn, n=5):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    torch.set_num_threads(1)
    from torchdiag.api import run
    from torchdiag.diagnostics import gradcheck
    from torchdiag.render import activations as r_act
    from torchdiag.render import attention as r_att
    from torchdiag.render import embeddings as r_emb
    from torchdiag.render import gradcam as r_cam

    tmp = tempfile.mkdtemp()
    print(f"{'model':28} {'command':34} {'ratio':>8}  baseline")
    for name in ("cnn.py:build", "resnet.py:build", "vit.py:build"):
        model, inputs = load(name)
        model.eval()

        def fwd():
            with torch.no_grad():
                inputs.call(model)

        fwd()
        base = best(fwd)
        # "+pictures" variants include writing the files (render/), as the CLI does
        rows = [("activations (stats)", lambda: run("activations", model, inputs)),
                ("activations (+pictures, tb)", lambda: r_act.write_images(
                    run("activations", model, inputs, images=True, tb=True), tmp))]
        if name.startswith("vit"):
            rows.append(("attention (weights)", lambda: run("attention", model, inputs)))
            rows.append(("attention (+pictures)", lambda: r_att.write_images(run("attention", model, inputs, images=True), tmp)))
        layer = {"cnn.py:build": "head.0", "resnet.py:build": "avgpool", "vit.py:build": "ln"}[name]
        rows.append(("embeddings (projector)", lambda: r_emb.write_projector(run("embeddings", model, inputs, layer=layer), tmp)))
        for label, fn in rows:
            fn()
            print(f"{name:28} {label:34} {best(fn) / base:8.2f}x  forward {base * 1e3:.1f} ms")

    # gradcam on the region classifier, 1×3×32×32 (vs forward+backward of the same input)
    import numpy as np
    from PIL import Image

    model, _ = load("gradcam_region.py:build")
    img = os.path.join(tmp, "img.png")
    Image.fromarray((np.random.default_rng(0).uniform(0, 1, (32, 32, 3)) * 255).astype(np.uint8)).save(img)
    x = torch.rand(1, 3, 32, 32)

    def fb():
        model.zero_grad(set_to_none=True)
        model(x)[0].max().backward()

    fb()
    base = best(fb)
    out = os.path.join(tmp, "c.png")
    for label, fn in (("gradcam (map only)", lambda: run("gradcam", model, None, layer="features.3", image=img)),
                      ("gradcam (+PNG)", lambda: r_cam.write_out(
                          run("gradcam", model, None, layer="features.3", image=img, out=True), out))):
        fn()
        print(f"{'gradcam_region.py:build':28} {label:34} {best(fn) / base:8.2f}x  fwd+bwd {base * 1e3:.2f} ms")

    # gradcheck on x·y² with 3×4 inputs (24 input elements, 12 output elements)
    import importlib.util

    spec = importlib.util.spec_from_file_location("ca", sample("custom_autograd.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    xs = [torch.randn(3, 4, dtype=torch.float64) for _ in range(2)]

    def fb2():
        a = [t.clone().requires_grad_(True) for t in xs]
        mod.MulSquare.apply(*a).sum().backward()

    fb2()
    base = best(fb2)
    for label, second in (("gradcheck", False), ("gradcheck --second-order", True)):
        fn = lambda: gradcheck.check_callable(mod.MulSquare, xs, gradcheck.Options(second_order=second))  # noqa: E731
        fn()
        print(f"{'custom_autograd:MulSquare':28} {label:34} {best(fn) / base:8.1f}x  fwd+bwd {base * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
