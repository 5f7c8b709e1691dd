"""render/output.py: a write never destroys what was at the path (issue 15: full disk, devices,
symlinks, read-only folders), and every failure is one line, exit 2."""
import contextlib
import errno
import os
import stat
import subprocess
import sys
import threading

import pytest

from torchdiag.errors import ExitCode, UsageError
from torchdiag.render import output
from torchdiag.render.output import atomic_path, atomic_write, check_dir, check_file

from support import sample

HANG_GUARD = 600  # seconds: only stops a hung test (a FIFO reader that never gets its data)

CONFIG = """
[tool.torchdiag]
model = "{model}"
inputs = ["8x3x32x32"]
device = "cpu"
[tool.torchdiag.check]
max-params = 30000
nancheck = false
gradflow = false
overfit-batch = false
"""


def _one_error_line(r):
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or p.name.endswith(".tmp"))


@contextlib.contextmanager
def tiny_tmpfs(path, size="64k"):
    """A tmpfs of `size` at `path`, or skip the test where mounting is not permitted."""
    path.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)
    except OSError:
        pytest.skip("no mount command")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def enospc(monkeypatch):
    """Every os.write in render/output.py fails as on a full disk (always runs, no rights needed)."""
    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(output.os, "write", full)


def test_existing_file_is_replaced_atomically(tmp_path):
    target = tmp_path / "report.xml"
    target.write_text("old")
    os.chmod(target, 0o640)
    inode = target.stat().st_ino
    assert atomic_write(target, "new", "--junit") == target
    assert target.read_text() == "new"
    assert target.stat().st_ino != inode                      # a new file renamed over the old one
    assert stat.S_IMODE(target.stat().st_mode) == 0o640        # its permissions kept
    assert _leftovers(tmp_path) == []
    atomic_write(tmp_path / "sub" / "new.png", b"\x89PNG", "--images")   # missing folders are created
    assert (tmp_path / "sub" / "new.png").read_bytes() == b"\x89PNG"


def test_symlink_is_followed_and_stays_a_link(tmp_path):
    real = tmp_path / "real.png"
    real.write_bytes(b"old")
    link = tmp_path / "link.png"
    link.symlink_to(real)
    atomic_write(link, b"new", "--out")
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_bytes() == b"new"
    with atomic_path(link, "--out") as tmp:
        with open(tmp, "wb") as f:
            f.write(b"newer")
    assert link.is_symlink() and real.read_bytes() == b"newer"
    assert _leftovers(tmp_path) == []


def test_fifo_is_written_in_place_not_replaced(tmp_path):
    """A FIFO stands for every non-regular target (/dev/null, /dev/full, a pipe): it is opened and
    written, never replaced by a regular file. (No real device is ever written by this test.)"""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    atomic_write(fifo, b"through the pipe", "--out")
    reader.join(timeout=HANG_GUARD)
    assert got == [b"through the pipe"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    with atomic_path(fifo, "--trace") as tmp:
        with open(tmp, "wb") as f:
            f.write(b"from a library")
    reader.join(timeout=HANG_GUARD)
    assert got[1] == b"from a library" and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert _leftovers(tmp_path) == []
    assert output._kind(output._target("/dev/null", "--out")) == "special"    # what /dev/null and /dev/full take


def test_directory_target_is_refused(tmp_path):
    (tmp_path / "adir").mkdir()
    for write in (lambda: atomic_write(tmp_path / "adir", b"x", "--out"),
                  lambda: atomic_path(tmp_path / "adir", "--out").__enter__(),
                  lambda: check_file(tmp_path / "adir", "--out")):
        with pytest.raises(UsageError, match=r"--out .*adir: is a directory") as e:
            write()
        assert e.value.code == ExitCode.USAGE
    assert (tmp_path / "adir").is_dir() and list((tmp_path / "adir").iterdir()) == []


def test_simulated_full_disk_keeps_the_old_file(tmp_path, enospc):
    target = tmp_path / "report.xml"
    target.write_bytes(b"<old report/>")
    with pytest.raises(UsageError) as e:
        atomic_write(target, b"<new report/>" * 1000, "--junit")
    assert e.value.message == f"no space left on device writing {target}" and e.value.code == ExitCode.USAGE
    assert target.read_bytes() == b"<old report/>"
    assert _leftovers(tmp_path) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["report.xml"]
    with pytest.raises(UsageError, match="no space left on device writing"):
        atomic_write(tmp_path / "new.png", b"png", "--out")
    assert not (tmp_path / "new.png").exists() and _leftovers(tmp_path) == []   # no 0-byte file


def test_atomic_path_failure_leaves_nothing(tmp_path):
    target = tmp_path / "trace.json"
    target.write_text("old")
    with pytest.raises(UsageError, match=f"no space left on device writing {target}"):
        with atomic_path(target, "--trace") as tmp:
            assert tmp.endswith(".json") and os.path.dirname(tmp) == str(tmp_path)   # same folder, same suffix
            open(tmp, "w").write("partial")
            raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(RuntimeError):   # a library's own bug is not hidden, but leaves nothing either
        with atomic_path(target, "--trace") as tmp:
            raise RuntimeError("boom")
    assert target.read_text() == "old" and _leftovers(tmp_path) == []


@pytest.mark.slow
@pytest.mark.subprocess
def test_real_full_disk_on_a_tiny_tmpfs(tmp_path):
    with tiny_tmpfs(tmp_path / "disk") as disk:
        target = disk / "report.xml"
        target.write_bytes(b"<old/>")
        with pytest.raises(UsageError) as e:
            atomic_write(target, os.urandom(256 * 1024), "--junit")
        assert e.value.message == f"no space left on device writing {target}"
        assert target.read_bytes() == b"<old/>" and sorted(p.name for p in disk.iterdir()) == ["report.xml"]


@pytest.mark.slow
@pytest.mark.subprocess
def test_read_only_folder(tmp_path):
    if os.geteuid() == 0:   # root ignores permission bits: a read-only mount is the same failure
        with tiny_tmpfs(tmp_path / "ro") as folder:
            (folder / "old.png").write_bytes(b"old")
            done = subprocess.run(["mount", "-o", "remount,ro", str(folder)], capture_output=True)
            if done.returncode != 0:
                pytest.skip("cannot remount read-only")
            _assert_read_only(folder)
    else:
        folder = tmp_path / "ro"
        folder.mkdir()
        (folder / "old.png").write_bytes(b"old")
        folder.chmod(0o555)
        try:
            _assert_read_only(folder)
        finally:
            folder.chmod(0o755)


def _assert_read_only(folder):
    with pytest.raises(UsageError, match="not writable") as e:
        atomic_write(folder / "old.png", b"new", "--images")
    assert e.value.code == ExitCode.USAGE and (folder / "old.png").read_bytes() == b"old"
    with pytest.raises(UsageError, match="not writable"):
        check_file(folder / "old.png", "--out")
    with pytest.raises(UsageError, match="not writable"):
        check_dir(folder / "sub", "--images")


def test_check_junit_on_a_full_disk_is_exit_2_and_keeps_the_old_report(cli, tmp_path, monkeypatch, enospc):
    (tmp_path / "pyproject.toml").write_text(CONFIG.format(model=sample("cnn.py:build")))
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "r.xml"
    report.write_bytes(b"<old report/>")
    r = cli("check", "--junit", report)
    assert r.code == 2, r.stderr
    _one_error_line(r)
    assert r.stderr.startswith(f"error: no space left on device writing {report}\n"), r.stderr
    assert report.read_bytes() == b"<old report/>" and _leftovers(tmp_path) == []


def test_picture_options_on_a_full_disk_are_exit_2(cli, tmp_path, enospc):
    import numpy as np
    from PIL import Image

    image = tmp_path / "img.png"
    Image.fromarray(np.full((32, 32, 3), 200, dtype=np.uint8)).save(image)
    out = tmp_path / "cam.png"
    out.write_bytes(b"old picture")
    r = cli("gradcam", sample("gradcam_region.py:build"), "--layer", "features.3", "--image", image, "--out", out,
            "--json")
    assert r.code == 2, r.stderr
    _one_error_line(r)
    assert r.stderr.startswith(f"error: no space left on device writing {out}\n"), r.stderr
    assert out.read_bytes() == b"old picture" and _leftovers(tmp_path) == []
    assert r.json["exit_code"] == 2                          # one JSON document: the error, not the result
    r = cli("activations", sample("cnn.py:build"), "--layer", "features.0", "--images", tmp_path / "act")
    assert r.code == 2 and "no space left on device writing" in r.stderr
    _one_error_line(r)
    assert list((tmp_path / "act").iterdir()) == []


@pytest.mark.slow
@pytest.mark.subprocess
def test_tensorboard_on_a_full_or_read_only_disk_is_one_line(cli, tmp_path):
    with tiny_tmpfs(tmp_path / "disk", "16k") as disk:
        r = cli("activations", sample("cnn.py:build"), "--tb", disk)
        assert r.code == 2, r.stderr
        _one_error_line(r)
        assert r.stderr.startswith(f"error: no space left on device writing {disk / 'activations'}"), r.stderr
        assert [p.stat().st_size for p in (disk / "activations").iterdir()] == []   # no partial event file
    with tiny_tmpfs(tmp_path / "full", "16k") as disk:   # full before the writer's first record (a review)
        (disk / "tb").mkdir()
        with contextlib.suppress(OSError), open(disk / "fill", "wb") as fill:
            fill.write(b"\0" * 64 * 1024)
        r = subprocess.run([sys.executable, "-m", "torchdiag", "summary", sample("mlp.py:build"), "--tb", disk / "tb"],
                           capture_output=True, text=True, timeout=HANG_GUARD)
        assert r.returncode == 2 and "Traceback" not in r.stderr and "Exception in thread" not in r.stderr, r.stderr
        assert r.stderr.startswith(f"error: no space left on device writing {disk / 'tb' / 'summary'}"), r.stderr
        assert list((disk / "tb" / "summary").iterdir()) == []     # its 0-byte event file is gone
    if os.geteuid() == 0:
        with tiny_tmpfs(tmp_path / "ro") as folder:
            (folder / "summary").mkdir()
            if subprocess.run(["mount", "-o", "remount,ro", str(folder)], capture_output=True).returncode:
                pytest.skip("cannot remount read-only")
            r = cli("summary", sample("cnn.py:build"), "--tb", folder)
            assert r.code == 2 and "not writable" in r.stderr, r.stderr
            _one_error_line(r)


FILE_OPTIONS = {   # command line (the file last) of each option that writes one file
    "--plot gradflow": ["gradflow", sample("mlp.py:build"), "--device", "cpu", "--plot"],
    "--plot overfit-batch": ["overfit-batch", sample("mlp.py:build"), "--device", "cpu", "--steps", "3", "--plot"],
    "--trace": ["profile", sample("mlp.py:build"), "--device", "cpu", "--active", "1", "--trace"],
}


@pytest.fixture
def full_disk(monkeypatch, enospc):
    """As `enospc`, and a library writing a temporary path itself (savefig) learns it at fsync."""
    def full(name):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(output, "_fsync_file", full)


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("way", ["simulated", "tmpfs"])
@pytest.mark.parametrize("what", list(FILE_OPTIONS))
def test_plot_and_trace_on_a_full_disk_keep_the_old_file(cli, tmp_path, request, what, way):
    """Issue 15 cases 2 and 9: ENOSPC on --plot/--trace is one line, exit 2; the old file stays, no .tmp."""
    suffix = ".json" if what == "--trace" else ".png"
    if way == "simulated":
        request.getfixturevalue("full_disk")
        folder = tmp_path
        stack = contextlib.nullcontext()
    else:
        stack = tiny_tmpfs(tmp_path / "disk", "8k")   # two pages: the old file and less than any new one
        folder = tmp_path / "disk"
    with stack:
        target = folder / f"old{suffix}"
        target.write_bytes(b"old")
        r = cli(*FILE_OPTIONS[what], target, "--json")
        assert r.code == 2, r.stderr
        _one_error_line(r)
        assert r.stderr.startswith(f"error: no space left on device writing {target}\n"), r.stderr
        assert r.json["exit_code"] == 2
        assert target.read_bytes() == b"old" and _leftovers(folder) == []


def test_snapshot_on_a_full_disk_keeps_the_old_file(tmp_path, enospc):
    """--snapshot needs CUDA to record; its writer is tested directly (the same atomic_write)."""
    from torchdiag.render.memory import write_snapshot
    from torchdiag.results import Result

    target = tmp_path / "s.pickle"
    target.write_bytes(b"old")
    result = Result("memory")
    result.artefacts["snapshot"] = b"new" * 1000
    with pytest.raises(UsageError, match=f"no space left on device writing {target}"):
        write_snapshot(result, target)
    assert target.read_bytes() == b"old" and _leftovers(tmp_path) == []


def test_an_interrupt_during_the_write_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM (a KeyboardInterrupt) at any point up to the rename: the old file stays, no .tmp."""
    target = tmp_path / "plot.png"
    target.write_bytes(b"old")

    def interrupted(*args):
        raise KeyboardInterrupt

    for where in ("write", "replace"):
        with monkeypatch.context() as m:
            m.setattr(output.os, where, interrupted)
            with pytest.raises(KeyboardInterrupt):
                atomic_write(target, b"new", "--plot")
            with pytest.raises(KeyboardInterrupt):
                with atomic_path(target, "--plot") as tmp:
                    open(tmp, "wb").write(b"new")
                    if where == "write":
                        raise KeyboardInterrupt
        assert target.read_bytes() == b"old" and _leftovers(tmp_path) == [], where


def test_a_fifo_nothing_reads_yet_is_waited_for_and_said(tmp_path, monkeypatch):
    """A review: `--plot fifo.png` with no reader blocked in open() and the run's report never came, with no word.
    The wait is a shell redirection's, but said first; the reader here starts only once the line is out."""
    import io
    import sys

    fifo = tmp_path / "later"
    os.mkfifo(fifo)
    said = threading.Event()

    class Err(io.StringIO):
        def write(self, text):
            n = super().write(text)
            if "waiting for a reader" in text:
                said.set()
            return n

    err = Err()
    monkeypatch.setattr(sys, "stderr", err)
    got = []

    def reader():
        said.wait(timeout=HANG_GUARD)   # bounds only a failing run (no line): the write must not hang the suite
        with open(fifo, "rb") as f:
            got.append(f.read())

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    atomic_write(fifo, b"after the wait", "--plot")
    t.join(timeout=HANG_GUARD)
    assert got == [b"after the wait"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert f"--plot {fifo}: a FIFO that nothing reads yet; waiting for a reader" in err.getvalue()


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
@pytest.mark.parametrize("args", [["summary", sample("mlp.py:build"), "--json"],
                                  ["summary", sample("mlp.py:build")],
                                  ["summary", sample("mlp.py:nope"), "--json"]])
def test_stdout_on_a_full_disk_is_a_file_error_not_a_traceback(args):
    """A review: `--json > /dev/full` exited 1 (a check failed) with a 55-line traceback."""
    import sys

    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "torchdiag", *args], stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=HANG_GUARD, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == ExitCode.USAGE and "Traceback" not in r.stderr, r.stderr
    assert "error: could not write the output to stdout: No space left on device" in r.stderr
    # a failure before the output keeps its own line first
    assert ("has no factory named 'nope'" in r.stderr.splitlines()[0]) == ("mlp.py:nope" in args[1])


@pytest.mark.parametrize("args", [["check", "--junit"],
                                  ["overfit-batch", sample("mlp.py:build"), "--steps", "2", "--plot"],
                                  ["gradflow", sample("mlp.py:build"), "--plot"]])
def test_a_loop_of_links_is_refused_and_dev_null_is_written(cli, tmp_path, monkeypatch, args):
    """A review: a symlink loop given as the file was replaced by a regular file; /dev/null, which output.md says
    is written in place, was refused for its name (or, past that, its temporary file's name was read as the format)."""
    (tmp_path / "pyproject.toml").write_text(CONFIG.format(model=sample("cnn.py:build")))
    monkeypatch.chdir(tmp_path)
    os.symlink("b.xml", "a.xml")
    os.symlink("a.xml", "b.xml")
    r = cli(*args, "a.xml")
    assert r.code == 2 and "a.xml: Too many levels of symbolic links" in r.stderr, r.stderr
    assert os.readlink("a.xml") == "b.xml" and os.readlink("b.xml") == "a.xml"
    r = cli(*args, os.devnull)
    assert r.code in (0, 1) and "error:" not in r.stderr, r.stderr      # overfit-batch at 2 steps may fail its check
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_a_folder_option_given_a_fifo_says_what_it_is(tmp_path):
    """A sweep: `--tb FIFO` said "is a file, not a folder"."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match=r"--tb .*pipe: is not a folder \(a FIFO, socket or device\)$"):
        check_dir(fifo, "--tb")
    (tmp_path / "f").write_text("x")
    with pytest.raises(UsageError, match="is a file, not a folder"):
        check_dir(tmp_path / "f", "--tb")


def test_a_dangling_link_on_a_folders_way_is_named_as_one(tmp_path):
    """A sweep: --tb on a link to a missing folder said "…/embeddings is a file, not a folder"."""
    (tmp_path / "dl").symlink_to(tmp_path / "missing" / "x")
    for path in (tmp_path / "dl", tmp_path / "dl" / "summary"):
        with pytest.raises(UsageError) as exc:
            check_dir(path, "--tb")
        assert f"{tmp_path / 'dl'} is a link to {tmp_path / 'missing' / 'x'}, which does not exist" in exc.value.message


def test_profile_trace_takes_json_only_and_steps_are_bounded(cli, tmp_path):
    """A sweep: --trace model.py replaced the file with a trace (exit 0); --active 1e11 grew to 11 GB."""
    keep = tmp_path / "model.py"
    keep.write_text("PRECIOUS")
    r = cli("profile", sample("mlp.py:build"), "--device", "cpu", "--trace", keep)
    assert r.code == 2 and "unsupported file type '.py'" in r.stderr and keep.read_text() == "PRECIOUS", r.stderr
    r = cli("profile", sample("mlp.py:build"), "--device", "cpu", "--active", "100000000000")
    assert r.code == 2 and "must be ≤ 10000" in r.stderr, r.stderr
    _one_error_line(r)
