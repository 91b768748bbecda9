"""A worker process that ends when the process that started it dies: no orphan trains on.

    orphans.end_with_parent(parent_pid, busy=lambda: running.is_set())

A daemon thread watches the worker's parent (``os.getppid()`` changes when the parent dies,
on Linux and macOS alike, whatever killed it: SIGKILL, the OOM killer). Then, if the worker is
running something (``busy()``), it sends itself SIGTERM, which the stop handlers turn into a
clean stop (the run checkpoints its reached step), waits up to ``grace`` seconds for it to
end, and exits the process with 128 + SIGTERM; an idle worker exits at once. A watchdog is used
rather than ``prctl(PR_SET_PDEATHSIG)``, which fires when the *thread* that started the worker
ends (a pool may start workers from a helper thread) and exists only on Linux.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Callable

PERIOD_S = 0.5  # how often the parent is looked at
GRACE_S = 120.0  # how long a run may take to checkpoint and stop once the parent is gone


def _watch(parent: int, busy: Callable[[], bool], period: float, grace: float) -> None:
    while os.getppid() == parent:
        time.sleep(period)
    print(f"[worker {os.getpid()}] the sweep's process {parent} is gone: stopping",
          file=sys.stderr, flush=True)
    if busy():
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + grace
        while busy() and time.monotonic() < deadline:
            time.sleep(period)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signal.SIGTERM)


def end_with_parent(parent: int, busy: Callable[[], bool] = lambda: False,
                    period: float = PERIOD_S, grace: float = GRACE_S) -> threading.Thread:
    """Start the watchdog of this process's ``parent`` (its pid); returns the thread."""
    thread = threading.Thread(target=_watch, args=(parent, busy, period, grace), daemon=True,
                              name=f"watching parent {parent}")
    thread.start()
    return thread
