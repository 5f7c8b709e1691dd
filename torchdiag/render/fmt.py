"""The number formatting renderers use lives one layer down, in torchdiag/fmt.py, so diagnostics format
their messages without importing render; these names stay importable from here."""
from __future__ import annotations

from ..fmt import bar, cell, human_bytes, number, si, sparkline

__all__ = ["bar", "cell", "human_bytes", "number", "si", "sparkline"]
