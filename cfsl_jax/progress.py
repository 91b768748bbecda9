"""Progress lines with an ETA, for every place a user waits (commands and notebooks alike).

    from cfsl_jax import progress
    with progress.stage("compiling the meta-training step"):    # a line now, its seconds at the end
        compiled = step.lower(*args).compile()
    bar = progress.tracker("train", total=2000, unit="steps")
    for i in range(2000):
        ...
        bar.update(i + 1, loss=loss, acc=acc)   # prints at most every INTERVAL_S, and at the end

Lines are plain ``print``s to ``sys.stdout`` (looked up at each call), flushed at once, so
they show in a terminal, in a log file and in a Jupyter/Colab cell alike (absl's INFO lines
do not reach a notebook). A tracker prints when ``INTERVAL_S`` seconds passed since its last
line, on its first update and on its last; a stage that runs long (an XLA compilation)
prints ``still ...`` every ``HEARTBEAT_S`` seconds from a background thread, so a user
never waits a minute in silence. ``CFSL_PROGRESS=0`` silences every line; inside
``with prefixed("name: ")`` (a sweep run) every line starts with the prefix.

``clock`` (seconds, monotonic) is a module attribute so that tests can replace it.

A stop signal (``cfsl_jax.stops``) that Python dropped in a callback is raised again by the
next ``Tracker.update``.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
import time
from typing import Any, Callable, Iterator

from cfsl_jax import stops

INTERVAL_S = 10.0  # the most seconds between two lines of one tracker
HEARTBEAT_S = 10.0  # seconds between "still ..." lines of a long stage
_prefix: contextvars.ContextVar[str] = contextvars.ContextVar("progress_prefix", default="")

clock: Callable[[], float] = time.monotonic


def enabled() -> bool:
    return os.environ.get("CFSL_PROGRESS", "1") not in ("0", "false", "False")


def say(line: str) -> None:
    """Print one progress line now (to the current ``sys.stdout``, flushed)."""
    if enabled():
        print(_prefix.get() + line, file=sys.stdout, flush=True)


@contextlib.contextmanager
def prefixed(prefix: str) -> Iterator[None]:
    """Every line said inside (in this thread and the stages it starts) starts with
    ``prefix``."""
    token = _prefix.set(_prefix.get() + prefix)
    try:
        yield
    finally:
        _prefix.reset(token)


def duration(seconds: float) -> str:
    """``75.3`` -> ``'1m15s'``; ``4000`` -> ``'1h06m'``; under a minute: ``'42.0s'``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class Tracker:
    """Counts ``done`` of ``total`` and prints rate and ETA lines (see the module doc)."""

    def __init__(self, what: str, total: int, unit: str = "", start: int = 0,
                 interval: float | None = None, first_line: bool = True,
                 quiet_if_quick: bool = False):
        self.what, self.total, self.unit = what, max(int(total), 0), unit
        self.interval = INTERVAL_S if interval is None else interval
        self.start_done = start
        self.started = self.last = clock()
        self.printed = not first_line
        self.quiet_if_quick = quiet_if_quick
        self.lines = 0  # lines printed so far

    def line(self, done: int, **values: Any) -> str:
        elapsed = max(clock() - self.started, 1e-9)
        rate = (done - self.start_done) / elapsed
        unit = f" {self.unit}" if self.unit else ""
        parts = [f"[{self.what}] {done}/{self.total}{unit}"]
        if self.total:
            parts[0] += f" ({100 * done / self.total:.0f}%)"
        if done > self.start_done:
            parts.append(f"{rate:.3g}{unit or ' items'}/s" if rate >= 0.1 else
                         f"{1 / max(rate, 1e-9):.3g}s each")
        parts += [f"{name} {_value(value)}" for name, value in values.items()]
        if done >= self.total:
            parts.append(f"done in {duration(elapsed)}")
        elif done > self.start_done:
            parts.append(f"ETA {duration((self.total - done) / max(rate, 1e-9))}")
        return ", ".join(parts)

    def due(self) -> bool:
        """Whether the next ``update`` prints (to sync a device value only when it does)."""
        return not self.printed or clock() - self.last >= self.interval

    def update(self, done: int, force: bool = False, **values: Any) -> bool:
        """Print a line if it is time (or ``force``, or the first or last update); raise a stop
        signal that was noted and lost (module doc)."""
        stops.raise_pending()
        now = clock()
        due = not self.printed or now - self.last >= self.interval
        last = done >= self.total and not (self.quiet_if_quick and self.lines == 0)
        if force or due or last:
            say(self.line(done, **values))
            self.last, self.printed, self.lines = now, True, self.lines + 1
            return True
        return False


def tracker(what: str, total: int, unit: str = "", start: int = 0,
            interval: float | None = None, first_line: bool = True,
            quiet_if_quick: bool = False) -> Tracker:
    """A ``Tracker`` of ``total`` items (``start`` of them already done, e.g. on a resume);
    ``first_line=False``: no line on the first update (only when it is time, and the last);
    with ``quiet_if_quick`` too, no line at all for work done within one interval."""
    return Tracker(what, total, unit, start, interval, first_line, quiet_if_quick)


def track(items, what: str, unit: str = "", total: int | None = None) -> Iterator:
    """Iterate ``items``, printing a progress line after each one when it is time."""
    items = list(items) if total is None and not hasattr(items, "__len__") else items
    bar = tracker(what, len(items) if total is None else total, unit)
    bar.update(0)
    for done, item in enumerate(items, 1):
        yield item
        bar.update(done)


@contextlib.contextmanager
def stage(what: str, heartbeat: float | None = None,
          quiet_below: float | None = None) -> Iterator[None]:
    """``what ...`` now, ``still what (Ns)`` every ``heartbeat`` s, ``what: N s`` at the end;
    with ``quiet_below``, the first line comes only once the stage has run that many seconds,
    and a stage that ends before prints nothing."""
    started = clock()
    stop = threading.Event()
    period = HEARTBEAT_S if heartbeat is None else heartbeat
    announced = threading.Event()
    if quiet_below is None:
        say(f"{what} ...")
        announced.set()

    def beat():
        if not announced.is_set():
            if stop.wait(quiet_below):
                return
            say(f"{what} ...")
            announced.set()
        while not stop.wait(period):
            say(f"  still {what} ({duration(clock() - started)})")

    thread = threading.Thread(target=contextvars.copy_context().run, args=(beat,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    if announced.is_set():
        say(f"{what}: done in {duration(clock() - started)}")
