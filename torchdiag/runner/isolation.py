"""While torchdiag runs the user's code: stdout kept for our one JSON document, no terminal input,
os._exit turned into an error, SIGTERM handled like Ctrl-C. Torch-free (on the --help path)."""
from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading

from ..errors import Terminated

_REAL_EXIT = os._exit   # taken when torchdiag starts, before any user code could replace it


class _NoInput:
    """sys.stdin while the model runs: input() fails at once instead of waiting for a terminal."""

    def readline(self, *args):
        raise EOFError("torchdiag runs your code without a terminal: input() has nothing to read")

    read = readlines = readline

    def isatty(self) -> bool:
        return False

    def fileno(self):
        raise OSError("stdin is closed while torchdiag runs your model")

    def close(self) -> None:
        """A forked process (a DataLoader worker) closes stdin first (multiprocessing's _close_stdin); without
        this its start failed with AttributeError and every worker died."""


class UserExit(SystemExit):
    """os._exit called by the user's code: reported as the model's failure (exit 3), never a silent exit."""


@contextlib.contextmanager
def isolated(json_mode: bool, keep_stdin: bool = False):
    """The guards around everything that runs the user's code (import, factory, forward, writers).
    keep_stdin: a script run as if run directly (watch) reads its own stdin."""
    # What we render with is imported before the user's folder goes on sys.path: a `rich.py` next to
    # the model file then cannot shadow the library.
    import rich.console  # noqa: F401
    import rich.progress  # noqa: F401
    import rich.table  # noqa: F401
    import rich.text  # noqa: F401

    with (contextlib.nullcontext() if keep_stdin else _stdin_closed()), _exit_guarded(), sigterm_as_interrupt():
        if json_mode:
            with _stdout_to_stderr():
                yield
        else:
            yield


@contextlib.contextmanager
def _stdout_to_stderr():
    """Python prints and C-level writes to fd 1 go to stderr, so stdout holds only the JSON document."""
    saved_fd = None
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
        saved_fd = os.dup(fd)
        os.dup2(sys.stderr.fileno(), fd)
    except (OSError, ValueError, AttributeError):  # no real descriptor (tests capture stdout)
        fd = None
    saved = sys.stdout
    sys.stdout = sys.stderr
    _HELD_STDOUT.append((saved, saved_fd, fd))
    try:
        yield
    finally:
        _HELD_STDOUT.pop()
        sys.stderr.flush()
        sys.stdout = saved
        if saved_fd is not None:
            os.dup2(saved_fd, fd)
            os.close(saved_fd)


_HELD_STDOUT: list = []   # (stream, saved descriptor, fd) while _stdout_to_stderr holds stdout (stuck_exit's)


def real_stdout() -> None:
    """stdout back to the real one, from another thread, at the end of a process (stuck_exit)."""
    if _HELD_STDOUT:
        stream, saved_fd, fd = _HELD_STDOUT[0]
        sys.stdout = stream
        if saved_fd is not None:
            os.dup2(saved_fd, fd)


STUCK_S = 5.0   # seconds a signal's handler gets to start unwinding before the rank is taken to be blocked


@contextlib.contextmanager
def stuck_exit(on_stuck):
    """Under torchrun a rank whose main thread is blocked in native code (a collective a peer never joins: a
    parameter used on one rank only under DDP) never runs Python's signal handler, and torchrun killed every rank
    30 s later with nothing printed (a sweep). Python's C handler still writes the signal's number to a wakeup
    descriptor: a thread reads it and, when the block has not ended STUCK_S later, calls `on_stuck(signum)` (it
    reports, and returns the exit code) and ends the process. Off the main thread, or where a wakeup descriptor
    cannot be set, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(r)
        os.close(w)
        yield
        return
    _FORKED_OFF.append(w)
    done = threading.Event()
    main = threading.main_thread().ident

    def watch():
        try:
            while data := os.read(r, 64):
                sig = next((b for b in data if b in (signal.SIGINT, signal.SIGTERM)), None)
                if sig is None or done.is_set():
                    continue
                at = _where(main)
                if done.wait(STUCK_S) or _where(main) != at:   # it ran Python since: its own handler had its turn
                    continue
                try:
                    code = on_stuck(sig)
                except BaseException:   # noqa: B036 — the process ends either way
                    code = 128 + sig
                _REAL_EXIT(int(code))
        finally:
            os.close(r)

    threading.Thread(target=watch, daemon=True, name="torchdiag-stuck-signal").start()
    try:
        yield
    finally:
        done.set()
        _FORKED_OFF.remove(w)
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(old)
        os.close(w)   # the thread reads the end and closes its side


def _where(ident) -> tuple:
    """The main thread's frame and line now: unchanged over STUCK_S, it is blocked in native code."""
    frame = sys._current_frames().get(ident)
    return (id(frame), getattr(frame, "f_lineno", None), id(getattr(frame, "f_back", None)))


_FORKED_OFF: list = []   # wakeup descriptors set by stuck_exit: a forked child must not write its signals there


def _child_wakeup_off() -> None:
    """In a child forked while stuck_exit runs (a multiprocessing.Pool in the model's code): its signals are its
    own, not the parent's (a review: a Pool's SIGTERM to its idle workers reached the parent's pipe, and the
    parent reported "terminated (SIGTERM)" 5 s later)."""
    if _FORKED_OFF:
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
        _FORKED_OFF.clear()


os.register_at_fork(after_in_child=_child_wakeup_off)


@contextlib.contextmanager
def _stdin_closed():
    import builtins

    saved, saved_input = sys.stdin, builtins.input
    sys.stdin = _NoInput()
    builtins.input = _no_input   # fails before writing its prompt: no text glued onto our error line
    try:
        yield
    finally:
        sys.stdin = saved
        builtins.input = saved_input


def _no_input(prompt=""):
    return _NoInput().readline()


@contextlib.contextmanager
def _exit_guarded():
    """os._exit in this process raises instead (a forked worker, e.g. a DataLoader's, still exits).
    Called from another thread, it ends that thread and the run then fails the same way."""
    real, pid = os._exit, os.getpid()
    main = threading.current_thread()
    from_thread: list[str] = []

    def guarded(code):
        if os.getpid() != pid:
            real(code)
        if threading.current_thread() is not main:
            from_thread.append(f"os._exit({code!r}) in a thread")
            raise SystemExit(code)   # ends the thread; threading ignores a plain SystemExit silently
        raise UserExit(f"os._exit({code!r})")

    os._exit = guarded
    try:
        yield
    finally:
        os._exit = real
        _guard_exit_handlers()
    if from_thread:
        raise UserExit(from_thread[0])


_exit_handlers_guarded = False


def _guard_exit_handlers() -> None:
    """An atexit handler of the user's module calling os._exit(0) would replace torchdiag's exit code
    (a CI gate would pass on a failed run). Registered after the user's code ran, this runs before
    their handlers (last in, first out) and makes os._exit in them a warning: the code stays ours."""
    global _exit_handlers_guarded
    if _exit_handlers_guarded:
        return
    _exit_handlers_guarded = True
    pid = os.getpid()

    def late(code):
        if os.getpid() != pid:
            _REAL_EXIT(code)
        sys.stderr.write(f"warning: the model's code called os._exit({code!r}) at exit; ignored, so the "
                         "exit code stays torchdiag's\n")

    atexit.register(lambda: setattr(os, "_exit", late))


_seen = {"signal": 0, "reported": False}   # the CLI process's last SIGTERM; whether an outcome was shown


def _raise_terminated(signum, frame):
    _seen["signal"] = signum
    raise Terminated()


def unreported_interrupt() -> int | None:
    """130 or 143 when the CLI's exit code says interrupted but no outcome was shown: typer turns a Ctrl-C or
    SIGTERM outside the runner (while options are parsed) into a silent exit 130."""
    if _seen["reported"]:
        return None
    return 128 + signal.SIGTERM if _seen["signal"] == signal.SIGTERM else 130


def sigterm_raises() -> None:
    """The CLI process from main() on: SIGTERM raises Terminated where Ctrl-C raises KeyboardInterrupt, so
    one arriving while options are parsed and checked ends with exit 143 and the --json error document
    too, not a silent kill. Not restored: the process ends with the command (Finishing takes over). A
    SIGTERM the parent set to be ignored stays ignored."""
    with contextlib.suppress(ValueError, OSError):   # not the main thread
        if signal.getsignal(signal.SIGTERM) != signal.SIG_IGN:
            signal.signal(signal.SIGTERM, _raise_terminated)


GRACE_S = 3.0   # a document being printed when a signal came gets this long to end, then the process does


class Finishing:
    """From a complete outcome to the process's exit a Ctrl-C or SIGTERM cannot change what ran. One arriving
    while the outcome is printed lets the document end whole (render/jsondoc.write_whole) and the process then
    exits with the code the document states; a second one, or GRACE_S without the end (a stdout nobody
    reads), exits at once with 130/143 and the document cut short. One arriving after it is printed exits at
    once with the document's code (not a kill at interpreter shutdown that contradicts the document). An
    ignored signal stays ignored."""

    def __init__(self, code: int):
        self.code, self.printing, self.held = int(code), True, 0
        self._timer: threading.Timer | None = None
        _seen["reported"] = True
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, OSError, TypeError):
                if callable(signal.getsignal(sig)):
                    signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame):
        if not self.printing:
            _REAL_EXIT(self.code)
            return
        self.held += 1
        if self.held > 1:
            _REAL_EXIT(128 + signum)
            return
        self._timer = threading.Timer(GRACE_S, _REAL_EXIT, (128 + signum,))
        self._timer.daemon = True
        self._timer.start()

    def printed(self, code: int) -> None:
        """The outcome is on stdout/stderr with this code; a signal held while printing ends the process now."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if self._timer is not None:
            self._timer.cancel()
        self.code, self.printing = int(code), False
        if self.held:
            _REAL_EXIT(self.code)


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM (CI timeouts, job schedulers) raises Terminated, a KeyboardInterrupt: what Ctrl-C
    leaves (partial result, flushed logs, JSON) SIGTERM leaves too, with exit 143."""
    try:
        previous = signal.getsignal(signal.SIGTERM)
        if previous != signal.SIG_IGN:   # an ignored SIGTERM stays ignored
            signal.signal(signal.SIGTERM, _raise_terminated)
    except (ValueError, OSError):  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        if previous is not None:   # None: a handler set from C, which Python cannot put back
            signal.signal(signal.SIGTERM, previous)
