"""Bounds checked before a library parses what a user hands over (torch-free).

json and tomllib recurse once per nesting level: a 100k-deep array ends in RecursionError (exit 4) or a
crash. A file that is not regular (/dev/zero, a FIFO, a socket) is read without end or blocks forever.
These helpers say so in one line (UsageError, exit 2) before any parser or reader sees the text."""
from __future__ import annotations

import os
import stat

from ..errors import UsageError

MAX_DEPTH = 64           # nesting of arrays/tables in a config or a header; real ones stay under 10
MAX_CONFIG = 64 * 2**20  # bytes of a JSON/TOML config file


def regular_file(path: str, what: str, hint: str | None = None) -> None:
    """Refuse anything but a regular file (symlinks followed): a device, FIFO or socket is never opened."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise UsageError(f"{what} {path}: {exc.strerror or exc}", hint=hint) from None
    if not stat.S_ISREG(mode):
        kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else
                "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
                "not a regular file")
        raise UsageError(f"{what} {path} is {kind}, not a regular file", hint=hint or "name a file on disk")


def read_text(path: str, what: str, limit: int = MAX_CONFIG) -> str:
    """A config file's text, refused when not a regular file or larger than `limit` (read bounded)."""
    regular_file(path, what)
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UsageError(f"{what} {path} is larger than {limit // 2**20} MiB", hint="a config file is a few KB")
    return data.decode("utf-8")


def json_depth(text: str | bytes, limit: int = MAX_DEPTH) -> int:
    """The deepest nesting of [ and { outside strings; UsageError past `limit` (before json.loads recurses)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                raise UsageError(f"nested more than {limit} levels deep", hint="no real config or header nests so deep")
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def toml_depth(text: str, limit: int = MAX_DEPTH) -> int:
    """As json_depth for TOML: strings ('…', "…", and their triple-quoted forms) and comments skipped."""
    depth = deepest = i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if ch in "\"'":
            quote = text[i:i + 3] if text[i:i + 3] in ('"""', "'''") else ch
            j = i + len(quote)
            while j < n and not text.startswith(quote, j):
                j += 2 if (ch == '"' and text[j] == "\\") else 1
            i = j + len(quote)
            continue
        if ch in "[{":
            depth += 1
            if depth > limit:
                raise UsageError(f"nested more than {limit} levels deep", hint="no real config nests so deep")
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
        i += 1
    return deepest


# bytes per element of each safetensors dtype (sub-byte and exotic ones: not checked against the offsets)
SAFETENSORS_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                        "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "C64": 8}


MAX_TENSOR_BYTES = 2**50   # 1 PiB: past any real tensor, inside what torch's int64 sizes can hold


def safetensors_entries(doc: dict, data_bytes: int | None) -> None:
    """Each tensor entry of a safetensors header: a dtype, a shape of non-negative integers and data_offsets
    inside the file whose length is what the shape and dtype need. Raises ValueError naming the entry:
    a header must not make a reader allocate (or a meta tensor claim) more than the file holds.
    `data_bytes` None: the data is not read (meta), only each tensor's own size is bounded."""
    limit = MAX_TENSOR_BYTES if data_bytes is None else data_bytes
    for key, entry in doc.items():
        if key == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise ValueError(f"entry {key} is not an object")
        shape, offsets, dtype = entry.get("shape"), entry.get("data_offsets"), entry.get("dtype")
        if not isinstance(dtype, str):
            raise ValueError(f"entry {key} has no dtype")
        if not (isinstance(shape, list) and all(type(d) is int and 0 <= d <= MAX_TENSOR_BYTES for d in shape)):
            raise ValueError(f"entry {key} has shape {str(shape)[:60]}: not a list of plausible non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1] and offsets[1] - offsets[0] <= limit
                and (data_bytes is None or offsets[1] <= data_bytes)):
            raise ValueError(f"entry {key} has data_offsets {str(offsets)[:60]} outside "
                             + (f"the file's {data_bytes} data bytes" if data_bytes is not None else "any plausible size"))
        numel = 1
        for d in shape:
            numel *= d
        size = SAFETENSORS_ITEMSIZE.get(dtype)
        if numel > MAX_TENSOR_BYTES or size is not None and numel * size != offsets[1] - offsets[0]:
            raise ValueError(f"entry {key} is {dtype} of shape {shape}, {numel * size} bytes, but its data_offsets "
                             f"span {offsets[1] - offsets[0]}")
