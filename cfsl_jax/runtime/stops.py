"""Stop signals: SIGINT, SIGTERM, SIGUSR1 and SIGUSR2 end a run cleanly, at a consistent point.

    from cfsl_jax.runtime import stops
    stops.install()                    # the commands do this first
    with stops.deferred():             # a stop signal here is noted, and raised at the exit
        state = step(state)            # (the state and its step number are never torn apart)
    evaluate(...)                      # elsewhere a stop signal raises ``StopRequested`` at once

A stop signal raises ``StopRequested`` (a ``KeyboardInterrupt``, so that code which catches
``Exception`` lets it through) carrying the signal's number; a command exits with
``128 + signum``: 130 for SIGINT (Ctrl-C), 143 for SIGTERM, 138 for SIGUSR1 and 140 for
SIGUSR2 (Linux numbers), the shell's convention for a process ended by a signal. Inside
``deferred()`` the signal is only noted; the block's end raises it. The training loop runs a
step and records its result inside one, so a checkpoint always pairs a state with the step that
produced it.

``install()`` handles only the signals whose handler is still Python's default (``SIG_DFL``, or
``default_int_handler`` for SIGINT), or the launch package's handler of a command's first
instants (marked ``stops_early``: one line and an exit while JAX is imported): a signal ignored by the parent (a background job's SIGINT)
stays ignored, and a scheduler library's own handler (e.g. submitit's SIGUSR2 handler, which
raises ``SystemExit``) is left in place; ``deferred()`` holds its signal to the block's end
too (then calls it), and the training loop checkpoints on that ``SystemExit``. A handler that
calls ``handle`` itself is marked with ``aware``.

Python drops an exception raised while a garbage-collector callback or ``__del__`` runs (it
prints "Exception ignored in ..."), so a signal that lands there would be lost: the note stays,
and ``raise_pending()`` (each progress line calls it) raises it again; the dropped one prints
nothing.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any, Callable, Iterator

SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1,
                                       signal.SIGUSR2)


class StopRequested(KeyboardInterrupt):
    """A stop signal arrived (``signum``); a command exits with ``exit_status``."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message or f"stopped by {name(signum)}")
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return exit_status(self.signum)


def name(signum: int) -> str:
    """``2`` -> ``'SIGINT'``."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_status(signum: int) -> int:
    """The exit status of a command stopped by ``signum``: 128 + signum."""
    return 128 + int(signum)


class _Note:
    """The process's pending stop signal and how deep it is in ``deferred`` blocks."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.depth = 0
        self.held: list[int] = []  # signals for other libraries' handlers, held by deferred


_note = _Note()  # signals are delivered to the process: one note per process


def handle(signum: int, frame: Any = None) -> None:
    """The stop signals' handler: note the signal, and raise it unless inside ``deferred``."""
    _note.signum = signum
    if not _note.depth:
        raise StopRequested(signum)


handle.stops_aware = True  # type: ignore[attr-defined]  (it honours deferred blocks itself)


def aware(handler: Callable[[int, Any], None]) -> Callable[[int, Any], None]:
    """Mark a handler that calls ``handle`` (so honours ``deferred`` blocks) as such."""
    handler.stops_aware = True  # type: ignore[attr-defined]
    return handler


def _hold(signum: int, frame: Any = None) -> None:
    """Inside ``deferred``: a signal for another library's handler waits for the block's end."""
    _note.held.append(signum)


def pending() -> int | None:
    """The noted stop signal that was not raised yet (or was dropped), or None."""
    return _note.signum


def clear() -> None:
    _note.signum = None


def raise_pending() -> None:
    """Raise the noted stop signal (outside ``deferred`` blocks)."""
    if _note.signum is not None and not _note.depth:
        raise StopRequested(_note.signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A stop signal inside is noted and raised when the block ends (not if it raised). A
    signal handled by another library (a scheduler's handler that raises ``SystemExit``) is
    held too, and its handler runs when the block ends."""
    foreign = {}
    if _note.depth == 0 and threading.current_thread() is threading.main_thread():
        for signum in SIGNALS:
            current = signal.getsignal(signum)
            if callable(current) and not getattr(current, "stops_aware", False) and (
                    current is not signal.default_int_handler):
                foreign[signum] = current
                signal.signal(signum, _hold)
    _note.depth += 1
    try:
        yield
    finally:
        _note.depth -= 1
        for signum, handler in foreign.items():
            signal.signal(signum, handler)
        held, _note.held = _note.held, []
    for signum in held:
        foreign[signum](signum, None)
    raise_pending()


@contextlib.contextmanager
def stopping() -> Iterator[None]:
    """A stop under way (its checkpoint being written): a second stop signal inside (Ctrl-C
    pressed twice) is noted and dropped at the end, so the first one's checkpoint and its
    line are not cut short."""
    _note.depth += 1
    try:
        yield
    finally:
        _note.depth -= 1
        clear()


def install(handler: Callable[[int, Any], None] = handle) -> dict[int, Any]:
    """Handle the stop signals with ``handler`` (it must call ``handle``) where their handler is
    Python's default; returns the replaced handlers. Also keeps a stop that Python drops in a
    callback off stderr (module doc). Only the main thread can install handlers: elsewhere
    nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    replaced = {}
    for signum in SIGNALS:
        current = signal.getsignal(signum)
        if current in (signal.SIG_DFL, signal.default_int_handler) or getattr(
                current, "stops_early", False):
            replaced[signum] = signal.signal(signum, handler)
    if not getattr(sys.unraisablehook, "stops_hook", False):
        previous = sys.unraisablehook

        def hook(unraisable):
            if not isinstance(unraisable.exc_value, KeyboardInterrupt):
                previous(unraisable)

        hook.stops_hook = True  # type: ignore[attr-defined]
        sys.unraisablehook = hook
    return replaced


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Inside, the stop signals raise ``StopRequested`` (``install``); the handlers before are
    restored after."""
    replaced = install()
    try:
        yield
    finally:
        for signum, previous in replaced.items():
            signal.signal(signum, previous)
