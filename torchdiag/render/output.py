"""The one way torchdiag writes a file the user asked for (--out, --images, --junit, --plot, --trace, ...).

A regular file is written to a temporary file in the same folder, flushed and fsynced, then renamed
over the target, so a failure (full disk, read-only folder, Ctrl-C) leaves the previous file as it
was and no fragment behind. A target that exists and is not a regular file is never replaced: a
device or FIFO (/dev/null, /dev/stdout, a named pipe) is opened and written in place, a directory
is refused. A symlink is followed: the file it points to is written, the link stays. Every failure
is one UsageError line (exit 2). Stdlib only."""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import UsageError

NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def write_error(path, option: str, exc: OSError) -> UsageError:
    """The one-line error for a write that failed (the caller raises it `from None`)."""
    code = getattr(exc, "errno", None)
    if code == errno.ENOSPC or code == getattr(errno, "EDQUOT", -1):
        return UsageError(f"no space left on device writing {path}",
                          hint=f"free some space, or give {option} a path on another disk")
    if code in NOT_WRITABLE:
        return UsageError(f"{option} {path}: not writable ({os.strerror(code)})",
                          hint="give a path in a folder you can write to")
    why = exc.strerror or str(exc) or type(exc).__name__
    return UsageError(f"cannot write {path} ({option}): {why}")


def _target(path, option: str) -> Path:
    """The file a write to `path` lands in: symlinks followed (a dangling link names the file to create); a loop
    of links is refused (a review: the link was replaced by a regular file)."""
    p = Path(path)
    if not p.is_symlink():
        return p
    try:
        os.stat(p)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(f"{option} {path}: {os.strerror(errno.ELOOP)}",
                             hint="point the link at a file, or give another path") from None
    return Path(os.path.realpath(p))


def _kind(target: Path) -> str:
    """'missing', 'regular', 'directory' or 'special' (device, FIFO, socket)."""
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError:
        return "missing"   # e.g. a component that is a file: mkstemp will report it
    if stat.S_ISDIR(mode):
        return "directory"
    return "regular" if stat.S_ISREG(mode) else "special"


def _refuse_directory(path, option: str) -> None:
    raise UsageError(f"{option} {path}: is a directory", hint="give a file name")


def _make_parent(target: Path, path, option: str) -> Path:
    parent = target.parent if str(target.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"{option} {path}: {parent} is a file, not a folder", hint="give a path inside a folder") from None
    except OSError as exc:
        raise write_error(path, option, exc) from None
    return parent


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _new_mode(target: Path) -> int:
    """Permission bits for the new file: the old file's, else what open() would give (0666 & ~umask)."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _temp(target: Path, path, option: str, suffix: str = "") -> tuple[int, str]:
    parent = _make_parent(target, path, option)
    try:
        return tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp" + suffix, dir=parent)
    except OSError as exc:
        raise write_error(path, option, exc) from None


def _remove(name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name)


def _in_place(target: Path, data: bytes, path, option: str) -> None:
    """A device or FIFO: open it and write, never replace it. A FIFO with no reader yet is waited for, as a shell's
    redirection would, but said first: the run's report, printed after its files, waits with it (a review found
    the silent wait indistinguishable from a hang)."""
    flags = os.O_WRONLY | getattr(os, "O_NOCTTY", 0)
    try:
        fifo = stat.S_ISFIFO(os.stat(target).st_mode)
        fd = _open_fifo(target, flags, path, option) if fifo else os.open(target, flags)
    except OSError as exc:
        raise write_error(path, option, exc) from None
    try:
        _write_all(fd, data)
        with contextlib.suppress(OSError):   # fsync is meaningless on most devices and pipes
            os.fsync(fd)
    except OSError as exc:
        raise write_error(path, option, exc) from None
    finally:
        os.close(fd)


def _open_fifo(target: Path, flags: int, path, option: str) -> int:
    try:
        fd = os.open(target, flags | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno != errno.ENXIO:   # ENXIO: nothing has it open for reading yet
            raise
        if sys.stderr is not None:   # the line is a courtesy: a closed or broken stderr does not stop the write
            with contextlib.suppress(OSError, ValueError):
                print(f"{option} {path}: a FIFO that nothing reads yet; waiting for a reader (Ctrl-C stops)",
                      file=sys.stderr, flush=True)
        return os.open(target, flags)
    os.set_blocking(fd, True)   # a reader is there: write as to any pipe, waiting while it reads
    return fd


def _replace(tmp: str, target: Path, path, option: str) -> None:
    try:
        os.chmod(tmp, _new_mode(target))
        os.replace(tmp, target)
    except OSError as exc:
        _remove(tmp)
        raise write_error(path, option, exc) from None
    with contextlib.suppress(OSError):   # make the rename itself durable
        dfd = os.open(target.parent if str(target.parent) else ".", os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def atomic_write(path, data: bytes | str, option: str) -> Path:
    """Write `data` (str is UTF-8) to `path` as described in the module docstring. Returns `path`."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    target = _target(path, option)
    kind = _kind(target)
    if kind == "directory":
        _refuse_directory(path, option)
    if kind == "special":
        _in_place(target, data, path, option)
        return Path(path)
    fd, tmp = _temp(target, path, option)
    with _removed_on_failure(tmp, path, option):   # also a Ctrl-C/SIGTERM up to the rename
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        _replace(tmp, target, path, option)
    return Path(path)


@contextlib.contextmanager
def _removed_on_failure(tmp: str, path, option: str):
    """The temporary file goes on any failure; an OSError becomes the one-line UsageError."""
    try:
        yield
    except OSError as exc:
        _remove(tmp)
        raise write_error(path, option, exc) from None
    except BaseException:
        _remove(tmp)
        raise


@contextlib.contextmanager
def atomic_path(path, option: str) -> Iterator[str]:
    """`with atomic_path(p, "--plot") as tmp: fig.savefig(tmp)`: a temporary path in the same folder
    (same suffix, so libraries that pick the format from the name still do) for a library that
    insists on writing to a path itself. On success it replaces `path` (or is copied into a device
    or FIFO); on failure it is removed and an OSError becomes a one-line UsageError."""
    target = _target(path, option)
    kind = _kind(target)
    if kind == "directory":
        _refuse_directory(path, option)
    fd, tmp = _temp(target, path, option, Path(path).suffix)
    os.close(fd)
    with _removed_on_failure(tmp, path, option):   # also a Ctrl-C/SIGTERM up to the rename
        yield tmp
        _fsync_file(tmp)
        if kind != "special":
            _replace(tmp, target, path, option)
            return
        data = Path(tmp).read_bytes()
    _remove(tmp)
    _in_place(target, data, path, option)


def _fsync_file(name: str) -> None:
    fd = os.open(name, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_file(path, option: str, suffixes: tuple[str, ...] = ()) -> Path | None:
    """Check a file the command will write, before any work: not a directory, its folder exists
    and is writable, its suffix is one we write. Raises UsageError (exit 2)."""
    if path is None:
        return None
    path = Path(path)
    if path.is_dir():
        _refuse_directory(path, option)
    target = _target(path, option)
    # a device or FIFO (/dev/null) is written in place whatever its name: the format is the option's first
    if suffixes and path.suffix.lower() not in suffixes and _kind(target) != "special":
        raise UsageError(f"{option} {path}: unsupported file type '{path.suffix or '(none)'}'",
                         hint="use a name ending in " + " or ".join(suffixes))
    parent = target.parent if str(target.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise UsageError(f"{option} {path}: {parent} is a file, not a folder", hint="give a path inside a folder")
    if not parent.is_dir():
        raise UsageError(f"{option} {path}: folder {parent} does not exist", hint="create it first")
    special = _kind(target) == "special"
    # a regular file is replaced through a temporary file, so its folder must be writable
    if (not special and not os.access(parent, os.W_OK)) or (target.exists() and not os.access(target, os.W_OK)):
        raise UsageError(f"{option} {path}: not writable")
    return path


def check_dir(path, option: str) -> Path | None:
    """Check a folder the command will write into (created if missing). Raises UsageError (exit 2)."""
    if path is None:
        return None
    path = Path(path)
    if path.exists() and not path.is_dir():
        what = "a file" if path.is_file() else "not a folder (a FIFO, socket or device)"
        raise UsageError(f"{option} {path}: is {what}" + (", not a folder" if path.is_file() else ""),
                         hint="give a folder name")
    probe = path
    while not probe.exists():
        if probe.is_symlink():   # a dangling link: mkdir would say "exists" (a sweep: "…/summary is a file")
            raise UsageError(f"{option} {path}: {probe} is a link to {os.readlink(probe)}, which does not exist",
                             hint="create the folder it points to, or give another folder")
        probe = probe.parent if probe.parent != probe else probe
        if probe == probe.parent:
            break
    if probe.exists() and not probe.is_dir():
        raise UsageError(f"{option} {path}: {probe} is a file, not a folder", hint="give a folder name")
    if probe.exists() and not os.access(probe, os.W_OK):
        raise UsageError(f"{option} {path}: not writable")
    return path
