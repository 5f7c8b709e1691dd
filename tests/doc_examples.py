"""Files the documentation's examples name and the repository does not hold (`net.py`, its checkpoints,
a Hugging Face config folder), made in an example's scratch folder by tests/test_readme.py. Each file is
what the page says it is: a Lightning-style checkpoint with a `model.` prefix, a pickle that would call
os.system, a tensor subclass of a module that is gone, a whole pickled model, weights of another width."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

NET = """
import torch
from torch import nn

def build(width=8):
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))

def example_inputs():
    return (torch.randn(3, 4),)
"""


def _module(folder: Path, name: str, source: str):
    """Import `source` as module `name`; the caller forgets it, so the loader cannot import it back."""
    (folder / f"{name}.py").write_text(source)
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _forget(folder: Path, name: str) -> None:
    sys.modules.pop(name, None)
    (folder / f"{name}.py").unlink()


def _net(width=8):
    import torch
    from torch import nn

    torch.manual_seed(123)
    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))


def make(folder: Path, words: list[str]) -> None:
    """Write what the command line `words` names: net.py for `net.py:…`, each checkpoint by its name, the
    gpt2-config folder for `hf:gpt2-config`."""
    import torch

    if any(w.startswith("net.py:") for w in words):
        (folder / "net.py").write_text(NET)
    names = {Path(words[i + 1]).name for i, w in enumerate(words[:-1]) if w == "--checkpoint"}
    state = _net().state_dict()
    if "last.ckpt" in names:
        torch.save({"epoch": 3, "global_step": 10, "state_dict": {"model." + k: v for k, v in state.items()}},
                   folder / "last.ckpt")
    if "evil.ckpt" in names:
        evil = _module(folder, "evil_payload", "import os\nclass Evil:\n    def __reduce__(self):\n"
                                               "        return (os.system, ('touch PWNED',))\n")
        torch.save({"state_dict": state, "hyper_parameters": {"h": evil.Evil()}}, folder / "evil.ckpt")
        _forget(folder, "evil_payload")
    if "marked.pt" in names:
        mod = _module(folder, "myhparams", "import torch\nclass Marked(torch.Tensor):\n    pass\n")
        marked = dict(state)
        marked["0.weight"] = state["0.weight"].as_subclass(mod.Marked)
        torch.save(marked, folder / "marked.pt")
        _forget(folder, "myhparams")
    if "model.pt" in names:
        torch.save(_net(), folder / "model.pt")
    if "w16.pt" in names:
        torch.save(_net(16).state_dict(), folder / "w16.pt")
    if "w.pt" in names:
        torch.save(state, folder / "w.pt")
    if "hf:example-org/tiny-gpt2" in words:
        _hub_cache(folder / ".cache" / "huggingface" / "hub")
    if "hf:gpt2-config" in words:
        import transformers

        cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=1000, n_positions=64,
                                      bos_token_id=0, eos_token_id=0)
        cfg.architectures = ["GPT2LMHeadModel"]
        cfg.save_pretrained(folder / "gpt2-config")


HUB_COMMIT = "4f2c1e0b9d8a7c6b5a4f3e2d1c0b9a8f7e6d5c4b"


def _hub_cache(cache: Path) -> None:
    """example-org/tiny-gpt2 as hf_hub_download leaves a model in the Hugging Face cache (the examples run with
    HOME at their scratch folder, so this is ~/.cache/huggingface/hub): refs/main names the commit, its snapshot
    links config.json and model.safetensors to blobs."""
    import hashlib
    import os

    import torch
    import transformers
    from safetensors.torch import save

    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=1000, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)
    cfg.architectures = ["GPT2LMHeadModel"]
    torch.manual_seed(5)
    model = transformers.GPT2LMHeadModel(cfg)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}   # tied: saved once
    files = {"config.json": cfg.to_json_string().encode(), "model.safetensors": save(state)}
    base = cache / "models--example-org--tiny-gpt2"
    snapshot = base / "snapshots" / HUB_COMMIT
    for sub in ("blobs", "refs", f"snapshots/{HUB_COMMIT}"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    (base / "refs" / "main").write_text(HUB_COMMIT)
    for name, data in files.items():
        blob = base / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
