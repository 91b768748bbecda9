"""A command's first line, printed by the command before it imports JAX.

    if __name__ == "__main__":          # the top of launch/NAME.py, before its imports
        from .starting import main
        raise SystemExit(main("NAME", __package__))

``main`` prints ``[NAME] starting`` within a second of the start (not with ``--help``, nor
with ``CFSL_PROGRESS=0``), imports the command's module inside ``starting`` -- which prints
``  still [NAME] starting (Ns: ...)`` every ``STARTING_HEARTBEAT_S`` seconds from a thread
it owns, until its block ends (importing JAX takes seconds, more on a loaded machine) -- and
runs the command. The ``cfsl-NAME`` scripts call ``main`` the same way (``script``).
Importing this module (or any command's) prints nothing and starts no thread. Every command
defines its flags without JAX and imports its library only once absl has parsed
them, inside ``importing`` (the same lines): a mistaken flag is refused within a second.

A command's stop signals (SIGINT, SIGTERM, SIGUSR1, SIGUSR2) are handled from ``main``'s first
line, before JAX is imported: until ``cli.run`` installs the real handlers
(``cfsl_jax.runtime.stops``, which replaces these), a stop prints one line (nothing was run or
written) and exits with 128 + the signal's number at once.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
import time
from typing import Iterator

STARTING_HEARTBEAT_S = 9.5  # under the 10 s between two progress lines
_HELP = ("--help", "-h", "-?", "--helpshort", "--helpfull")


def announced(args: list[str]) -> bool:
    """Whether a command given ``args`` says it started (not for help, nor CFSL_PROGRESS=0)."""
    quiet = os.environ.get("CFSL_PROGRESS", "1") in ("0", "false", "False")
    return not quiet and not any(a.split("=")[0] in _HELP for a in args)


@contextlib.contextmanager
def starting(name: str, period: float = STARTING_HEARTBEAT_S,
             announce: bool = True, first_line: bool = True) -> Iterator[None]:
    """``[name] starting`` now (``announce`` and ``first_line``), then ``  still [name]
    starting (...)`` every ``period`` s until the block ends; leaving it stops the thread."""
    if not announce:
        yield
        return
    if first_line:
        print(f"[{name}] starting", flush=True)
    began, stop = time.monotonic(), threading.Event()
    said = [began]  # when the last line was printed

    def beat():
        while not stop.wait(period):
            print(f"  still [{name}] starting ({time.monotonic() - began:.1f}s: importing JAX "
                  f"and the command's modules)", flush=True)
            said[0] = time.monotonic()

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        from cfsl_jax.runtime import progress  # light (no JAX); imported by the command anyway
        progress.said(said[0])  # the command's first heartbeat counts from this line


def importing(name: str) -> Iterator[None]:
    """Inside: command ``name`` imports its library (JAX) once absl has parsed its flags -- a
    mistaken flag is refused in a fraction of a second -- with the ``  still [name] starting``
    lines of ``starting`` (its first line was printed by ``main``)."""
    return starting(name, announce=announced(sys.argv[1:]), first_line=False)


def _stop_while_starting(signum, frame):  # a command's first instants: keep it light
    import signal
    os.write(2, f"\ninterrupted by {signal.Signals(signum).name} while starting: nothing was run "
                f"or written; run the same command again\n".encode())
    os._exit(128 + signum)


_stop_while_starting.stops_early = True  # stops.install replaces it


def install_early_stops() -> None:
    """``_stop_while_starting`` for each stop signal still at Python's default (one ignored by
    the parent stays ignored)."""
    import signal
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        if signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(signum, _stop_while_starting)


def main(name: str, package: str | None = None) -> None:
    """Run command ``name`` (``launch/NAME.py``'s ``run``), its first line first."""
    if threading.current_thread() is threading.main_thread():
        install_early_stops()
    with starting(name, announce=announced(sys.argv[1:])):
        module = importlib.import_module(f"{package or 'cfsl_jax.launch'}.{name}")
    module.run()


def script() -> None:
    """The ``cfsl-NAME`` scripts (setup.cfg): command NAME, from the script's name."""
    main(os.path.basename(sys.argv[0]).removeprefix("cfsl-").replace("-", "_"))
