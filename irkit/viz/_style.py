"""Shared formatting: ANSI styles, sizes, grouping of repeated calls."""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Sequence

from irkit.viz._flops import format_count
from irkit.viz._summary import Call

__all__ = [
    "Style",
    "CallGroup",
    "group_calls",
    "format_bytes",
    "format_count",
    "plural",
]

_CODES = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
}


@dataclasses.dataclass(frozen=True)
class Style:
    """Wraps text in ANSI escapes when ``color`` is true, else returns it unchanged."""

    color: bool = False

    def __call__(self, text: str, *styles: str) -> str:
        if not self.color or not styles:
            return text
        codes = ";".join(_CODES[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"


def plural(n: int, word: str) -> str:
    """``plural(1, "node") → "1 node"``, ``plural(3, "node") → "3 nodes"``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def format_bytes(n: int) -> str:
    """``8608 → "8.4 KiB"``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


@dataclasses.dataclass
class CallGroup:
    """Consecutive sibling calls of one body whose paths differ only in a trailing index."""

    calls: list[Call]

    @property
    def first(self) -> Call:
        return self.calls[0]

    def label(self, parent: str) -> str:
        first = self.calls[0].label(parent)
        if len(self.calls) == 1:
            return first
        return f"{first} … {self.calls[-1].label(parent)}"


_INDEXED = re.compile(r"^(.*?)(\d+)$")


def indexed_successor(prev: str, path: str) -> bool:
    """``layers.4`` follows ``layers.3``: same prefix, trailing index one higher."""
    a, b = _INDEXED.match(prev), _INDEXED.match(path)
    return bool(a and b and a.group(1) == b.group(1) and int(b.group(2)) == int(a.group(2)) + 1)


def _follows(prev: Call, call: Call) -> bool:
    same = prev.body is call.body and prev.params == call.params
    return same and indexed_successor(prev.path, call.path)


def group_calls(calls: Sequence[Call], expand: Sequence[str] = ()) -> list[CallGroup]:
    """Group runs like ``layers.0 … layers.63``; calls matching a glob in ``expand`` stay
    single (the rest of their run stays grouped)."""
    groups: list[CallGroup] = []
    for call in calls:
        if groups and _follows(groups[-1].calls[-1], call):
            groups[-1].calls.append(call)
        else:
            groups.append(CallGroup([call]))
    if not expand:
        return groups
    result: list[CallGroup] = []
    for group in groups:
        run: list[Call] = []
        for call in group.calls:
            if any(fnmatch.fnmatchcase(call.path, pattern) for pattern in expand):
                if run:
                    result.append(CallGroup(run))
                    run = []
                result.append(CallGroup([call]))
            else:
                run.append(call)
        if run:
            result.append(CallGroup(run))
    return result
