"""`torchdiag watch -- python train.py ...` and `torchdiag.watch(...)`: the command wired through the registry
and the runner (the engine itself is tests/test_watch.py)."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from support import ROOT, SAMPLES, one_error_line, spawn, torchrun_args

# a tiny healthy loop that also shows what it sees: argv, __name__, cwd, a line of stdin
HEALTHY = textwrap.dedent("""
    import os, sys, time
    import torch
    line = sys.stdin.readline().strip() if "--stdin" in sys.argv else ""
    print("SCRIPT", sys.argv[1:], __name__, os.getcwd(), repr(line), flush=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = int(sys.argv[sys.argv.index("--steps") + 1])
    for i in range(steps):
        x = torch.randn(8, 3)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        if i == 9 and "--wait" in sys.argv:
            print("READY", flush=True)
            time.sleep(120)
""")
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


@pytest.fixture
def healthy(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(HEALTHY)
    return path


def _torchdiag(*args, cwd, input=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "torchdiag", "watch", *map(str, args)], capture_output=True,
                          text=True, env=ENV, cwd=cwd, input=input, timeout=timeout)


def test_healthy_script_exit_0_sees_its_own_argv_cwd_stdin_and_stdout(healthy, tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    r = _torchdiag("--every", "5", "--", "python", healthy, "--steps", "12", "--lr", "x", "--stdin", cwd=work,
                   input="hello\n")
    assert r.returncode == 0, r.stderr
    # its own argv (no torchdiag options), run as __main__, in the caller's folder, reading the caller's stdin,
    # writing to stdout before the report
    script_line = f"SCRIPT ['--steps', '12', '--lr', 'x', '--stdin'] __main__ {work} 'hello'"
    assert r.stdout.startswith(script_line), r.stdout
    assert "torchdiag watch" in r.stdout and "12 optimizer steps, 3 read-backs" in r.stdout
    assert "error" not in r.stderr


def test_json_the_scripts_stdout_goes_to_stderr(healthy, tmp_path):
    r = _torchdiag("--json", "--every", "4", "--", sys.executable, healthy, "--steps", "8", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)          # stdout is the one document
    assert "SCRIPT ['--steps', '8']" in r.stderr
    # reads at step 1 and at every 4th: 1, 4, 8
    assert doc["command"] == "watch" and doc["steps"] == 8 and doc["reads"] == 3 and doc["exit_code"] == 0
    assert doc["step"] == list(range(1, 9)) and len(doc["loss"]) == 8 and doc["findings"] == []


def test_buggy_script_exit_1_with_the_step_and_the_module(cli, monkeypatch, tmp_path):
    """watch_nan_forward.py takes log() of a batch holding a negative value at step 30 (every=10: a read step,
    so the batch is replayed and the module named); the step comes from the script, not from the report."""
    monkeypatch.chdir(tmp_path)
    r = cli("watch", "--json", "--every", "10", "--", "python", SAMPLES / "watch_nan_forward.py", "--steps", "40",
            "--bad-step", "30")
    assert r.code == 1, r.stderr
    doc = r.json
    assert doc["exit_code"] == 1 and doc["first_non_finite_step"] == 30 and doc["steps"] == 40
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert [f["code"] for f in errors] == ["non-finite-loss"]
    assert "at step 30" in errors[0]["message"] and errors[0]["where"] == "0"
    assert doc["replay"]["direction"] == "forward" and doc["replay"]["type"] == "LogFeatures"
    # the losses before step 30 are finite, the one at 30 is not (what the script did, step by step)
    assert all(v is not None and v == v for v in doc["loss"][:29])


def test_a_constant_output_script_is_one_error_exit_1(cli, monkeypatch, tmp_path):
    """watch_constant_output.py: a softmax over one unit (always 1): every gradient is exactly 0."""
    monkeypatch.chdir(tmp_path)
    r = cli("watch", "--json", "--every", "10", "--", "python", SAMPLES / "watch_constant_output.py", "--steps", "30")
    assert r.code == 1, r.stderr
    doc = r.json
    assert [f["code"] for f in doc["findings"] if f["severity"] != "info"] == ["loss-ignores-parameters"]
    assert not [f for f in doc["findings"] if f["code"] == "never-changes"]
    assert all(row["max_grad_norm"] == 0 for row in doc["layers"]) and len(doc["layers"]) == 4
    r = cli("watch", "--every", "10", "--", "python", SAMPLES / "watch_constant_output.py", "--steps", "30", "--fix")
    assert r.code == 0 and "PASS" in r.stdout, r.stdout


def test_missing_zero_grad_script_without_python_prefix(cli, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    r = cli("watch", "--every", "10", "--", SAMPLES / "watch_no_zero_grad.py", "--steps", "30")
    assert r.code == 1, r.stderr
    assert "ERROR   grad-carried-over" in r.stdout and "FAIL: grad-carried-over" in r.stdout


@pytest.mark.parametrize("command,message", [
    (["python", "no_such_train.py"], "error: watch: no_such_train.py: no such file"),
    (["ls", "-l"], "error: watch: ls: not a Python command"),
    (["python", "-c", "print(1)"], "error: watch: python -c is not supported"),
    (["python", "-m", "no_such_module_xyz"], "error: watch: no module named no_such_module_xyz"),
])
def test_bad_commands_are_one_line_exit_2_and_a_json_document(cli, monkeypatch, tmp_path, command, message):
    monkeypatch.chdir(tmp_path)
    r = cli("watch", "--", *command)
    assert r.code == 2 and r.stderr.startswith(message), r.stderr
    one_error_line(r)
    r = cli("watch", "--json", "--", *command)
    assert r.code == 2 and r.json["exit_code"] == 2 and r.json["error"]["message"].startswith(message[7:])


def test_no_optimizer_step_is_exit_2(cli, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    r = cli("watch", "--json", "--", "python", SAMPLES / "watch_no_step.py")
    assert r.code == 2, r.stderr
    assert r.json["error"]["message"].startswith("watch: no optimizer step was seen")
    one_error_line(r)


def test_an_option_is_named_as_typed(cli, healthy):
    r = cli("watch", "--every", "0", "--", "python", healthy, "--steps", "3")
    assert r.code == 2 and r.stderr.startswith("error: --every: "), r.stderr


def test_script_that_raises_exit_3_with_the_report_so_far(cli, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    r = cli("watch", "--every", "5", "--", "python", SAMPLES / "watch_raises.py", "--bad-step", "13")
    assert r.code == 3, r.stderr
    assert "12 optimizer steps" in r.stdout and "STOPPED at step 12" in r.stdout      # the partial report
    assert "error: the script failed: RuntimeError: data loader lost its shard at step 13" in r.stderr
    assert "watch_raises.py:18 in main" in r.stderr
    one_error_line(r)
    r = cli("watch", "--json", "--every", "5", "--", "python", SAMPLES / "watch_raises.py", "--bad-step", "13")
    doc = r.json
    assert r.code == 3 and doc["exit_code"] == 3 and doc["partial"]["steps"] == 12, doc
    assert doc["partial"]["exit_code"] == 3   # a review: the partial's own findings said 0, read alone a pass
    r = cli("watch", "--debug", "--every", "5", "--", "python", SAMPLES / "watch_raises.py", "--bad-step", "3")
    assert r.code == 3 and 'raise RuntimeError(f"data loader lost its shard at step {step}")' in r.stderr   # its own


TEN_STEPS = ("import sys, torch\n"
             "model = torch.nn.Linear(4, 2)\n"
             "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
             "for _ in range(10):\n"
             "    opt.zero_grad()\n"
             "    model(torch.randn(8, 4)).pow(2).mean().backward()\n"
             "    opt.step()\n")


def test_an_interrupt_the_scripts_trainer_caught_and_exited_on_is_an_interrupt(cli, tmp_path, monkeypatch):
    """A sweep: Lightning's fit catches KeyboardInterrupt, shuts down and calls sys.exit(1); under watch that was
    "the script failed: the script exited with status 1", exit 3. A plain sys.exit(1) stays a failure."""
    script = tmp_path / "train.py"
    script.write_text(TEN_STEPS + "try:\n"
                      "    raise KeyboardInterrupt\n"
                      "except KeyboardInterrupt:\n"
                      "    sys.exit(1) if 'caught' in sys.argv else sys.exit(0) if 'saved' in sys.argv else None\n"
                      "sys.exit(1)\n")
    monkeypatch.chdir(tmp_path)
    r = cli("watch", "--every", "5", "--", "python", script, "caught")
    assert r.code == 130 and "INTERRUPTED after 10 step(s)" in r.stdout, (r.code, r.stdout, r.stderr)
    r = cli("watch", "--every", "5", "--", "python", script)
    assert r.code == 3 and "the script exited with status 1" in r.stderr, (r.code, r.stderr)
    r = cli("watch", "--every", "5", "--", "python", script, "saved")   # caught, saved, exit 0: a normal end (a review)
    assert r.code == 0 and "INTERRUPTED" not in r.stdout, (r.code, r.stdout, r.stderr)


def test_sigterm_the_script_caught_is_143_and_a_report_cut_by_a_second_signal_is_built_again(cli, tmp_path,
                                                                                            monkeypatch):
    """Reviews: a script whose `except KeyboardInterrupt: save; sys.exit(0)` caught torchdiag's SIGTERM (a
    KeyboardInterrupt) passed, exit 0, where python exits 143; a second signal landing in the report's build, before
    it held signals, lost the report (exit 4)."""
    from torchdiag.diagnostics.watch import report

    script = tmp_path / "train.py"
    script.write_text(TEN_STEPS + "from torchdiag.errors import Terminated\n"
                      "try:\n"
                      "    raise Terminated() if 'term' in sys.argv else KeyboardInterrupt()\n"
                      "except KeyboardInterrupt:\n"
                      "    sys.exit(0) if 'term' in sys.argv else None\n"
                      "raise KeyboardInterrupt\n")
    monkeypatch.chdir(tmp_path)
    r = cli("watch", "--every", "5", "--", "python", script, "term")
    assert r.code == 143 and "INTERRUPTED after 10 step(s)" in r.stdout, (r.code, r.stdout, r.stderr)
    real, calls = report.build, []

    def cut_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt   # the second signal, inside the first build
        return real(*args, **kwargs)

    monkeypatch.setattr(report, "build", cut_once)
    r = cli("watch", "--every", "5", "--", "python", script)
    assert r.code == 130 and "INTERRUPTED after 10 step(s)" in r.stdout and len(calls) == 2, (r.code, r.stderr)


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_keeps_the_partial_report(healthy, tmp_path, sig, code):
    proc = spawn([sys.executable, "-m", "torchdiag", "watch", "--json", "--every", "5", "--", "python",
                  str(healthy), "--steps", "100", "--wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 text=True, env=ENV, cwd=tmp_path)
    try:
        line, deadline = "", time.monotonic() + 240
        while "READY" not in line and time.monotonic() < deadline:   # --json: the script prints on stderr
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
        assert "READY" in line, proc.stderr.read()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    doc = json.loads(out)
    assert doc["exit_code"] == code and doc["steps"] == 10 and len(doc["loss"]) == 10
    assert "Traceback" not in err


def test_plot_and_tensorboard_files(cli, healthy, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    plot, tb = tmp_path / "out" / "watch.png", tmp_path / "runs"
    (tmp_path / "out").mkdir()
    r = cli("watch", "--every", "5", "--plot", plot, "--tb", tb, "--", "python", healthy, "--steps", "15")
    assert r.code == 0, r.stderr
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"plot: {plot}" in r.stderr
    assert f"TensorBoard logs: {tb / 'watch'}" in r.stderr
    events = sorted((tb / "watch").glob("events.out.tfevents.*"))
    assert len(events) == 1, events        # the live feed only: the generic writer did not add a second file
    acc = EventAccumulator(str(events[0]), size_guidance={"scalars": 0})
    acc.Reload()
    losses = acc.Scalars("watch/loss")
    assert [e.step for e in losses] == list(range(1, 16))
    doc = cli("watch", "--json", "--every", "5", "--", "python", healthy, "--steps", "15").json
    assert [e.value for e in losses] == pytest.approx(doc["loss"], rel=1e-6)   # the same seeded run
    assert "watch/header/text_summary" in acc.Tags()["tensors"]   # written by the feed at the end


def test_plot_refused_before_the_script_runs(cli, healthy, tmp_path):
    r = cli("watch", "--plot", tmp_path / "x.txt", "--", "python", healthy, "--steps", "3")
    assert r.code == 2 and r.stderr.startswith("error: --plot"), r.stderr
    assert "SCRIPT" not in r.stdout


def test_python_api_watch_matches_the_loop():
    import torch

    import torchdiag
    from torchdiag.errors import UsageError

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    with torchdiag.watch(model, opt, every=3) as w:
        for i in range(7):
            x = torch.randn(16, 4)
            loss = (model(x) - 2 * x[:, :1]).pow(2).mean()
            losses.append(loss.item())
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i == 5:
                w.log("val_loss", 0.25)
    r = w.result()
    assert r.command == "watch" and r.data["steps"] == 7 and r.exit_code == 0
    assert r.series["loss"] == pytest.approx(losses, rel=1e-6)
    assert r.data["metrics"]["val_loss"] == [[6, 0.25]]
    # model=None: the optimizer that steps is found; no step at all is exit 2
    with torchdiag.watch() as w2:
        pass
    with pytest.raises(UsageError, match="no optimizer step was seen"):
        w2.result()
    with pytest.raises(Exception, match="every"):
        torchdiag.watch(model, every=0)


def test_python_api_watch_writes_tensorboard_live(tmp_path):
    pytest.importorskip("tensorboard")
    import torch

    import torchdiag

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdiag.watch(model, opt, every=2, logdir=tmp_path) as w:
        for _ in range(4):
            opt.zero_grad()
            model(torch.randn(4, 2)).pow(2).mean().backward()
            opt.step()
    assert w.result().data["steps"] == 4
    assert list((tmp_path / "watch").glob("events.out.tfevents.*"))


def test_watch_callback_refuses_an_unknown_kind_and_a_bad_option():
    import torchdiag
    from torchdiag.errors import OptionError, UsageError

    with pytest.raises(UsageError, match="kind must be one of hf, lightning"):
        torchdiag.watch_callback("keras")
    with pytest.raises(OptionError, match="^every"):
        torchdiag.watch_callback("lightning", every=0)   # before any trainer runs


def test_watch_callback_lightning_fit_with_tensorboard(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    pytest.importorskip("tensorboard")
    import torch
    import torch.nn.functional as F

    import torchdiag

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 2)

        def training_step(self, batch, _):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    x = torch.randn(96, 4)
    data = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
    cb = torchdiag.watch_callback("lightning", every=4, logdir=tmp_path / "tb")
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[cb],
                         default_root_dir=str(tmp_path))
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=16))
    r = cb.result
    assert r.command == "watch" and r.data["steps"] == 12 and r.data["epoch"] == 1   # 96/16 = 6 steps per epoch
    assert len(r.series["loss"]) == 12 and r.exit_code == 0
    assert list((tmp_path / "tb" / "watch").glob("events.out.tfevents.*"))


def test_options_end_at_the_command_without_dashes(cli, healthy, tmp_path, monkeypatch):
    """`torchdiag watch --every 4 python train.py --every 3`: the second --every is the script's."""
    monkeypatch.chdir(tmp_path)
    r = cli("watch", "--json", "--every", "4", "python", healthy, "--steps", "8", "--every", "3")
    assert r.code == 0, r.stderr
    assert r.json["every"] == 4 and r.json["reads"] == 3
    assert "SCRIPT ['--steps', '8', '--every', '3'] __main__" in r.stderr + r.stdout


@pytest.mark.slow
@pytest.mark.distributed
def test_under_torchrun_rank_0_reports_a_bug_that_only_rank_1_has(tmp_path):
    path = SAMPLES / "watch_ddp_rank1.py"     # rank 1's optimizer lacks the head (2.*); rank 0 is healthy
    r = torchrun_args("-m", "torchdiag", "watch", "--json", "--every", "10", "--", "python", path, env=ENV, cwd=tmp_path)
    assert r.returncode == 0, r.stderr       # warnings only
    doc = json.loads(r.stdout)              # one document, rank 0's, with every rank's record; each ran the script
    assert "RANK 0 done" in r.stderr and "RANK 1 done" in r.stderr
    assert [rk["rank"] for rk in doc["ranks"]] == [0, 1] and doc["torchrun"].startswith("2 ranks")
    assert doc["steps"] == doc["ranks"][0]["data"]["steps"] == doc["ranks"][1]["data"]["steps"] == 30
    assert not [f for f in doc["ranks"][0]["findings"] if f["severity"] in ("warning", "error")]   # rank 0 is healthy
    found = {n: f for f in doc["findings"] if f["code"] == "not-in-optimizer" for n in f.get("members") or [f["where"]]}
    assert set(found) == {"2.weight", "2.bias"}   # the user's names, found on rank 1 and reported by rank 0
    for f in found.values():
        assert f["ranks"] == [1] and f["message"].startswith("[rank 1] ")


DDP_MICRO = textwrap.dedent("""
    import contextlib, sys, torch, torch.nn.functional as F, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo"); rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    params = list(model.parameters())
    acc = [torch.zeros_like(p) for p in params]
    for i in range(80):                      # 4 micro-batches a step, the first 3 under no_sync
        last = (i + 1) % 4 == 0
        if sys.argv[1] == "inside":
            opt.zero_grad()                  # the bug: the earlier micro-batches' gradients are lost
        x = torch.randn(16, 8, generator=g)
        with (contextlib.nullcontext() if last or sys.argv[1] == "buffers" else model.no_sync()):
            (F.cross_entropy(model(x), (x[:, 0] > 0).long()) / 4).backward()
        if sys.argv[1] == "buffers":         # healthy: each micro-batch's reduced gradient summed by hand
            for a, p in zip(acc, params):
                a += p.grad
                p.grad = None
        if last:
            if sys.argv[1] == "buffers":
                for a, p in zip(acc, params):
                    p.grad = a.clone()
                    a.zero_()
            opt.step()
            if sys.argv[1] != "inside":
                opt.zero_grad()
    dist.destroy_process_group()
""")


@pytest.mark.slow
@pytest.mark.distributed
def test_under_torchrun_zero_grad_inside_ddps_no_sync_loop_is_seen_on_every_rank(tmp_path):
    """A sweep: zero_grad() inside the micro-batch loop under DDP on 2 ranks went unseen, though one process saw it:
    the step applies the ranks' mean, never this rank's own gradient, which read as a gradient the loop wrote."""
    path = tmp_path / "micro.py"
    path.write_text(DDP_MICRO)
    # (a review: micro-batches summed into buffers and written back, healthy, were said cleared on both ranks)
    for how, found in (("inside", True), ("after", False), ("buffers", False)):
        r = torchrun_args("-m", "torchdiag", "watch", "--json", "--every", "5", "--", "python", path, how, env=ENV,
                          cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        doc = json.loads(r.stdout)
        cleared = [f for f in doc["findings"] if f["code"] == "grad-cleared-before-step"]
        assert bool(cleared) == found, doc["findings"]
        if found:
            assert cleared[0]["ranks"] == [0, 1], cleared
        assert not [f for f in doc["findings"] if f["severity"] in ("warning", "error")
                    and f["code"] != "grad-cleared-before-step"], doc["findings"]


RANKS_HANG = textwrap.dedent("""
    import os, pathlib, sys, torch, torch.distributed as dist
    dist.init_process_group("gloo"); rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(12):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    pathlib.Path(f"{sys.argv[1]}.rank{rank}.pid").write_text(str(os.getpid()))
    dist.recv(torch.zeros(1), src=1 - rank)   # both wait for the other to send: blocked in native code for good
""")


@pytest.mark.slow
@pytest.mark.distributed
def test_under_torchrun_sigterm_while_every_rank_is_blocked_keeps_rank_0s_report(tmp_path):
    """A sweep: a ZeRO run where one rank skipped a step hung; SIGTERM (a CI timeout) under watch printed nothing, and
    torchrun killed both ranks 30 s later (without torchdiag they died at once). Each rank's main thread waits in a
    collective, where Python's handler never runs: isolation.stuck_exit's thread prints rank 0's report so far."""
    from support import ENDS_WITHIN, HANG_GUARD

    path, marker = tmp_path / "hang.py", tmp_path / "m"
    path.write_text(RANKS_HANG)
    proc = spawn([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
                  "torchdiag", "watch", "--json", "--every", "5", "--", "python", str(path), str(marker)],
                 cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                 start_new_session=True)
    try:
        guard = time.monotonic() + HANG_GUARD
        while not all(pathlib.Path(f"{marker}.rank{r}.pid").exists() for r in (0, 1)) and proc.poll() is None \
                and time.monotonic() < guard:
            time.sleep(0.05)
        time.sleep(1.0)   # into the recv
        proc.send_signal(signal.SIGTERM)   # torchrun alone, as a scheduler does: it forwards it to the ranks
        out, err = proc.communicate(timeout=ENDS_WITHIN)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert "Unable to shutdown process" not in err, err   # no rank left for torchrun's SIGKILL
    doc = json.loads(out)   # rank 0's report so far, one document
    assert doc["exit_code"] == 143 and doc["steps"] == 12, doc.get("error")
    assert any("could not be gathered" in n for n in doc["notes"]), doc["notes"]


RANK1_RAISES = textwrap.dedent("""
    import os, torch
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 9):
        if rank == 1 and step == 6:
            raise RuntimeError("rank 1 lost its shard")
        loss = model(torch.randn(4, 3)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
""")


@pytest.mark.slow
@pytest.mark.distributed
def test_under_torchrun_a_rank_whose_script_fails_hands_in_its_partial_report(tmp_path):
    path = tmp_path / "rank1_raises.py"
    path.write_text(RANK1_RAISES)
    r = torchrun_args("-m", "torchdiag", "watch", "--json", "--every", "2", "--", "python", path, env=ENV, cwd=tmp_path)
    # rank 0 exits 3, the worst over ranks (rank 1 exits 0 once handed in, so torchrun lets rank 0 report);
    # torchrun itself says 1 for any failed rank and names rank 0 as the one
    assert r.returncode == 1 and "rank      : 0" in r.stderr and "exitcode  : 3" in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    ranks = {rk["rank"]: rk for rk in doc["ranks"]}
    assert ranks[0]["exit_code"] == 0 and ranks[0]["data"]["steps"] == 8
    assert ranks[1]["exit_code"] == 3 and ranks[1]["data"]["steps"] == 5     # its report up to the failure
    assert "rank 1 lost its shard" in ranks[1]["error"]["message"]
    failed = [f for f in doc["findings"] if f["code"] == "rank-failed"]
    assert len(failed) == 1 and failed[0]["ranks"] == [1] and "rank 1 lost its shard" in failed[0]["message"]


def test_without_torchruns_shared_store_each_rank_keeps_its_own_report(monkeypatch):
    """No shared rendezvous store (TORCHELASTIC_USE_AGENT_STORE unset): nothing to gather over, so rank 0
    reports its own run with a note, and another rank keeps its own exit code (its failure is not lost)."""
    from torchdiag.core.distributed import Ranks
    from torchdiag.errors import ModelError
    from torchdiag.results import Result
    from torchdiag.runner.scripts import run_on_ranks

    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    own = Result("watch")
    own.add("not-in-optimizer", "warning", "head.weight", "head.weight gets a gradient but is in no optimizer")
    got = run_on_ranks(Ranks(0, 2, 0), lambda: own)
    assert got is own and [f.where for f in got.findings] == ["head.weight"]
    assert any("could not be gathered" in n and "rank 0's alone" in n for n in got.notes)
    partial = Result("watch")

    def fails():
        raise ModelError("the script failed: RuntimeError: boom", partial=partial)

    with pytest.raises(ModelError) as info:
        run_on_ranks(Ranks(1, 2, 1), fails)
    assert info.value.partial is partial


SAVES = textwrap.dedent("""
    import copy
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    best = None
    for i in range(12):
        x = torch.randn(8, 3)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        best = copy.deepcopy(model)
    torch.save(model, "model.pt")
    torch.save({"best": best, "step": i}, "best.pt")
    torch.jit.script(model).save("scripted.pt")
""")
# loads them where torchdiag cannot be imported, as a server that serves the model would
LOADS = textwrap.dedent("""
    import sys
    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "torchdiag":
                raise ImportError(name)
    sys.meta_path.insert(0, Refuse())
    import torch
    x = torch.randn(2, 3)
    for m in (torch.load("model.pt", weights_only=False), torch.load("best.pt", weights_only=False)["best"],
              torch.jit.load("scripted.pt")):
        m(x)
        assert not m._forward_hooks and not m._forward_pre_hooks, m._forward_hooks
    print("LOADED")
""")


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_script_that_saves_and_scripts_its_model_runs_as_unwatched(tmp_path):
    """Under watch, `torch.save(model)` wrote a file that referred to torchdiag (it loaded only where torchdiag
    imports) and `torch.jit.script(model)` raised on the watch's hooks: the same script ran unwatched. Saved, copied
    and scripted models now come without them."""
    (tmp_path / "train.py").write_text(SAVES)
    (tmp_path / "serve.py").write_text(LOADS)
    r = _torchdiag("--every", "5", "--", "python", "train.py", cwd=tmp_path)
    assert r.returncode == 0 and "12 optimizer steps" in r.stdout, r.stdout + r.stderr
    served = subprocess.run([sys.executable, "serve.py"], capture_output=True, text=True, cwd=tmp_path,
                            env={**ENV, "PYTHONPATH": ""}, timeout=300)
    assert served.returncode == 0 and "LOADED" in served.stdout, served.stderr


def test_a_failure_of_watchs_own_report_is_an_internal_error_naming_it(cli, tmp_path, monkeypatch):
    """A bench run met a report build that raised (code loaded in two versions): the script's success was then read as
    its failure and `watch._result` None ended in "AttributeError: 'NoneType' object has no attribute 'verdict'". The
    error is ours (exit 4), named as what it is."""
    from torchdiag.diagnostics.watch import report

    def broken(*args, **kwargs):
        raise KeyError("the report's own failure")

    monkeypatch.setattr(report, "build", broken)
    script = tmp_path / "train.py"
    script.write_text("import torch\nm = torch.nn.Linear(2, 1)\no = torch.optim.SGD(m.parameters(), 0.1)\n"
                      "for _ in range(3):\n    o.zero_grad()\n    m(torch.randn(4, 2)).sum().backward()\n    o.step()\n")
    r = cli("watch", "--", "python", script)
    assert r.code == 4 and "KeyError" in r.stderr and "the report's own failure" in r.stderr, r.stderr
    assert "NoneType" not in r.stderr


INLINE_LIGHTNING = """
import torch, torch.nn as nn, torch.nn.functional as F
import lightning.pytorch as pl

class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 2)

    def training_step(self, batch, _):
        x, y = batch
        return F.cross_entropy(self.head(self.body(x)), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

torch.manual_seed(0)
x = torch.randn(64, 8)
train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long()), batch_size=16)
pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
           enable_model_summary=False).fit(Module(), train)
"""


def test_a_lightning_module_made_inline_names_its_parts_by_their_attributes(cli, tmp_path, monkeypatch):
    """A sweep: `trainer.fit(M(), ...)` under `torchdiag watch`, its training_step calling self.body and self.head:
    by the first optimizer step only Lightning's frames held the module, and the rows read `Sequential#0.0.weight`."""
    pytest.importorskip("lightning.pytorch")
    (tmp_path / "fit_inline.py").write_text(INLINE_LIGHTNING)
    monkeypatch.chdir(tmp_path)
    r = cli("watch", "--json", "--every", "2", "--", "python", "fit_inline.py")
    assert r.code == 0, r.stderr
    names = {row["name"] for row in r.json["layers"]}
    assert names == {"body.0.weight", "body.0.bias", "head.weight", "head.bias"}, names
