"""Number formatting (torch-free) shared by the renderers and by the diagnostics' finding messages."""
from __future__ import annotations

import math


def si(n, unit: str = "", digits: int = 3) -> str:
    """1234567 → '1.235 M'; keeps small integers exact."""
    if n is None:
        return "—"
    n = float(n)
    if n == 0:
        return f"0 {unit}".strip()
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= factor:
            return f"{n / factor:.{digits}f} {prefix}{unit}".strip()
    return (f"{int(n)} {unit}" if n == int(n) else f"{n:.{digits}g} {unit}").strip()


def human_bytes(n) -> str:
    if n is None:
        return "—"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def bytes_apart(need: int, free: int) -> tuple[str, str]:
    """Two sizes told apart: human_bytes each, or the exact bytes where those print alike (4,216 B needed against
    4,215 B free read "4.12 KiB ... 4.12 KiB is free": a review)."""
    a, b = human_bytes(need), human_bytes(free)
    return (a, b) if a != b else (f"{need:,} B", f"{free:,} B")


def number(n) -> str:
    if n is None:
        return "—"
    if isinstance(n, bool):
        return "yes" if n else "no"
    if isinstance(n, int):
        return f"{n:,}"
    if isinstance(n, float):
        if math.isnan(n) or math.isinf(n):
            return str(n)
        if n == 0:
            return "0"
        if abs(n) >= 1e5 or abs(n) < 1e-3:
            return f"{n:.3e}"
        return f"{n:.4g}"
    return str(n)


def cell(value, kind: str) -> str:
    if value is None:
        return "—"
    if kind == "count":
        return f"{int(value):,}"
    if kind == "bytes":
        return human_bytes(value)
    if kind == "flops":
        return si(value)
    if kind == "pct":
        return f"{100 * float(value):.1f}%"
    if kind in ("int", "float"):
        return number(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return number(value) if isinstance(value, (int, float)) else str(value)


def bar(fraction: float, width: int = 20) -> str:
    """A block bar for a value in [0, 1]."""
    fraction = max(0.0, min(1.0, fraction))
    full = int(fraction * width)
    rest = fraction * width - full
    partial = " ▏▎▍▌▋▊▉"[int(rest * 8)] if full < width else ""
    return ("█" * full + partial).ljust(width)


def sparkline(values) -> str:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    ticks = "▁▂▃▄▅▆▇█"
    if hi == lo:
        return ticks[0] * len(vals)
    return "".join(ticks[int((v - lo) / (hi - lo) * 7)] for v in vals)
