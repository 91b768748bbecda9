"""A full disk is one line: the folder, how much space the write needed, what to do.

    with disk.space_checked(folder, needed_bytes):   # checked before, turned into DiskFull after
        write(...)

``space_checked`` refuses a write up front when the local filesystem of ``folder`` has less
free space than the write needs (nothing is written then), and turns a write that still runs
out of space (``ENOSPC``, or tensorstore's ``RESOURCE_EXHAUSTED`` while orbax writes a
checkpoint) into ``DiskFull``: a ``UserError`` (``error: ...``, exit status 2) naming the
folder and the space needed. The writers clean up after it (a temporary file or an orbax
temporary folder is removed), so nothing is left half-written; a run resumes from its last
checkpoint once space is freed. ``quiet_disk_full_logs`` keeps orbax's and asyncio's
tracebacks of the failed write threads off stderr.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import sys
from typing import Iterator

from cfsl_jax.runtime.errors import UserError

_TEXTS = ("No space left on device", "Disk quota exceeded", "ENOSPC")


class DiskFull(UserError):
    """No space left for a write (the message names the folder and the space needed)."""


def is_disk_full(error: BaseException | None, checkpoint: bool = False) -> bool:
    """Whether ``error`` (or an exception it was raised from) is a full disk; ``checkpoint``:
    tensorstore's ``RESOURCE_EXHAUSTED`` counts too (an orbax write)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, DiskFull):
            return True
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(error)
        if any(t in text for t in _TEXTS) or (checkpoint and "RESOURCE_EXHAUSTED" in text):
            return True
        error = error.__cause__ or error.__context__
    return False


class _DiskFullRecords(logging.Filter):
    """Drops the log records of a full disk (orbax logs each failed write thread's traceback,
    asyncio each unretrieved task's): the ``DiskFull`` line says it once."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (is_disk_full(error, checkpoint=True) or any(
            text in record.getMessage() for text in (*_TEXTS, "RESOURCE_EXHAUSTED")))


def quiet_disk_full_logs(loggers: tuple[str, ...] = ("absl", "asyncio")) -> None:
    """Keep the libraries' log records of a full disk off stderr (idempotent)."""
    for name in loggers:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DiskFullRecords) for f in logger.filters):
            logger.addFilter(_DiskFullRecords())


def quiet_closed_event_loops() -> None:
    """After a failed checkpoint write, orbax's abandoned callbacks report "Event loop is
    closed" as exceptions Python cannot raise ("Exception ignored in ..."): kept off stderr."""
    previous = sys.unraisablehook
    if getattr(previous, "disk_full_hook", False):
        return

    def hook(unraisable):
        if not (isinstance(unraisable.exc_value, RuntimeError)
                and "Event loop is closed" in str(unraisable.exc_value)):
            previous(unraisable)

    hook.disk_full_hook = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def free_bytes(folder: str) -> int | None:
    """Free bytes of the local filesystem holding ``folder`` (its nearest existing parent);
    None for a URL or where unknown."""
    if "://" in folder:
        return None
    folder = os.path.abspath(folder)
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} bytes"


def full(folder: str, needed: int, free: int | None) -> DiskFull:
    left = f" ({size(free)} free)" if free is not None else ""
    return DiskFull(f"no space left on the disk of {folder}: the write needed about "
                    f"{size(needed)}{left}; free some space (or give another folder), then run "
                    f"the same command again (a run resumes from its last checkpoint)")


def require(folder: str, needed: int) -> None:
    """``DiskFull`` when ``folder``'s filesystem has less than ``needed`` bytes free."""
    free = free_bytes(folder)
    if free is not None and free < needed:
        raise full(folder, needed, free)


@contextlib.contextmanager
def space_checked(folder: str, needed: int, checkpoint: bool = False) -> Iterator[None]:
    """Inside, a write of about ``needed`` bytes into ``folder``: refused up front where the
    space is not there, and a full disk during it is ``DiskFull``."""
    require(folder, needed)
    try:
        yield
    except DiskFull:
        raise
    except Exception as error:  # noqa: BLE001  (orbax and tensorstore wrap ENOSPC in many kinds)
        if is_disk_full(error, checkpoint):
            raise full(folder, needed, free_bytes(folder)) from None
        raise
