"""Progress of a long export on a terminal: the stage, tensors written, MB written, the rate.

:class:`Progress` writes its stage and weights lines only when the stream is a terminal
(``isatty()``) and it is not silenced: piped or redirected output (logs, CI, tests) gets only
the notes (warnings, figures), and ``quiet`` silences those too. While the weights
are written, one line is redrawn in place (``\\r``) at most every ``interval`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """Stage lines and a live weights line on a terminal; nothing elsewhere.

    Args:
        stream: Where to write (the command line passes ``sys.stderr``).
        quiet: Write nothing, terminal or not.
        interval: Seconds between two redraws of the weights line.
        clock: Seconds, monotonic (tests pass their own).
    """

    def __init__(
        self,
        stream: TextIO,
        *,
        quiet: bool = False,
        interval: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        isatty = getattr(stream, "isatty", None)
        self.enabled = not quiet and isatty is not None and bool(isatty())
        self._quiet = quiet
        self._stream = stream
        self._interval = interval
        self._clock = clock
        self._t0 = clock()
        self._stage = ""
        self._tensors = 0
        self._total_tensors = 0
        self._bytes = 0
        self._total_bytes = 0
        self._started = 0.0
        self._drawn = -1.0
        self._open_line = False

    def note(self, text: str) -> None:
        """A line worth keeping in a log (a warning, a figure): written unless ``quiet``,
        terminal or not."""
        if self._quiet:
            return
        self._end_line()
        self._stream.write(f"  {text}\n")
        self._stream.flush()

    def stage(self, text: str) -> None:
        """Start a stage: one line with the seconds since the start."""
        if not self.enabled:
            return
        self._end_line()
        self._stage = text
        self._stream.write(f"  {self._clock() - self._t0:6.1f} s  {text}\n")
        self._stream.flush()

    def start_writing(self, tensors: int, nbytes: int) -> None:
        """The weights are about to be written: ``tensors`` tensors, ``nbytes`` bytes in all."""
        self._tensors, self._bytes = 0, 0
        self._total_tensors, self._total_bytes = tensors, nbytes
        self._started = self._clock()
        self._drawn = -1.0

    def tensor_written(self, name: str, nbytes: int) -> None:
        """One tensor is written (an :data:`irkit.weights._writer.WriteProgress` callback)."""
        del name
        self._tensors += 1
        self._bytes += nbytes
        if not self.enabled:
            return
        now = self._clock()
        last = self._tensors >= self._total_tensors
        if last or now - self._drawn >= self._interval:
            self._drawn = now
            self._draw(now)

    def finish_writing(self) -> None:
        """The weights are written: draw the final figures and end the line."""
        if self.enabled and self._tensors:
            self._draw(self._clock())
        self._end_line()

    def _draw(self, now: float) -> None:
        elapsed = max(now - self._started, 1e-9)
        mb, total_mb = self._bytes / 1e6, self._total_bytes / 1e6
        self._stream.write(
            f"\r           tensors {self._tensors}/{self._total_tensors}, "
            f"{mb:,.0f}/{total_mb:,.0f} MB, {mb / elapsed:,.0f} MB/s"
        )
        self._stream.flush()
        self._open_line = True

    def _end_line(self) -> None:
        if self._open_line:
            self._stream.write("\n")
            self._stream.flush()
            self._open_line = False
