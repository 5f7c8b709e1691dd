"""Ctrl-C/SIGTERM held over bookkeeping an interrupt must not split (core/interrupts.py), and
profile stopping its profiler cleanly whatever moment the interrupt lands on."""
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import torchdiag
from torchdiag.core.interrupts import deferred

from support import ROOT, spawn


@pytest.fixture
def own_handlers():
    """Python handlers for SIGINT and SIGTERM that raise, whatever the test runner inherited."""
    class Caught(BaseException):
        pass

    def raiser(signum, frame):
        raise Caught(signum)

    saved = {s: signal.signal(s, raiser) for s in (signal.SIGINT, signal.SIGTERM)}
    yield Caught
    for s, h in saved.items():
        signal.signal(s, h)


def test_a_signal_inside_is_raised_after_the_block_and_the_handlers_are_back(own_handlers):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    ran = []
    with pytest.raises(own_handlers) as caught:
        with deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            ran.append("after the kill")
            os.kill(os.getpid(), signal.SIGINT)
            ran.append("after the second")
    assert ran == ["after the kill", "after the second"]
    assert caught.value.args == (signal.SIGTERM,)   # the first one held
    assert {s: signal.getsignal(s) for s in before} == before


def test_nothing_held_raises_nothing_and_an_error_inside_passes_through(own_handlers):
    with deferred():
        pass
    with pytest.raises(ValueError):
        with deferred():
            raise ValueError("the block's own")
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN


def test_an_ignored_signal_stays_ignored(own_handlers):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with deferred():
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_off_the_main_thread_the_block_just_runs():
    out = []

    def body():
        with deferred():
            out.append(signal.getsignal(signal.SIGINT))

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert len(out) == 1


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()))


def test_an_interrupt_inside_the_profilers_step_waits_for_it_and_the_profiler_stops(own_handlers, monkeypatch):
    """torch's step() closes one ProfilerStep range and opens the next in separate statements; an
    interrupt between them made stop() fail ('Expected record to be set') and the process segfault."""
    from torch.profiler import profile

    real_step, finished = profile.step, []

    def step(self):
        if self.step_num == 1:
            os.kill(os.getpid(), signal.SIGINT)   # lands inside step(), as a Ctrl-C can
        real_step(self)
        finished.append(self.step_num)

    monkeypatch.setattr(profile, "step", step)
    with pytest.raises(own_handlers):
        torchdiag.profile(_model(), torch.randn(2, 8), mode="train", wait=0, warmup=1, active=5)
    assert finished == [1, 2]   # the step the signal landed in ran to its end, then the interrupt
    assert not torch._C._autograd._profiler_enabled()


def test_an_interrupt_in_the_forward_closes_the_module_ranges_before_the_profiler_stops(own_handlers, capfd):
    class Stops(torch.nn.Module):
        calls = 0

        def forward(self, x):
            Stops.calls += 1
            if Stops.calls == 3:
                os.kill(os.getpid(), signal.SIGTERM)
            return x

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Sequential(Stops(), torch.nn.ReLU()))
    with pytest.raises(own_handlers):
        torchdiag.profile(model, torch.randn(2, 8), wait=0, warmup=1, active=5)
    assert not torch._C._autograd._profiler_enabled()
    with torch.profiler.profile() as prof:   # a profiler after it starts and records cleanly
        torch.randn(3).sum()
    assert any(e.name == "aten::sum" for e in prof.events())
    err = capfd.readouterr().err
    assert "module::" not in err and "disableProfiler" not in err, err


# ---- the CLI process: an interrupt at any moment ends in one honest exit code and one document ----------------

TRIGGER = """
import os, signal, sys
class _Trigger:
    fired = False
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["TRIGGER"] and not _Trigger.fired:
            _Trigger.fired = True
            os.kill(os.getpid(), getattr(signal, os.environ["TRIGSIG"]))
        return None
sys.meta_path.insert(0, _Trigger())
"""

# (module whose first import the signal lands in, what it interrupts)
MOMENTS = {
    "numpy": "inside `import torch` (torch imports numpy from C, and took a failure there for no numpy)",
    "torch.utils.tensorboard.writer": "the --tb writer's first import",
    "torchdiag.cli.nancheck": "options being parsed (typer made any interrupt there a silent 130)",
    "torchdiag.render.jsondoc": "the finished result being printed",
}


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("module", list(MOMENTS))
def test_an_interrupt_at_each_moment_of_a_run_ends_in_one_code_and_one_document(tmp_path, module, sig):
    """A reviewer's trigger that signals the process when a module is first imported: before, a SIGTERM
    inside torch's import aborted the process (134, no JSON) once the error path imported tensorboard;
    inside numpy's it was swallowed (exit 0) or blamed on the model; while options were parsed it was a
    silent 130; after the result, a kill while the document was printed."""
    (tmp_path / "sitecustomize.py").write_text(TRIGGER)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "TRIGGER": module, "TRIGSIG": sig}
    proc = spawn([sys.executable, "-m", "torchdiag", "nancheck", str(Path(ROOT) / "sample_models" / "mlp.py") + ":build",
                  "--device", "cpu", "--json", "--tb", str(tmp_path / "tb")],
                 cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=300)
    late = module == "torchdiag.render.jsondoc"
    want = 0 if late else {"SIGTERM": 143, "SIGINT": 130}[sig]
    assert proc.returncode == want, (MOMENTS[module], err)
    assert "Traceback" not in err and "Fatal" not in err, err
    assert json.loads(out)["exit_code"] == want   # one whole document, stating the process's code
    if not late:
        assert err.count("error: ") == 1 and ("terminated" if sig == "SIGTERM" else "interrupted") in err


def test_finishing_lets_the_document_end_then_exits_with_its_code(own_handlers, monkeypatch):
    from torchdiag.runner import isolation

    exits = []
    monkeypatch.setattr(isolation, "_REAL_EXIT", exits.append)
    f = isolation.Finishing(1)
    os.kill(os.getpid(), signal.SIGTERM)    # while printing: held, a grace timer started
    assert exits == []
    f.printed(1)
    assert exits == [1]                     # then the outcome's code, not 143
    f = isolation.Finishing(0)
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)     # a second one while printing: at once
    assert exits == [1, 130]
    f.printed(0)
    os.kill(os.getpid(), signal.SIGTERM)    # after printing: the outcome's code at once
    assert exits[-1] == 0


def test_finishing_ends_a_print_that_does_not_end_after_the_grace(own_handlers, monkeypatch):
    """A stdout nobody reads blocks the write for good: the held signal must still end the process."""
    import threading

    from torchdiag.runner import isolation

    ended = threading.Event()
    monkeypatch.setattr(isolation, "GRACE_S", 0.05)
    monkeypatch.setattr(isolation, "_REAL_EXIT", lambda code: ended.set() or exits.append(code))
    exits: list = []
    isolation.Finishing(0)
    os.kill(os.getpid(), signal.SIGTERM)
    assert ended.wait(60) and exits == [143]   # from the timer: the print never said it ended


def test_write_whole_writes_every_byte_through_short_writes(monkeypatch):
    """An unbuffered stdout over a pipe returns short counts when a signal interrupts a write; the text
    layer dropped the rest silently (a review: exit 0 with the JSON cut at 64 KiB)."""
    import io

    from torchdiag.render.jsondoc import write_whole

    class Short(io.RawIOBase):   # writes at most 7 bytes per call, as an interrupted pipe write can
        def __init__(self):
            self.data = bytearray()

        def writable(self):
            return True

        def write(self, b):
            self.data += bytes(b[:7])
            return min(7, len(b))

    raw = Short()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="utf-8", write_through=True))
    text = json.dumps({"exit_code": 0, "rows": ["é" * 50] * 40}) + "\n"
    write_whole(text)
    assert raw.data.decode("utf-8") == text


def test_an_ignored_sigterm_stays_ignored_from_main_on(own_handlers):
    from torchdiag.runner.isolation import sigterm_as_interrupt, sigterm_raises

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sigterm_raises()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    with sigterm_as_interrupt():
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


def _stuck_run(monkeypatch, fork_child: bool):
    """stuck_exit around a main thread that sleeps (as a rank blocked in a collective): what on_stuck was called
    with, and the code it exited with (os._exit recorded, not taken)."""
    import os
    import signal
    import threading
    import time

    from torchdiag.runner import isolation

    monkeypatch.setattr(isolation, "STUCK_S", 0.3)
    ended: list = []
    monkeypatch.setattr(isolation, "_REAL_EXIT", ended.append)
    called: list = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)   # a Python handler, as under torchdiag
    try:
        def child_signalled():   # a Pool worker terminated: its signal is its own (a review)
            pid = os.fork()
            if pid == 0:
                os.kill(os.getpid(), signal.SIGTERM)
                os._exit(0)
            os.waitpid(pid, 0)

        with isolation.stuck_exit(lambda signum: called.append(signum) or 143):
            threading.Timer(0.05, child_signalled if fork_child else os.kill,
                            () if fork_child else (os.getpid(), signal.SIGTERM)).start()
            time.sleep(1.5)   # the same frame throughout: blocked, to the watcher
    finally:
        signal.signal(signal.SIGTERM, previous)
    return called, ended


def test_a_rank_blocked_when_signalled_is_ended_by_the_watcher(monkeypatch):
    called, ended = _stuck_run(monkeypatch, fork_child=False)
    assert called == [15] and ended == [143]


def test_a_forked_childs_signal_is_not_the_parents(monkeypatch):
    """A review: a multiprocessing Pool's SIGTERM to its idle workers reached the parent's wakeup pipe, and a
    healthy torchrun run reported "terminated (SIGTERM)" 5 s later."""
    called, ended = _stuck_run(monkeypatch, fork_child=True)
    assert called == [] and ended == []
