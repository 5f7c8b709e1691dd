"""Iterating the user's data without hanging or drowning in tracebacks.

`Fetcher` runs the iteration in a helper thread and waits for each batch at most `timeout` seconds. A
batch that does not come is a `Hang` that says where the loading is stuck: the helper thread's Python
stack when the loader runs in this process, and each DataLoader worker's own stack, which the worker
writes with faulthandler when we send it SIGUSR1 (registered by `WorkerInit`, a worker_init_fn wrapper
that runs the user's own one after it). The stuck workers are then ended (they are ours: the
DataLoader we built started them).

A DataLoader is rebuilt (core.datasets.rebuild) with a batch sampler that records the indices of each
batch (`Recording`), so a sample that raises is named by its dataset index: the batch's samples are
loaded again one by one in this process. A worker process that dies (segfault, os._exit, killed)
is one ModelError naming the worker and how it died, not a traceback per worker."""
from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback

from ..errors import ModelError, one_line

DEATH_WAIT = 2.0              # seconds a broken connection to a worker is given to show as the worker's death
WATCH = 0.25                  # seconds between looks at the workers while a batch is awaited
CLOSE_WAIT_S = 2.0   # seconds close() waits for the thread's fetch ahead (a cleanup bound, not a verdict)
DIED_HINT = ("a worker process died without a Python error (a crash in native code, os._exit, or out of memory); run "
             "with num_workers=0 to see it in this process")
KEEP = 64                     # index lists remembered (batches in flight: workers × prefetch)
_OPEN: list = []              # a worker's dump file stays open for faulthandler
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>.+)')
_LIBRARY = (os.sep + "torch" + os.sep, os.sep + "torchdiag" + os.sep, "threading.py", "queue.py",
            os.sep + "multiprocessing" + os.sep, "selectors.py", "connection.py")


class Hang(Exception):
    """No batch within the timeout: `stacks` says where each process was stuck."""

    def __init__(self, batch: int, seconds: float, stacks: list[dict]):
        super().__init__(f"batch {batch} did not arrive within {seconds:g} s")
        self.batch, self.seconds, self.stacks = batch, seconds, stacks


class Recording:
    """A batch sampler (or sampler) that remembers the indices of the last KEEP batches it gave."""

    def __init__(self, inner):
        self.inner = inner
        self.seen: dict[int, list] = {}

    def __iter__(self):
        for k, idx in enumerate(self.inner):
            self.seen[k] = list(idx) if isinstance(idx, (list, tuple)) else [idx]
            self.seen.pop(k - KEEP, None)
            yield idx

    def __len__(self):
        return len(self.inner)


class WorkerInit:
    """worker_init_fn: SIGUSR1 makes this worker write its Python stack to a file in `folder` (named with
    the worker id and pid, so the main process finds both); then the user's own worker_init_fn."""

    def __init__(self, folder: str, user_fn=None):
        self.folder, self.user_fn = folder, user_fn

    def __call__(self, worker_id: int):
        import faulthandler

        if hasattr(signal, "SIGUSR1"):
            f = open(os.path.join(self.folder, f"worker{worker_id}.{os.getpid()}.txt"), "w")
            _OPEN.append(f)
            faulthandler.register(signal.SIGUSR1, file=f, all_threads=False)
        if self.user_fn is not None:
            self.user_fn(worker_id)


def workers_of(folder: str | None) -> list[tuple[int, int, str]]:
    """(worker id, pid, dump file) of the workers started with WorkerInit(folder)."""
    out = []
    for name in sorted(os.listdir(folder)) if folder and os.path.isdir(folder) else []:
        m = re.fullmatch(r"worker(\d+)\.(\d+)\.txt", name)
        if m:
            out.append((int(m.group(1)), int(m.group(2)), os.path.join(folder, name)))
    return out


def user_frames(frames: list[tuple[str, int, str]]) -> list[str]:
    """`file:line in func`, innermost last, without torch's, torchdiag's and the stdlib's plumbing."""
    kept = [f"{os.path.relpath(f) if not f.startswith('<') else f}:{line} in {func}" for f, line, func in frames
            if not any(part in f for part in _LIBRARY)]
    return kept[-6:] or [f"{f}:{line} in {func}" for f, line, func in frames[-3:]]


def thread_stack(thread: threading.Thread) -> list[str]:
    frame = sys._current_frames().get(thread.ident)
    if frame is None:
        return []
    return user_frames([(s.filename, s.lineno, s.name) for s in traceback.extract_stack(frame)])


def worker_stack(pid: int, path: str, wait: float = 0.5) -> list[str]:
    """Ask a worker for its stack (SIGUSR1 → faulthandler) and read it back."""
    try:
        os.kill(pid, signal.SIGUSR1)
    except (ProcessLookupError, PermissionError, AttributeError):
        return []
    deadline = time.monotonic() + wait
    text = ""
    while time.monotonic() < deadline:
        time.sleep(0.05)
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if "File" in text:
            break
    frames = [(m.group("file"), int(m.group("line")), m.group("func").strip()) for m in _FRAME.finditer(text)]
    return user_frames(list(reversed(frames)))   # faulthandler writes the innermost frame first


_END, _OK, _ERR = 0, 1, 2


class Fetcher:
    """`for batch in Fetcher(loader, timeout)`: each batch within `timeout` s, else `Hang`. An error
    while loading is re-raised here as a ModelError naming the sample (see the module docstring)."""

    def __init__(self, iterable, timeout: float, *, dataset=None, recording: Recording | None = None,
                 folder: str | None = None, label: str = "the loader", ahead: int = 0):
        self.iterable, self.timeout, self.dataset, self.recording = iterable, timeout, dataset, recording
        self.ahead = ahead                  # batches fetched ahead of the consumer (0 when timing the loader)
        self.folder, self.label = folder, label
        self.count = 0                      # batches received
        self.samples = 0
        self._q: queue.Queue = queue.Queue()
        self._req: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.iterator = None
        self.procs: list = []               # the iterator's worker processes (kept: the iterator goes with its thread)
        self.dead = ""
        self._stuck = False                 # the loader hung or its workers died: the thread is not waited for

    def _work(self):
        """Fetch one batch per request: no read-ahead of our own, so the loader is timed as configured."""
        try:
            self.iterator = iter(self.iterable)
            self.procs = list(getattr(self.iterator, "_workers", None) or [])
            while self._requested():
                try:
                    item = (_OK, next(self.iterator))
                except StopIteration:
                    item = (_END, None)
                except BaseException as exc:    # handed to the main thread, which decides
                    self.dead = dead_workers(self.procs)   # read before the iterator shuts its workers down
                    # the frames' locals hold the iterator: cleared, it shuts its workers down here and now (below);
                    # kept, it lived as long as the error and was finalised in a garbage collection, after its
                    # queues, so each worker waited out DataLoader's 5 s join
                    traceback.clear_frames(exc.__traceback__)
                    item = (_ERR, exc)
                self._q.put(item)
                if item[0] != _OK:
                    return
        except BaseException as exc:
            self._q.put((_ERR, exc))
        finally:
            self.iterator = None   # the DataLoader's workers shut down with their iterator

    def _requested(self) -> bool:
        while not self._stop.is_set():
            try:
                self._req.get(timeout=0.1)
                return True
            except queue.Empty:
                continue
        return False

    def __iter__(self):
        self._thread = threading.Thread(target=self._work, name="torchdiag-data", daemon=True)
        self._thread.start()
        for _ in range(self.ahead):
            self._req.put(1)
        try:
            while True:
                self._req.put(1)
                kind, value = self._next()
                if kind == _END:
                    return
                if kind == _ERR:
                    raise self._failure(value) from value
                self.count += 1
                yield value
        except GeneratorExit:   # the consumer stopped early: the batch fetched ahead is waited for (close)
            raise
        except BaseException:   # Ctrl-C, SIGTERM, a failure: the thread may be stuck in the user's code (a
            self._stuck = True  # review: Ctrl-C on a hung loader waited 2 x --timeout)
            raise
        finally:
            self.close()

    def close(self):
        """Stop the thread, and wait for the batch it is fetching (ahead) unless the loader is stuck: a daemon thread
        still in torch code (a collate function's ops) when the interpreter exits aborts the process ("terminate
        called without an active exception", exit 134: a sweep, 1 run in 60, 4 in 6 under pytest)."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread() and t.is_alive() and not self._stuck:
            t.join(min(self.timeout, CLOSE_WAIT_S))   # a batch fetched ahead takes milliseconds; a hung one is let be
            self._stuck = t.is_alive()   # once: a second close does not wait again

    def _next(self) -> tuple:
        """The next item within `timeout`, watching the workers meanwhile: DataLoader itself sees a dead worker
        only when its 5 s poll of the result queue runs out."""
        end = time.monotonic() + self.timeout
        while True:
            try:
                return self._q.get(timeout=max(0.0, min(WATCH, end - time.monotonic())))
            except queue.Empty:
                pass
            died = dead_workers(self.procs)
            if died:
                self._stuck = True
                self.close()
                raise ModelError(f"{self.label}: {died} while loading batch {self.count}", hint=DIED_HINT)
            if time.monotonic() >= end:
                raise self._hang() from None

    def _hang(self) -> Hang:
        stacks = []
        workers = workers_of(self.folder)
        for wid, pid, path in workers:
            stacks.append({"where": f"worker {wid} (pid {pid})", "stack": worker_stack(pid, path)})
        if self._thread is not None and (not workers or not any(s["stack"] for s in stacks)):
            stacks.insert(0, {"where": "main process", "stack": thread_stack(self._thread)})
        self._stuck = True
        self.close()
        for _, pid, _ in workers:       # our DataLoader started them; the thread's next() then fails and ends
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return Hang(self.count, self.timeout, stacks)

    def _failure(self, exc: BaseException) -> BaseException:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)) or getattr(exc, "code", None) is not None and \
                isinstance(exc, ModelError):
            return exc
        dead = self.dead or self._died(exc) or self._gone()
        if dead:
            return ModelError(f"{self.label}: {dead} while loading batch {self.count}", hint=DIED_HINT)
        indices = self.recording.seen.get(self.count) if self.recording is not None else None
        if indices is not None and self.dataset is not None:
            for i in indices:
                try:
                    self.dataset[i]
                except Exception as inner:
                    return ModelError(f"dataset[{i}] raised {one_line(inner)}",
                                      hint=f"{self.label}: sample {i} fails to load (in batch {self.count}); "
                                           f"run `dataset[{i}]` in Python to see the traceback")
            shown = ", ".join(map(str, indices[:8])) + (" …" if len(indices) > 8 else "")
            return ModelError(f"{self.label}: batch {self.count} (samples {shown}) raised {_first(exc)}",
                              hint="each sample loads on its own: collate_fn (or the batch as a whole) failed")
        return ModelError(f"{self.label} raised {_first(exc)} at batch {self.count}")

    def _died(self, exc: BaseException) -> str:
        """A worker that ended badly, read without reaping it. A broken connection is what the main process sees
        when it fetches a batch whose worker is dying (its shared memory goes with it): the death is then given
        up to DEATH_WAIT s to show, so a crash is named as one instead of the batch blamed on collate_fn."""
        end = time.monotonic() + (DEATH_WAIT if isinstance(exc, (ConnectionError, EOFError)) else 0.0)
        while True:
            died = dead_workers(self.procs)
            if died or time.monotonic() >= end:
                return died
            time.sleep(0.02)

    def _gone(self) -> str:
        """Workers whose pid is gone (when the iterator could not be asked)."""
        return "; ".join(f"worker {wid} (pid {pid}) died" for wid, pid, _ in workers_of(self.folder) if not _alive(pid))


def _signal_name(number: int) -> str:
    return f"signal {signal.Signals(number).name}" if number in signal.Signals._value2member_map_ else f"signal {number}"


def dead_workers(procs) -> str:
    """'worker 0 (pid 123) died with exit code 7' for each DataLoader worker process (the iterator's `_workers`,
    in worker-id order) that ended badly. Read through multiprocessing's own Process.exitcode, which records what
    it collects, so the DataLoader that owns them still sees the same exit code."""
    dead = []
    for wid, w in enumerate(procs):
        code = getattr(w, "exitcode", None)
        if code not in (None, 0):
            how = _signal_name(-code) if code < 0 else f"exit code {code}"
            dead.append(f"worker {wid} (pid {w.pid}) died with {how}")
    return "; ".join(dead)


def _alive(pid: int) -> bool:
    try:
        waited, status = os.waitpid(pid, os.WNOHANG)
        return waited == 0
    except ChildProcessError:
        return False
    except OSError:
        return True


def _first(exc: BaseException) -> str:
    """one_line, with DataLoader's "Caught X in DataLoader worker process N." wrapper replaced by the
    original message (its last line)."""
    text = str(exc).strip().splitlines()
    if text and text[0].startswith("Caught ") and len(text) > 1:
        return f"{type(exc).__name__}: {text[-1].strip()[:300]} (in a DataLoader worker)"
    return one_line(exc)


def guarded(iterable, timeout: float, dataset=None, label: str = "the loader", changes: dict | None = None,
            ahead: int = 0):
    """(Fetcher, cleanup): a DataLoader rebuilt with Recording + WorkerInit and `changes` (the user's
    loader untouched); any other iterable as it is. Call cleanup() when done (removes the dump folder)."""
    from torch.utils.data import DataLoader

    from .datasets import rebuild

    if not isinstance(iterable, DataLoader):
        return Fetcher(iterable, timeout, label=label, ahead=ahead), lambda: None
    folder = tempfile.mkdtemp(prefix="torchdiag-workers-") if iterable.num_workers > 0 else None
    changes = dict(changes or {})
    recording = None
    if dataset is not None:
        if iterable.batch_sampler is not None:
            recording = Recording(iterable.batch_sampler)
            changes["batch_sampler"] = recording
        else:
            recording = Recording(iterable.sampler)
            changes.update(batch_size=None, sampler=recording)
    if folder is not None:
        changes["worker_init_fn"] = WorkerInit(folder, iterable.worker_init_fn)
    loader = rebuild(iterable, **changes) if changes else iterable
    fetcher = Fetcher(loader, timeout, dataset=dataset, recording=recording, folder=folder, label=label, ahead=ahead)
    return fetcher, (lambda: shutil.rmtree(folder, ignore_errors=True)) if folder else (lambda: None)
