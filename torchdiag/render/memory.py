"""Files of `memory`: the CUDA allocator history (`--snapshot FILE.pickle`, for https://pytorch.org/memory_viz)."""
from __future__ import annotations

from ..errors import UsageError
from .output import atomic_write


def write_snapshot(result, path) -> str:
    data = result.artefacts.get("snapshot")
    if data is None:   # not expected: memory refuses --snapshot off CUDA before it runs
        raise UsageError(f"--snapshot {path}: no allocator history was recorded")
    atomic_write(path, data, "--snapshot")
    return str(path)


def record(result, written: dict) -> None:
    """The CLI's render_extra: the snapshot's path in the JSON document and the summary (after the
    CUDA allocator line)."""
    path = written.get("snapshot")
    if path is None:
        return
    result.data.setdefault("cuda", {})["snapshot"] = path
    labels = [label for label, _ in result.summary]
    at = labels.index("CUDA allocator") + 1 if "CUDA allocator" in labels else len(labels)
    result.summary.insert(at, ("Snapshot", f"{path} (open at https://pytorch.org/memory_viz)"))


# the files this command writes, by the kind its caller asks for (RenderSpec.outputs)
WRITERS = {"snapshot": write_snapshot}
