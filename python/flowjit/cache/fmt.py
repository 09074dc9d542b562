"""Terminal output for flowjit-cache: human units, aligned tables, color on a TTY."""
import os
import re
import sys
import time

_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def human_bytes(n):
    """1536 -> '1.5 KiB'; below 1 KiB the exact count: '512 B'."""
    n = int(n)
    for name, size in _UNITS:
        if abs(n) >= size:
            v = n / size
            return f"{v:.1f} {name}" if v < 100 else f"{v:.0f} {name}"
    return f"{n} B"


#: The largest byte size the compiler reads (a signed 64-bit count).
MAX_BYTES = (1 << 63) - 1


def parse_bytes(text):
    """'1073741824', '512M', '2GiB', '64 kb' -> bytes (powers of 1024); ValueError otherwise."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"not a byte size: {text!r} (e.g. 1073741824, 512M, 2GiB)")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    value = float(m.group(1)) * scale
    if not value < MAX_BYTES:
        raise ValueError(f"byte size {text!r} is too large (at most {MAX_BYTES} bytes, 8 EiB)")
    return int(round(value))


def human_seconds(s):
    """0.0123 -> '12 ms', 1.234 -> '1.23 s', 125 -> '2 min 5 s'."""
    if s is None:
        return "-"
    s = float(s)
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.0f} ms" if s >= 0.01 else f"{s * 1e3:.1f} ms"
    if s < 60:
        return f"{s:.2f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"


def human_age(t, now=None):
    """A unix time as an age: '12 s ago', '5 min ago', '3 h ago', '2 d ago'."""
    if not t:
        return "-"
    d = max(0.0, (now if now is not None else time.time()) - float(t))
    if d < 60:
        return f"{int(d)} s ago"
    if d < 3600:
        return f"{int(d // 60)} min ago"
    if d < 86400:
        return f"{int(d // 3600)} h ago"
    return f"{int(d // 86400)} d ago"


def local_time(t):
    if not t:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(t)))


class Style:
    """ANSI styles, active only when writing to a terminal and NO_COLOR is unset."""

    _CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "blue": "34",
              "magenta": "35", "cyan": "36"}

    def __init__(self, mode="auto", stream=None):
        stream = stream if stream is not None else sys.stdout
        if os.environ.get("NO_COLOR"):
            self.enabled = False
        elif mode == "always":
            self.enabled = True
        elif mode == "never":
            self.enabled = False
        else:
            self.enabled = hasattr(stream, "isatty") and stream.isatty() and os.environ.get("TERM") != "dumb"

    def __call__(self, text, *styles):
        if not self.enabled or not styles:
            return str(text)
        codes = ";".join(self._CODES[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def visible_len(s):
    return len(_ANSI.sub("", s))


def table(headers, rows, style, right=()):
    """Aligned columns; `right` names the columns aligned right (numbers)."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [visible_len(h) for h in headers]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], visible_len(c))

    def line(values, head=False):
        out = []
        for i, v in enumerate(values):
            pad = " " * (widths[i] - visible_len(v))
            cell = pad + v if headers[i] in right else v + pad
            out.append(style(cell, "bold") if head else cell)
        return "  ".join(out).rstrip()

    lines = [line(headers, head=True)]
    lines += [line(r) for r in cells]
    return "\n".join(lines)
