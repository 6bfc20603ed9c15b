"""One progress line for long commands: which part of the plan runs (e.g. "arm 2 of 4 grpo: train"), its
step or task s of S, the time elapsed and an ETA over the whole plan.

On a terminal the line is redrawn in place (carriage return, on stderr); anywhere else (CI logs, files) it
is a plain log record (logger `sqlrl.progress`, INFO) when a part starts or ends and at most every
`every_s` seconds in between. The ETA is the work left times the seconds one unit of each pace (a
GRPO step, an SFT step, an evaluated task) took so far in this process; while a pace left to do has not
been timed yet, the ETA is a lower bound (">= 3:10") or "?" when nothing has been timed. Other output goes
above the line (`pause_line`); a finished part's last line stays on the screen, never drawn again below.
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
from dataclasses import dataclass

log = logging.getLogger("sqlrl.progress")

_ACTIVE: list[Progress] = []  # the progress line drawn on the terminal now (at most one)


@dataclass
class Part:
    label: str  # e.g. "arm 2 of 4 grpo: train"
    kind: str  # the unit: "step" or "task"
    total: int
    done: int = 0
    closed: bool = False
    pace: str = ""  # the key its units are timed under (e.g. "sft step"); `kind` when empty

    @property
    def rate_key(self) -> str:
        return self.pace or self.kind


def clock_text(seconds: float) -> str:
    """`seconds` as H:MM:SS, or M:SS under an hour."""
    s = max(0, int(round(seconds)))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """The progress of a plan of parts. `open(i, total, initial)` returns a handle with tqdm's
    `update(n)`, `set_postfix(**kw)` and `close()`; `skip(i)` marks a part finished before."""

    def __init__(self, title: str, parts: list[Part], *, stream=None, every_s: float = 30.0, clock=None):
        self.title, self.parts, self.every_s = title, parts, every_s
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock or time.monotonic
        self.t0 = self.clock()
        self.seconds: dict[str, float] = {}  # kind -> seconds measured
        self.units: dict[str, int] = {}  # kind -> units measured
        self.current: int | None = None
        self.postfix = ""
        self._last_log = float("-inf")
        self._width = 0
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty())

    # -------------------------------------------------------------------------------- the plan

    def skip(self, i: int) -> None:
        p = self.parts[i]
        p.done, p.closed = p.total, True

    def open(self, i: int, total: int | None = None, initial: int = 0) -> PartHandle:
        p = self.parts[i]
        if total is not None:
            p.total = total
        p.done, p.closed = min(initial, p.total), False
        self.current, self.postfix = i, ""
        self._emit(force=True)
        return PartHandle(self, i)

    def measured(self, kind: str, seconds: float, units: int) -> None:
        self.seconds[kind] = self.seconds.get(kind, 0.0) + seconds
        self.units[kind] = self.units.get(kind, 0) + units

    def eta(self) -> str:
        left, unknown = 0.0, False
        for p in self.parts:
            todo = max(0, p.total - p.done) if not p.closed else 0
            if not todo:
                continue
            if self.units.get(p.rate_key):
                left += todo * self.seconds[p.rate_key] / self.units[p.rate_key]
            else:
                unknown = True
        if not unknown:
            return clock_text(left)
        return f">= {clock_text(left)}" if left > 0 else "?"

    def line(self) -> str:
        head = f"[{self.title}]"
        if self.current is not None:
            p = self.parts[self.current]
            head += f" {p.label} {p.kind} {p.done} of {p.total}"
        text = f"{head} | {clock_text(self.clock() - self.t0)} elapsed | ETA {self.eta()}"
        return text + (f" | {self.postfix}" if self.postfix else "")

    # ---------------------------------------------------------------------------- drawing

    def _emit(self, force: bool = False) -> None:
        if self.tty:
            text = self.line()[: max(20, shutil.get_terminal_size().columns - 1)]  # one row: no wrap
            self.stream.write("\r" + text.ljust(self._width))
            self.stream.flush()
            self._width = len(text)
            if self not in _ACTIVE:
                _ACTIVE.append(self)
            return
        now = self.clock()
        if force or now - self._last_log >= self.every_s:
            self._last_log = now
            log.info(self.line())

    def clear(self) -> None:
        """Erase the terminal line (before other output); `_emit` draws it again."""
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0

    def finish(self) -> None:
        """End the line (a newline on a terminal); later output starts on a fresh line."""
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0
        if self in _ACTIVE:
            _ACTIVE.remove(self)


class PartHandle:
    """One part's tqdm-like view: `update(n)` counts units done and times them."""

    def __init__(self, progress: Progress, index: int):
        self.progress, self.index = progress, index
        self.t_last = progress.clock()

    def update(self, n: int = 1) -> None:
        pr, p = self.progress, self.progress.parts[self.index]
        now = pr.clock()
        pr.measured(p.rate_key, now - self.t_last, n)
        self.t_last = now
        p.done = min(p.total, p.done + n)
        pr._emit(force=p.done >= p.total)

    def set_postfix(self, **kw) -> None:
        self.progress.postfix = " ".join(f"{k} {v}" for k, v in kw.items())

    def close(self) -> None:
        self.progress.parts[self.index].closed = True


def open_part(progress, *, title: str, label: str, kind: str, total: int, initial: int = 0):
    """The handle a loop reports to: None without `progress`; a one-part `Progress` of its own for
    `True`; `progress(total, initial)` when the caller passes its plan's opener (a callable)."""
    if not progress:
        return None
    if callable(progress):
        return progress(total, initial)
    pr = Progress(title, [Part(label, kind, total)])
    return _OwnedHandle(pr, pr.open(0, total, initial))


class _OwnedHandle:
    """A handle whose `close()` also ends its own one-part line."""

    def __init__(self, progress: Progress, handle: PartHandle):
        self.progress, self.handle = progress, handle

    def update(self, n: int = 1) -> None:
        self.handle.update(n)

    def set_postfix(self, **kw) -> None:
        self.handle.set_postfix(**kw)

    def close(self) -> None:
        self.handle.close()
        self.progress.finish()


def pause_line() -> Progress | None:
    """Make room for other output on the terminal: a line whose part is finished is ended (its last state
    stays above the output; the next part draws a new line) and None returned; else the line is erased
    and returned for `resume_line` to draw again below the output."""
    if not _ACTIVE:
        return None
    pr = _ACTIVE[-1]
    if pr.current is not None and pr.parts[pr.current].done >= pr.parts[pr.current].total:
        pr.finish()
        return None
    pr.clear()
    return pr


def resume_line(pr: Progress | None) -> None:
    if pr is not None and pr in _ACTIVE:
        pr._emit()


def finish_line() -> None:
    """End every progress line drawn on the terminal (e.g. on Ctrl-C), leaving its last state visible."""
    for pr in list(_ACTIVE):
        pr.finish()
