"""Progress lines with an ETA, for every place a user waits (commands and notebooks alike).

    from cfsl_jax.runtime import progress
    with progress.stage("compiling the meta-training step"):    # a line now, its seconds at the end
        compiled = step.lower(*args).compile()
    bar = progress.tracker("train", total=2000, unit="steps")
    for i in range(2000):
        ...
        bar.update(i + 1, loss=loss, acc=acc)   # prints at most every INTERVAL_S, and at the end

Lines are plain ``print``s to ``sys.stdout`` (looked up at each call), flushed at once, so
they show in a terminal, in a log file and in a Jupyter/Colab cell alike (absl's INFO lines
do not reach a notebook). A tracker prints when ``INTERVAL_S`` seconds passed since its last
line, on its first update and on its last; while one update takes longer than that (a
first step that compiles, a chunk of evaluation tasks), a background thread repeats the last
count with the seconds since, every ``HEARTBEAT_S`` (counted from the last line of any
tracker where the tracker began after it: an evaluation inside training does not add its own
10 s to the training's silence), for as long as the tracker is in use:
until its ``with`` block ends (``with progress.tracker(...) as bar:``), it is done, or (a
tracker not used as a context manager) nothing refers to it any more -- the function that
made it returned, or a new one replaced it. Lines are driven by time, not by a count. A
tracker's rate and ETA are those of its steady state: the first update that counts items (whose time includes compiling the
program) is left out, and its seconds are shown apart (``first N steps: 12.0s, not in
the rate``); until a second update gives a steady rate, no ETA is shown. A stage that runs long (an XLA
compilation) prints ``still ...`` every ``HEARTBEAT_S`` seconds from a background thread,
so a user never waits a minute in silence. ``CFSL_PROGRESS=0`` silences every line; inside
``with prefixed("name: ")`` (a sweep run) every line starts with the prefix.

``clock`` (seconds, monotonic) is a module attribute so that tests can replace it.

A stop signal (``cfsl_jax.runtime.stops``) that Python dropped in a callback is raised again by the
next ``Tracker.update``.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable, Iterator

from cfsl_jax.runtime import stops

INTERVAL_S = 10.0  # the most seconds between two lines of one tracker
HEARTBEAT_S = 10.0  # seconds between "still ..." lines of a long stage or a slow update
FIRST_SHOWN_S = 1.0  # a first update that took longer has its seconds on the line
STOP_POLL_S = 0.05  # wait_ready answers a stop signal within this many seconds
_prefix: contextvars.ContextVar[str] = contextvars.ContextVar("progress_prefix", default="")

clock: Callable[[], float] = time.monotonic
_trackers: list[weakref.ref] = []  # made and not yet finished, oldest first (heartbeats)
_stages: list[str] = []  # stages running (their own "still ..." lines)
_lock = threading.Lock()
_said_at = time.monotonic()  # when the last line was said (heartbeats count from it)


def enabled() -> bool:
    return os.environ.get("CFSL_PROGRESS", "1") not in ("0", "false", "False")


def say(line: str) -> None:
    """Print one progress line now (to the current ``sys.stdout``, flushed)."""
    global _said_at
    if enabled():
        print(_prefix.get() + line, file=sys.stdout, flush=True)
        _said_at = time.monotonic()


def said(at: float) -> None:
    """Note a line printed at ``at`` (``time.monotonic()``) by other code (a command's first
    line): heartbeats count from it."""
    global _said_at
    _said_at = at


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
        self.warm: tuple[float, int] | None = None  # (time, done) of the first counting update
        self.first_shown = False  # the first update's seconds were printed
        self.done = start  # the last update's count
        # the heartbeat's own clock (real time, so that tests may replace ``clock``)
        self._line_at = self._updated_at = time.monotonic()
        self._beat_every = HEARTBEAT_S
        self._thread_id = threading.get_ident()
        self._stop = threading.Event()  # set: the heartbeat ends (closed, done or collected)
        self._thread: threading.Thread | None = None
        with _lock:  # drop the finished and the collected
            _trackers[:] = [ref for ref in _trackers if (t := ref()) is not None and t._running()]
            if self._running():
                _trackers.append(weakref.ref(self))
        if self._running():  # beats from now: its first update may compile a program
            self._thread = threading.Thread(target=contextvars.copy_context().run, args=(
                _beat, weakref.ref(self), self._stop), daemon=True)
            self._thread.start()
            weakref.finalize(self, self._stop.set)  # collected: the heartbeat ends too

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """End the heartbeat (leaving the tracker's ``with`` block does)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def line(self, done: int, **values: Any) -> str:
        now = clock()
        elapsed = max(now - self.started, 1e-9)
        steady = self.warm is not None and done > self.warm[1]
        rate = ((done - self.warm[1]) / max(now - self.warm[0], 1e-9) if steady
                else (done - self.start_done) / elapsed)
        unit = f" {self.unit}" if self.unit else ""
        parts = [f"[{self.what}] {done}/{self.total}{unit}"]
        if self.total:
            parts[0] += f" ({100 * done / self.total:.0f}%)"
        if done > self.start_done and (steady or done >= self.total):
            parts.append(f"{rate:.3g}{unit or ' items'}/s" if rate >= 0.1 else
                         f"{1 / max(rate, 1e-9):.3g}s each")
        parts += [f"{name} {_value(value)}" for name, value in values.items()]
        if self.warm is not None and not self.first_shown and done < self.total:
            self.first_shown = True
            if self.warm[0] - self.started >= FIRST_SHOWN_S:  # e.g. it compiled a program
                parts.append(f"first {self.warm[1] - self.start_done}{unit}: "
                             f"{duration(self.warm[0] - self.started)}, not in the rate")
        if done >= self.total:
            parts.append(f"done in {duration(elapsed)}")
        elif steady:
            parts.append(f"ETA {duration((self.total - done) / max(rate, 1e-9))}")
        return ", ".join(parts)

    def _running(self) -> bool:
        return not self._stop.is_set() and self.done < self.total

    def _beat_once(self) -> bool:
        """One heartbeat poll: repeat the last count when no update printed for ``_beat_every``
        s, unless a newer tracker of the same thread runs (an evaluation inside training) or a
        stage prints its own; False once the tracker is closed or done."""
        poll = self._beat_every / 20  # a line comes before ``_beat_every`` s pass, not after
        with _lock:
            if not self._running():
                _trackers[:] = [ref for ref in _trackers if ref() not in (None, self)]
                return False
            live = [t for ref in _trackers if (t := ref()) is not None]
            newer = live[live.index(self) + 1:] if self in live else []
            inner = any(t._thread_id == self._thread_id and t._running() for t in newer)
        now = time.monotonic()
        # from the last line of any tracker: an evaluation inside training beats 10 s after
        # the training's last line, not 10 s after it began
        # ... but only while this tracker's own update is slow: a quick one never beats
        quiet = now - min(self._line_at, _said_at)
        slow = now - self._updated_at >= min(FIRST_SHOWN_S, self._beat_every / 2)
        if not inner and not _stages and slow and quiet >= self._beat_every - poll:
            say(f"[{self.what}] {self.done}/{self.total}"
                + (f" {self.unit}" if self.unit else "")
                + f", still working ({duration(now - self._updated_at)} since "
                  + ("this count was read; work dispatched since is not counted yet)"
                     if self.warm else f"[{self.what}] began)"))
            self._line_at = now
        return True

    def due(self) -> bool:
        """Whether the next ``update`` prints (to sync a device value only when it does)."""
        return not self.printed or clock() - self.last >= self.interval

    def update(self, done: int, force: bool = False, **values: Any) -> bool:
        """Print a line if it is time (or ``force``, or the first or last update); raise a stop
        signal that was noted and lost (module doc)."""
        stops.raise_pending()
        now = clock()
        if self.warm is None and done > self.start_done:
            self.warm = (now, done)
        self.done, self._updated_at = done, time.monotonic()
        due = not self.printed or now - self.last >= self.interval
        last = done >= self.total and not (self.quiet_if_quick and self.lines == 0)
        if force or due or last:
            say(self.line(done, **values))
            self.last, self.printed, self.lines = now, True, self.lines + 1
            self._line_at = time.monotonic()
            return True
        return False


def _beat(ref: weakref.ref, stop: threading.Event) -> None:
    """A tracker's heartbeat thread (holding no reference to it between polls, so that a
    tracker nothing refers to is collected and its heartbeat ends)."""
    while True:
        tracker = ref()
        if tracker is None:
            return
        poll = tracker._beat_every / 20
        del tracker
        if stop.wait(poll):
            return
        tracker = ref()
        if tracker is None or not tracker._beat_once():
            return
        del tracker


def tracker(what: str, total: int, unit: str = "", start: int = 0,
            interval: float | None = None, first_line: bool = True,
            quiet_if_quick: bool = False) -> Tracker:
    """A ``Tracker`` of ``total`` items (``start`` of them already done, e.g. on a resume), a
    context manager that ends its heartbeat; ``first_line=False``: no line on the first update
    (only when it is time, and the last);
    with ``quiet_if_quick`` too, no line at all for work done within one interval."""
    return Tracker(what, total, unit, start, interval, first_line, quiet_if_quick)


def track(items, what: str, unit: str = "", total: int | None = None) -> Iterator:
    """Iterate ``items``, printing a progress line after each one when it is time."""
    items = list(items) if total is None and not hasattr(items, "__len__") else items
    with tracker(what, len(items) if total is None else total, unit) as bar:
        bar.update(0)
        for done, item in enumerate(items, 1):
            yield item
            bar.update(done)


def wait_ready(value: Any) -> Any:
    """``jax.block_until_ready(value)``, but a stop signal is answered within ``STOP_POLL_S``
    (a thread blocked in the device wait runs Python's signal handlers only when the device is
    done); see ``finish_on_stop``."""
    import jax  # progress is imported before JAX by the commands' first lines

    leaves = [x for x in jax.tree.leaves(value) if hasattr(x, "is_ready")]
    poll = 0.001  # doubling up to STOP_POLL_S: a quick program is not held back
    while not all(x.is_ready() for x in leaves):
        time.sleep(poll)  # a stop signal's handler runs (and raises) here
        poll = min(2 * poll, STOP_POLL_S)
    stops.raise_pending()
    return value


@contextlib.contextmanager
def finish_on_stop(in_flight: Callable[[], Any], what: str) -> Iterator[None]:
    """A stop signal inside waits for the device work ``in_flight()`` under the stage ``what``
    (a line now, its seconds at the end) and goes on: a device cannot drop a program it runs,
    and the process could not exit before it ends, so it says so rather than exit in silence.
    A second stop signal meanwhile is dropped."""
    try:
        yield
    except (KeyboardInterrupt, SystemExit):  # SystemExit: a scheduler's handler (stops doc)
        import jax

        with stops.stopping(), stage(what):
            jax.block_until_ready(in_flight())
        raise


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
    _stages.append(what)
    try:
        yield
    finally:
        _stages.remove(what)
        stop.set()
        thread.join()
    if announced.is_set():
        say(f"{what}: done in {duration(clock() - started)}")
