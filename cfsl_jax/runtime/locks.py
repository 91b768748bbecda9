"""Locks on folders: one command at a time in a run's workdir, one sweep (shard) at a time.

    with locks.workdir(workdir):   # locks.held(locks.path_in(workdir), f"workdir {workdir}")
        ...  # train: a second command on the workdir is refused (``Busy``) while this runs
    with locks.held(lock, what, excluded=lambda: [(other_lock, "the whole sweep")]):
        ...  # also refused (``Busy``) while a live process holds other_lock

A lock is a file created atomically (written under a name of its own, then hard-linked into
place, on a local disk or NFS; ``O_CREAT | O_EXCL`` where there are no hard links; on an object
store (``gs://``) written when missing and read back) that holds its holder: host, pid, the
process's start time and when the lock was taken. While held, a thread refreshes the file's
modification time every ``HEARTBEAT_S`` seconds, so that a lock of another host can be judged:

- held by this host: stale when its pid is gone (or is another process now: its start time
  differs), whatever its age;
- held by another host (a SLURM requeue on another node, a second machine on a shared
  filesystem): stale when not refreshed for ``STALE_AFTER_S`` seconds.

A command that finds a live lock is refused (``Busy``, a ``UserError``: one line naming the
holder, exit status 2). A stale lock is taken over (renamed aside atomically, so of two
commands taking it over at once one wins; on an object store, where a rename is a copy and a
delete, the one that creates the marker ``.lock.taken-<token>`` first; a file renamed aside that
is not the one judged stale, but the winner's new lock, is put back) with a line saying so. On
an object store the lock is created only if absent (``mode="create"``: GCS's generation
precondition). A lock is removed when its holder ends, also by an exception or a stop signal; a
SIGKILL leaves it behind, stale.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from typing import Callable, Iterable, Iterator

from cfsl_jax.runtime import files, progress
from cfsl_jax.runtime.errors import UserError

LOCK_FILE = ".lock"  # a workdir's lock (hidden: it exists only while a command works there)
HEARTBEAT_S = 20.0  # how often a holder refreshes its lock's modification time
STALE_AFTER_S = 120.0  # a lock of another host not refreshed for this long is stale
WRITING_S = 5.0  # an empty or unreadable lock younger than this may be being written


class Busy(UserError):
    """The folder is locked by a live holder (the message names it)."""


def path_in(folder: str, name: str = LOCK_FILE) -> str:
    return files.join(folder, name)


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot; None where unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    now = _start_time(pid)
    return started is None or now is None or now == started


def describe(holder: dict) -> str:
    if not holder:
        return "no one (the lock file is empty or damaged)"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
    return f"host {holder.get('host', '?')} pid {holder.get('pid', '?')} since {since}"


def stale(holder: dict, age_s: float) -> bool:
    """Whether a lock with ``holder`` that was refreshed ``age_s`` seconds ago is abandoned
    (an empty or unreadable one older than ``WRITING_S``: a kill cut its writing short)."""
    if not holder:
        return age_s >= WRITING_S
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
        return not _alive(holder["pid"], holder.get("started"))
    return age_s > STALE_AFTER_S


def _read(lock: str) -> tuple[dict, float] | None:
    """(holder, seconds since refreshed) of the lock file, or None when there is none."""
    try:
        text = files.read_text(lock)
        age = time.time() - (files.path(lock).stat().mtime if files.is_url(lock)
                             else os.stat(lock).st_mtime)
    except (FileNotFoundError, OSError):
        return None
    try:
        holder = json.loads(text)
    except json.JSONDecodeError:  # being written this instant, or cut short by a kill
        holder = {}
    return (holder if isinstance(holder, dict) else {}), age


def _create(lock: str, text: str) -> bool:
    """Create the lock file holding ``text``; False when it exists."""
    files.makedirs(files.dirname(lock))
    if files.is_url(lock):  # an object store: create only if absent (gcsfs: ifGenerationMatch=0)
        import fsspec
        store, where = fsspec.core.url_to_fs(lock)
        try:
            store.pipe_file(where, text.encode(), mode="create")
        except FileExistsError:
            return False
        except (TypeError, NotImplementedError, ValueError):  # a store without it: write when
            if files.exists(lock):  # missing, then read back (not exclusive if both write
                return False  # slower than the wait)
            files.write_atomic(lock, text)
            time.sleep(0.5)
        return files.read_text(lock) == text
    # written whole under a name of its own, then linked into place (atomic, and exclusive: a
    # link fails where the lock exists), so a kill never leaves an empty lock file behind
    new = f"{lock}.new-{uuid.uuid4().hex[:8]}"
    fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(new, lock)
    except FileExistsError:
        return False
    except OSError:  # a filesystem without hard links: create exclusively, then write
        return _create_in_place(lock, text)
    finally:
        os.unlink(new)
    return True


def _create_in_place(lock: str, text: str) -> bool:
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(lock)
        raise
    os.close(fd)
    return True


def _take_over(lock: str, judged: dict) -> None:
    """Move the stale lock of holder ``judged`` aside (one of two processes doing it at once
    succeeds). If the file moved is another holder's (a second process took the stale lock
    over between the judgement and the move), it is put back where no lock was created since
    (a hard link, which fails where one was): a live lock is never removed."""
    if files.is_url(lock):  # on an object store a rename is a copy and a delete, not atomic:
        marker = f"{lock}.taken-{judged.get('token') or 'unnamed'}"
        if not _create(marker, "1"):  # of those taking this stale lock over, the one that
            return  # creates its marker (only if absent) does
        try:
            _move_aside(lock, judged)
        finally:
            files.remove(marker)
        return
    _move_aside(lock, judged)


def _move_aside(lock: str, judged: dict) -> None:
    aside = f"{lock}.stale-{uuid.uuid4().hex[:8]}"
    try:
        files.path(lock).rename(aside)
    except (FileNotFoundError, OSError):
        return
    moved = _read(aside)  # an empty file that was not judged: a lock being created, put back
    if moved is not None and moved[0].get("token") != judged.get("token"):
        try:
            if files.is_url(lock):
                _create(lock, files.read_text(aside))
            else:
                os.link(aside, lock)
        except OSError:
            pass  # a third process created the lock meanwhile: it holds it
    files.remove(aside)


def acquire(lock: str, what: str) -> dict:
    """Take ``lock`` (of ``what``: "workdir /x") and return the holder record written;
    ``Busy`` when a live holder has it."""
    me = {"host": socket.gethostname(), "pid": os.getpid(), "started": _start_time(os.getpid()),
          "since": round(time.time(), 3), "token": uuid.uuid4().hex}
    text = json.dumps(me, sort_keys=True)
    for _ in range(5):
        if _create(lock, text):
            return me
        found = _read(lock)
        if found is None:
            continue  # released this instant: try again
        holder, age = found
        if holder.get("token") == me["token"]:
            return me
        if not holder and age < WRITING_S:
            time.sleep(0.2)
            continue  # being written: read it again
        if not stale(holder, age):
            raise Busy(f"{what} is in use by {describe(holder)} (lock file {lock}); wait for "
                       f"it to end or stop it, then run the command again")
        progress.say(f"note: taking over the stale lock of {what} (held by {describe(holder)}, "
                     f"which is gone)")
        _take_over(lock, holder)
    raise Busy(f"{what}: could not take its lock {lock} (another command keeps taking it)")


def release(lock: str, me: dict) -> None:
    """Remove ``lock`` if it is still ``me``'s."""
    found = _read(lock)
    if found is not None and found[0].get("token") == me["token"]:
        files.remove(lock)


def _heartbeat(lock: str, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_S):
        try:
            if files.is_url(lock):
                files.write_atomic(lock, files.read_text(lock))
            else:
                os.utime(lock)
        except OSError:
            pass  # removed or unreachable for a moment: the holder learns nothing new


def live(lock: str) -> dict | None:
    """The holder of ``lock`` while a live process holds it; None when it is absent or stale."""
    found = _read(lock)
    if found is None or stale(*found):
        return None
    return found[0]


def refuse_if_held(what: str, excluded: Iterable[tuple[str, str]]) -> None:
    """``Busy`` naming the holder of the first of the ``excluded`` (lock, what it locks) that
    a live process holds: ``what`` cannot run beside it."""
    for other, other_what in excluded:
        holder = live(other)
        if holder is not None:
            raise Busy(f"{what} cannot run while {other_what} runs: it is in use by "
                       f"{describe(holder)} (lock file {other}); wait for it to end or stop "
                       f"it, then run the command again")


@contextlib.contextmanager
def held(lock: str, what: str,
         excluded: Callable[[], Iterable[tuple[str, str]]] = tuple) -> Iterator[dict]:
    """Inside, ``lock`` is this process's (refreshed every ``HEARTBEAT_S``); removed after.
    ``excluded()``: the (lock, what it locks) that must not be held beside it, read once
    ``lock`` is taken (``refuse_if_held``; ``lock`` is released again then): of two commands
    excluding each other, each takes its own lock before it looks at the other's, so at most
    one runs (both are refused if they start in the same instant)."""
    me = acquire(lock, what)
    try:
        refuse_if_held(what, excluded())
    except BaseException:
        release(lock, me)
        raise
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(lock, stop), daemon=True,
                            name=f"lock heartbeat {lock}")
    beat.start()
    try:
        yield me
    finally:
        stop.set()
        release(lock, me)


def workdir_lock(folder: str) -> tuple[str, str]:
    """(lock file, what it locks) of a run's workdir, as ``workdir`` holds it."""
    return path_in(folder), f"workdir {folder}"


def workdir(folder: str):
    """The lock of a run's workdir (``held``): one command at a time writes in it (launch.train,
    launch.fluid); a second is refused (``Busy``) naming the holder."""
    return held(*workdir_lock(folder))
