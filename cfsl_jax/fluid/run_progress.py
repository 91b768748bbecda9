"""A FLUID run's progress over its method runs: a line after each with the whole run's ETA, and
what a stop keeps and what it loses.

    with run_progress.tracking(config.streams, first=0, streams=3, methods=config.methods,
                               path=W/results.json) as tracked:
        ...                                   # run_methods calls started() / finished()
    # a stop inside: StopRequested whose message says what results.json keeps and what is lost

A stream is the unit a run stores (``results.json`` is rewritten after each), so a stop during
stream ``i`` keeps streams ``0 .. i-1`` and loses the methods already run on stream ``i``; the
message names them. Method runs on validation streams (a "new class" threshold) are not
counted in the ETA.
"""

from __future__ import annotations

import contextlib
import contextvars
import signal
import time
from typing import Iterator, Sequence

from cfsl_jax.runtime import progress, stops


class RunProgress:
    """Method runs done of a run's remaining streams x methods, and where the run is."""

    def __init__(self, kind: str, first: int, streams: int, methods: Sequence[str], path: str):
        self.kind, self.first, self.streams = kind, first, streams
        self.methods, self.path = tuple(methods), path
        self.total = (streams - first) * len(self.methods)
        self.run_started = time.perf_counter()
        self.stream, self.method = first, None  # where the run is
        self.finished_here: list[str] = []  # methods finished on ``stream``
        self.stream_started = time.perf_counter()
        self.done = 0

    def started(self, index: int, name: str) -> None:
        if index != self.stream:
            self.stream, self.finished_here = index, []
            self.stream_started = time.perf_counter()
        self.method = name

    def finished(self, index: int, name: str, seconds: float) -> None:
        self.finished_here.append(name)
        self.method, self.done = None, self.done + 1
        elapsed = time.perf_counter() - self.run_started
        eta = ("" if self.done >= self.total else
               f", ETA {progress.duration(elapsed / self.done * (self.total - self.done))} "
               f"(the mean method run so far, pretraining included)")
        progress.say(f"[FLUID] {self.done}/{self.total} method runs done ({self.kind} stream "
                     f"{index}: {name} in {progress.duration(seconds)}); elapsed "
                     f"{progress.duration(elapsed)}{eta}")

    def stopped(self, stop: BaseException) -> stops.StopRequested:
        """The stop, with a message that says what is kept and what is lost."""
        signum = getattr(stop, "signum", signal.SIGINT)
        position = (f"method {len(self.finished_here) + 1} of {len(self.methods)}, "
                    f"{self.method}" if self.method else "between methods")
        lost = (f"lost: the {len(self.finished_here)} method(s) already run on stream "
                f"{self.stream} ({', '.join(self.finished_here)}; "
                f"{progress.duration(time.perf_counter() - self.stream_started)} of work), as "
                f"a stream is saved whole" if self.finished_here else
                f"lost: {progress.duration(time.perf_counter() - self.stream_started)} of "
                f"work on stream {self.stream}")
        return stops.StopRequested(signum, (
            f"interrupted by {stops.name(signum)} during {self.kind} stream {self.stream} of "
            f"{self.streams} ({position}); kept: {self.stream} finished stream(s) in "
            f"{self.path}; {lost}: re-run the same command to resume at stream "
            f"{self.stream}"))


_current: contextvars.ContextVar[RunProgress | None] = contextvars.ContextVar(
    "fluid_run_progress", default=None)


@contextlib.contextmanager
def tracking(kind: str, first: int, streams: int, methods: Sequence[str],
             path: str) -> Iterator[RunProgress]:
    """Inside: method runs of ``kind`` streams are counted (``started``/``finished``), and a
    stop is raised again with what it keeps and loses (``RunProgress.stopped``)."""
    tracked = RunProgress(kind, first, streams, methods, path)
    token = _current.set(tracked)
    try:
        yield tracked
    except KeyboardInterrupt as stop:
        raise tracked.stopped(stop) from None
    finally:
        _current.reset(token)


def started(kind: str, index: int, name: str) -> None:
    """Method ``name`` starts on stream ``index`` of ``kind`` (counted in a ``tracking`` block
    of that kind only)."""
    tracked = _current.get()
    if tracked is not None and tracked.kind == kind:
        tracked.started(index, name)


def finished(kind: str, index: int, name: str, seconds: float) -> None:
    tracked = _current.get()
    if tracked is not None and tracked.kind == kind:
        tracked.finished(index, name, seconds)
