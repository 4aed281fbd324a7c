"""Text laid out in terminal columns: how many columns a string takes, and a cell of an exact width.

Tables in the CLI align by what a terminal shows, not by `len`: wide characters (CJK, emoji) take two columns,
combining marks none, and a control character (a hand-edited store row) shows as '?' rather than moving the
cursor.
"""

from __future__ import annotations

import unicodedata


def _char_columns(char: str) -> int:
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in "WF" else 1


def printable(text: str) -> str:
    """`text` with its control characters shown as '?'."""
    return "".join("?" if unicodedata.category(c) == "Cc" else c for c in text)


def columns(text: str) -> int:
    """How many terminal columns `text` takes once printable."""
    return sum(_char_columns(c) for c in printable(text))


def pad(text: str, width: int) -> str:
    """`text` (printable) followed by spaces up to `width` columns; never cut."""
    shown = printable(text)
    return shown + " " * max(0, width - columns(shown))


def fit(text: str, width: int) -> str:
    """`text` in exactly `width` terminal columns, cut with '~' when longer."""
    shown = printable(text)
    if columns(shown) <= width:
        return pad(shown, width)
    kept, used = [], 0
    for char in shown:
        if used + _char_columns(char) > width - 1:
            break
        kept.append(char)
        used += _char_columns(char)
    return "".join(kept) + "~" + " " * (width - 1 - used)
