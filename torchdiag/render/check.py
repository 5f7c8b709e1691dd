"""Files of `check`: the JUnit report (render/ci.py builds it)."""
from __future__ import annotations


def write_junit(result, path) -> str:
    from .ci import write_junit as junit

    return str(junit(result, path))


# the files this command writes, by the kind its caller asks for (RenderSpec.outputs)
WRITERS = {"junit": write_junit}
