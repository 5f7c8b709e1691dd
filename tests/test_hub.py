"""hf:NAME: a Hugging Face Hub model from the local cache (core.hub), as from_pretrained finds it offline, and
`--download config`, the opt-in that fetches config.json alone.

Every cache here is built by the test in a temporary folder, in huggingface_hub's layout
(models--org--name/{blobs,refs,snapshots}, snapshot files linked to blobs). The download tests run the real
huggingface_hub code path against an HTTP server the test starts on 127.0.0.1 (HF_ENDPOINT), which records
every request: a weights file is never asked for, and without the flag nothing is asked at all."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from support import one_error_line

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"
# parameters of one block of gpt2_config() (n_embd 32): two LayerNorms, c_attn, c_proj, c_fc, mlp c_proj
GPT2_BLOCK = 2 * 2 * 32 + (32 * 96 + 96) + (32 * 32 + 32) + (32 * 128 + 128) + (128 * 32 + 32)


def gpt2_config(n_layer=2):
    cfg = transformers.GPT2Config(n_layer=n_layer, n_embd=32, n_head=4, vocab_size=500, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)
    cfg.architectures = ["GPT2LMHeadModel"]
    return cfg


def bert_config():
    return transformers.BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                   intermediate_size=64, max_position_embeddings=40)


def cache_entry(cache: Path, repo: str, files: dict[str, bytes], commit: str = COMMIT, ref: str | None = "main") -> Path:
    """models--org--name with each file a blob (named by its sha256) linked from snapshots/<commit>/, and
    refs/<ref> holding the commit, as hf_hub_download leaves them. Returns the snapshot folder."""
    base = cache / ("models--" + repo.replace("/", "--"))
    snapshot = base / "snapshots" / commit
    (base / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = base / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    if ref is not None:
        (base / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (base / "refs" / ref).write_text(commit)
    return snapshot


def config_bytes(cfg, tmp_path: Path) -> bytes:
    folder = tmp_path / f"saved-{cfg.model_type}"
    cfg.save_pretrained(folder)
    return (folder / "config.json").read_bytes()


def random_state(cls, cfg, seed: int) -> dict[str, torch.Tensor]:
    """Weights no seeded build would make: each tensor drawn from its own generator (tied tensors saved once)."""
    model = cls(cfg)
    g = torch.Generator().manual_seed(seed)
    state, seen = {}, set()
    for name, t in model.state_dict().items():
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        state[name] = (torch.rand(t.shape, generator=g) * 4 - 2).to(t.dtype) if t.is_floating_point() else t.clone()
    return state


def safetensors_bytes(state, tmp_path: Path) -> bytes:
    path = tmp_path / "weights.safetensors"
    safetensors_torch.save_file(state, str(path))
    return path.read_bytes()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache of the test's own, named by HF_HUB_CACHE; the Hub reachable (not offline)."""
    folder = tmp_path / "hf-cache"
    folder.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return folder


def test_a_cached_name_builds_with_the_weights_saved_there(tmp_path, cache, cli):
    from torchdiag.core.context import prepare
    from torchdiag.core.run import RunSpec

    cfg = gpt2_config()
    saved = random_state(transformers.GPT2LMHeadModel, cfg, seed=7)
    assert "lm_head.weight" not in saved   # tied to wte: saved once, as save_pretrained does
    cache_entry(cache, "tiny-org/gpt2", {"config.json": config_bytes(cfg, tmp_path),
                                         "model.safetensors": safetensors_bytes(saved, tmp_path)})
    built, _, ctx = prepare(RunSpec("summary", "hf:tiny-org/gpt2", device="cpu"))
    state = built.state_dict()
    for name, tensor in saved.items():
        assert torch.equal(state[name], tensor), name
    assert torch.equal(built.lm_head.weight, saved["transformer.wte.weight"])
    assert "from the Hugging Face cache (tiny-org/gpt2, snapshot 01234567)" in ctx.header["source"]
    assert ctx.header["checkpoint"][0].endswith(f"/snapshots/{COMMIT}/model.safetensors: {len(saved)} tensors loaded")
    r = cli("summary", "hf:tiny-org/gpt2", "--json")
    assert r.code == 0, r.stderr
    assert "random weights" not in r.json["source"] and "GPT2LMHeadModel" in r.json["source"]


def test_a_revision_is_a_ref_or_a_commit_and_bert_weights_load(tmp_path, cache):
    from torchdiag.core.context import prepare
    from torchdiag.core.run import RunSpec

    cfg = bert_config()
    saved = random_state(transformers.BertModel, cfg, seed=3)
    files = {"config.json": config_bytes(cfg, tmp_path), "model.safetensors": safetensors_bytes(saved, tmp_path)}
    cache_entry(cache, "org/bert", files, commit=OTHER, ref="v1")
    # no refs/main: the name alone is not cached, as try_to_load_from_cache would say
    r = prepare_error(RunSpec("summary", "hf:org/bert"))
    assert "not in the Hugging Face cache" in r
    for spec in ("hf:org/bert@v1", f"hf:org/bert@{OTHER}"):
        built, _, ctx = prepare(RunSpec("summary", spec, device="cpu"))
        state = built.state_dict()
        assert all(torch.equal(state[k], v) for k, v in saved.items())
        assert "snapshot fedcba98" in ctx.header["source"]
    assert "at v1" in prepare(RunSpec("summary", "hf:org/bert@v1", device="cpu"))[2].header["source"]


def prepare_error(spec) -> str:
    from torchdiag.core.context import prepare
    from torchdiag.errors import UsageError

    with pytest.raises(UsageError) as info:
        prepare(spec)
    return info.value.message


def test_a_folder_of_that_name_comes_first(tmp_path, cache, cli):
    """As from_pretrained: a local folder named like the Hub model is read, the cache is not."""
    cache_entry(cache, "tiny-org/gpt2", {"config.json": config_bytes(gpt2_config(n_layer=2), tmp_path)})
    gpt2_config(n_layer=1).save_pretrained(tmp_path / "tiny-org" / "gpt2")
    folder = cli("summary", "hf:tiny-org/gpt2", "--json")
    os.rename(tmp_path / "tiny-org", tmp_path / "moved")
    cached = cli("summary", "hf:tiny-org/gpt2", "--json")
    assert folder.code == cached.code == 0, folder.stderr + cached.stderr
    assert cached.json["total_params"] - folder.json["total_params"] == GPT2_BLOCK
    assert "Hugging Face cache" not in folder.json["source"] and "Hugging Face cache" in cached.json["source"]


def test_only_pickled_weights_are_named_and_not_read(tmp_path, cache, cli):
    """A cache holding pytorch_model.bin only: random weights, and the header says how to load the pickle.
    The file here is not even a torch.save file: had it been read, the run would have failed."""
    cache_entry(cache, "old/gpt2", {"config.json": config_bytes(gpt2_config(), tmp_path),
                                    "pytorch_model.bin": b"not a pickle at all"})
    r = cli("summary", "hf:old/gpt2", "--json")
    assert r.code == 0, r.stderr
    source = r.json["source"]
    assert "no *.safetensors in the snapshot: random weights" in source
    assert "pytorch_model.bin is a pickle, not read unless asked: --checkpoint " in source
    assert "checkpoint" not in r.json


def test_the_checkpoint_line_the_header_gives_loads_the_pickle(tmp_path, cache, cli):
    from torchdiag.core.context import prepare
    from torchdiag.core.run import RunSpec

    cfg = gpt2_config()
    saved = random_state(transformers.GPT2LMHeadModel, cfg, seed=11)
    torch.save(saved, tmp_path / "pytorch_model.bin")
    cache_entry(cache, "old/gpt2", {"config.json": config_bytes(cfg, tmp_path),
                                    "pytorch_model.bin": (tmp_path / "pytorch_model.bin").read_bytes()})
    source = cli("summary", "hf:old/gpt2", "--json").json["source"]
    path = source.split("--checkpoint ", 1)[1].split(" loads it", 1)[0]
    built, _, _ = prepare(RunSpec("summary", "hf:old/gpt2", checkpoint=path, device="cpu"))
    state = built.state_dict()
    assert all(torch.equal(state[k], v) for k, v in saved.items())


@pytest.mark.parametrize("name", ["bad name", "org/-x", "a--b", "org/name@", "org/name@a..b"])
def test_a_malformed_name_is_one_line(cache, cli, name):
    r = cli("summary", f"hf:{name}")
    assert r.code == 2, r.stderr
    one_error_line(r)
    assert "not a Hub model name" in r.stderr


def test_a_cache_entry_without_config_or_with_a_damaged_ref_is_one_line(tmp_path, cache, cli):
    cache_entry(cache, "org/noconfig", {"model.safetensors": safetensors_bytes({"w": torch.ones(2)}, tmp_path)})
    r = cli("summary", "hf:org/noconfig")
    assert r.code == 2
    one_error_line(r)
    assert "holds org/noconfig (snapshot 01234567) but no config.json" in r.stderr and "--download config" in r.stderr
    cache_entry(cache, "org/damaged", {"config.json": config_bytes(gpt2_config(), tmp_path)})
    (cache / "models--org--damaged" / "refs" / "main").write_text("../../../etc")
    r = cli("summary", "hf:org/damaged", "--json")
    assert r.code == 2 and "names no commit" in r.json["error"]["message"]


def test_the_cache_is_found_where_huggingface_hub_looks(tmp_path, monkeypatch):
    """HF_HUB_CACHE, then HUGGINGFACE_HUB_CACHE, then HF_HOME/hub, then XDG_CACHE_HOME/huggingface/hub, then
    ~/.cache/huggingface/hub."""
    from torchdiag.core.hub import cache_dir

    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == str(tmp_path / "home" / ".cache" / "huggingface" / "hub")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == str(tmp_path / "xdg" / "huggingface" / "hub")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    assert cache_dir() == str(tmp_path / "hfhome" / "hub")
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "legacy"))
    assert cache_dir() == str(tmp_path / "legacy")
    monkeypatch.setenv("HF_HUB_CACHE", "~/hub")
    assert cache_dir() == str(tmp_path / "home" / "hub")


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_cache_folder_is_huggingface_hubs_own(tmp_path):
    """The same variables give the folder huggingface_hub itself computes (a fresh process reads them)."""
    code = ("import json, huggingface_hub.constants as c\nfrom torchdiag.core.hub import cache_dir\n"
            "print(json.dumps([c.HF_HUB_CACHE, cache_dir()]))")
    base = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME",
                                                              "XDG_CACHE_HOME")}
    base["HOME"] = str(tmp_path)
    for extra in ({}, {"XDG_CACHE_HOME": str(tmp_path / "x")}, {"HF_HOME": str(tmp_path / "h")},
                  {"HF_HOME": str(tmp_path / "h"), "HF_HUB_CACHE": str(tmp_path / "c")}):
        r = subprocess.run([sys.executable, "-c", code], env={**base, **extra}, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        theirs, ours = json.loads(r.stdout)
        assert theirs == ours, extra


# ---- --download config against a local Hub ------------------------------------------------------------

class Hub:
    """A Hub endpoint on 127.0.0.1 serving `files` ({"org/name": {"config.json": bytes}}) at
    /<repo>/resolve/<revision>/<file> as huggingface.co does (X-Repo-Commit, ETag); records each request."""

    def __init__(self, files: dict[str, dict[str, bytes]]):
        self.files, self.requests = files, []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self):
                self.answer(body=False)

            def do_GET(self):
                self.answer(body=True)

            def answer(self, body: bool):
                hub.requests.append((self.command, self.path))
                if hub.files is None:
                    self.send_response(200)
                    self.send_header("Content-Length", "5")
                    self.end_headers()
                    if body:
                        self.wfile.write(b"login")
                    return
                parts = self.path.split("?")[0].strip("/").split("/")
                repo, data = "/".join(parts[:2]), None
                if len(parts) >= 5 and parts[2] == "resolve" and repo in hub.files:
                    data = hub.files[repo].get("/".join(parts[4:]))
                    code = "EntryNotFound"
                else:
                    code = "RepoNotFound"
                if data is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", code)
                    self.send_header("X-Repo-Commit", COMMIT)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", '"' + hashlib.sha1(data).hexdigest() + '"')
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hub(tmp_path, cache, monkeypatch):
    weights = safetensors_bytes(random_state(transformers.GPT2LMHeadModel, gpt2_config(), seed=1), tmp_path)
    files = {"tiny-org/gpt2": {"config.json": config_bytes(gpt2_config(), tmp_path), "model.safetensors": weights},
             "tiny-org/noconfig": {"model.safetensors": weights}}
    with Hub(files) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
        yield server


def test_without_the_flag_nothing_is_asked_of_the_hub(hub, cli):
    r = cli("summary", "hf:tiny-org/gpt2")
    assert r.code == 2
    one_error_line(r)
    assert "is not in the Hugging Face cache" in r.stderr and "nothing was downloaded" in r.stderr
    assert "--download config" in r.stderr
    assert hub.requests == []


def test_download_config_fetches_config_json_alone(hub, cache, cli):
    r = cli("summary", "hf:tiny-org/gpt2", "--download", "config", "--json")
    assert r.code == 0, r.stderr
    assert hub.requests and all(path == "/tiny-org/gpt2/resolve/main/config.json" for _, path in hub.requests), \
        hub.requests    # never model.safetensors, though the Hub has it
    snapshot = cache / "models--tiny-org--gpt2" / "snapshots" / COMMIT
    assert sorted(os.listdir(snapshot)) == ["config.json"]
    assert (cache / "models--tiny-org--gpt2" / "refs" / "main").read_text() == COMMIT
    assert json.loads((snapshot / "config.json").read_text())["n_layer"] == 2
    assert "config.json fetched by --download config" in r.json["source"] and "random weights" in r.json["source"]
    # the next run finds it in the cache: no request, flag or not; flops plans it on meta
    asked = len(hub.requests)
    again = cli("flops", "hf:tiny-org/gpt2", "--device", "meta", "--json")
    planned = cli("memory", "hf:tiny-org/gpt2", "--device", "meta", "--json")
    flagged = cli("summary", "hf:tiny-org/gpt2", "--download", "config", "--json")
    assert again.code == planned.code == flagged.code == 0, again.stderr + planned.stderr + flagged.stderr
    assert len(hub.requests) == asked
    # the plan holds the parameters the config describes (closed form: wte, wpe, 2 blocks, ln_f; lm_head tied), 4 bytes each
    params = 500 * 32 + 64 * 32 + 2 * GPT2_BLOCK + 2 * 32
    assert r.json["total_params"] == params
    assert planned.json["param_bytes"] == 4 * params
    assert "from the Hugging Face cache" in flagged.json["source"]
    assert flagged.json["total_params"] == r.json["total_params"]


def test_download_asks_for_the_revision_named(hub, cache, cli):
    r = cli("summary", "hf:tiny-org/gpt2@v2", "--download", "config", "--json")
    assert r.code == 0, r.stderr
    assert {path for _, path in hub.requests} == {"/tiny-org/gpt2/resolve/v2/config.json"}
    assert (cache / "models--tiny-org--gpt2" / "refs" / "v2").read_text() == COMMIT
    assert not (cache / "models--tiny-org--gpt2" / "refs" / "main").exists()
    assert "(tiny-org/gpt2 at v2, snapshot 01234567)" in r.json["source"]


def test_download_refused_offline_and_failures_are_one_line(hub, cli, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = cli("summary", "hf:tiny-org/gpt2", "--download", "config")
    assert r.code == 2 and "HF_HUB_OFFLINE" in r.stderr
    one_error_line(r)
    assert hub.requests == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    for name, words in (("nobody/nothing", "has no model named nobody/nothing"), ("tiny-org/noconfig", "has no config.json")):
        r = cli("summary", f"hf:{name}", "--download", "config")
        assert r.code == 2, r.stderr
        one_error_line(r)
        assert words in r.stderr
    assert all(path.endswith("/config.json") for _, path in hub.requests), hub.requests


def test_a_network_error_during_download_is_one_line(cache, cli, monkeypatch):
    import socket

    import huggingface_hub.utils._http as http

    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    waits = []
    monkeypatch.setattr(http.time, "sleep", waits.append)   # huggingface_hub retries with backoff: not waited out here
    r = cli("summary", "hf:tiny-org/gpt2", "--download", "config")
    assert r.code == 2
    one_error_line(r)
    assert len(r.stderr.strip().splitlines()) == 2, r.stderr    # error and hint: not the library's retry warnings
    assert "could not fetch config.json" in r.stderr and "onnect" in r.stderr
    assert waits   # the library's own retries did run


def test_an_endpoint_that_is_no_hub_is_one_line(cache, cli, monkeypatch):
    """A server that answers without the Hub's headers (a proxy's login page, a wrong HF_ENDPOINT)."""
    with Hub({}) as server:
        server.files = None   # every request: 200 and a page, no X-Repo-Commit, no ETag
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        r = cli("summary", "hf:tiny-org/gpt2", "--download", "config", "--json")
    assert r.code == 2
    message = r.json["error"]["message"]
    assert "could not fetch config.json" in message and "X-Repo-Commit" in message and "\n" not in message


def test_download_takes_config_only_and_hf_specs_only(tmp_path, cache, cli):
    r = cli("summary", "hf:tiny-org/gpt2", "--download", "weights")
    assert r.code == 2 and "--download: 'weights' is not one of config" in r.stderr
    one_error_line(r)
    (tmp_path / "net.py").write_text("from torch import nn\ndef build():\n    return nn.Linear(2, 2)\n")
    r = cli("summary", "net.py:build", "-i", "1x2", "--download", "config")
    assert r.code == 2 and "is not one" in r.stderr
    one_error_line(r)
    gpt2_config().save_pretrained(Path("folder"))   # a folder: read as before, the flag changes nothing
    r = cli("summary", "hf:folder", "--download", "config", "--json")
    assert r.code == 0 and "Hugging Face cache" not in r.json["source"]


def test_a_missing_name_is_refused_before_the_model_loads(tmp_path, cache):
    """core.spec_check.precheck (torch-free) gives the loader's own message; with --download only the name's form
    is checked there, and a folder is left to the loader."""
    from torchdiag.core.spec_check import precheck
    from torchdiag.errors import UsageError

    with pytest.raises(UsageError, match="is not in the Hugging Face cache"):
        precheck("hf:org/name")
    with pytest.raises(UsageError, match="not a Hub model name"):
        precheck("hf:org/bad name", "config")
    precheck("hf:org/name", "config")
    (tmp_path / "org" / "name").mkdir(parents=True)
    precheck("hf:org/name")
    cache_entry(cache, "org/cached", {"config.json": config_bytes(gpt2_config(), tmp_path)})
    precheck("hf:org/cached")


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_cli_answers_a_missing_name_without_importing_torch(tmp_path):
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "empty-cache")}
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "torchdiag", "summary", "hf:org/name"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert r.returncode == 2 and "error: hf:org/name is no local folder and is not in the Hugging Face cache" in r.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")]
    assert "torch" not in imported and "huggingface_hub" not in imported


def test_a_timm_folder_given_as_hf_names_the_timm_spec(tmp_path, cli):
    """A sweep: timm's Hub folder (save_for_hf: `architecture`, no `model_type`) given as hf: was told to add a
    transformers model_type; it is timm's, built by timm:NAME with the folder's weights."""
    pytest.importorskip("transformers")
    folder = tmp_path / "timm-resnet18"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architecture": "resnet18", "num_classes": 10,
                                                    "pretrained_cfg": {"input_size": [3, 224, 224]}}))
    torch.save({}, folder / "pytorch_model.bin")
    r = cli("summary", f"hf:{folder}")
    assert r.code == 2, r.stderr
    one_error_line(r)
    assert "is a timm model's (architecture resnet18)" in r.stderr
    assert f"give timm:resnet18 --checkpoint {folder / 'pytorch_model.bin'} in its place" in r.stderr, r.stderr
