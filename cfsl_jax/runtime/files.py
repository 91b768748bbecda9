"""The files of runs, sweeps and reports, on a local disk or on cloud storage (``etils.epath``).

    files.join("gs://bucket/sweep", "omniglot", "results.json")  # gs://bucket/sweep/omniglot/...
    files.write_atomic("gs://bucket/run/results.json", text)      # readers: old or new, whole
    files.read_text(path); files.exists(path); files.walk(root, skip=("checkpoints",))

Every file a run, a sweep, FLUID, a report or ``verify`` reads or writes goes through this
module, so a workdir may be a local path or a ``gs://`` URL (``etils.epath`` through fsspec: the
``gcsfs`` package must be installed, ``check_url`` says so in one line; orbax writes the
checkpoints there itself).

Rules:

- A path is a ``str``. ``absolute`` makes a local path absolute and keeps a URL as given
  (``os.path.abspath("gs://b/x")`` would be a local folder ``gs:/b/x``).
- ``write_atomic`` writes a temporary file in the target's folder (a hidden name ending in
  ``.tmp``) and renames it over the target. On a local disk (or NFS) the rename is POSIX
  ``rename``: a reader sees the old file or the new one, never part of one; a kill leaves the
  old file (and at worst a stray temporary); the file and then its folder are ``fsync``-ed, so
  a power loss does too. On an object store (``gs://``) a rename is a copy
  then a delete: the copy replaces the target object in one step (an object is never seen
  half-written), and a kill between the two leaves a stray temporary object.
  Two writers at once (two sweep shards writing the report): the last one's file wins, whole.
- A full disk is ``disk.DiskFull`` (one line naming the folder and the bytes the write needed),
  checked before the write where the free space is known; ``write_atomic`` then leaves no
  temporary behind.
- ``append_text`` appends (``O_APPEND``) on a local disk; an object store cannot append, so
  there the file is read and written again whole, atomically (fine for the small file it is
  used for: a run's ``metrics.jsonl``, whose line cut short by a kill is skipped when read and
  dropped on resume).
- ``walk`` lists folders itself (``listdir`` and ``isdir``): the same on every filesystem.
"""

from __future__ import annotations

import os
import uuid
from typing import Iterator, Sequence

from etils import epath

from cfsl_jax.runtime import disk
from cfsl_jax.runtime.errors import UserError


def is_url(path: str | os.PathLike | None) -> bool:
    """Whether ``path`` names a location by URL (``gs://bucket/x``), not a local path."""
    return path is not None and "://" in os.fspath(path)


def path(name: str | os.PathLike) -> epath.Path:
    """``name`` as an ``epath.Path`` (what orbax and the filesystem calls take)."""
    return epath.Path(name)


def absolute(name: str) -> str:
    """A local path made absolute (``os.path.abspath``: ``~`` is not expanded, as every other
    use of the path reads it); a URL as given."""
    return name if is_url(name) else os.path.abspath(name)


def join(first: str, *rest: str) -> str:
    """``os.path.join`` for local paths; ``gs://b/x`` + ``y`` -> ``gs://b/x/y`` for URLs."""
    if is_url(first):
        return str(path(first).joinpath(*rest))
    return os.path.join(first, *rest)


def dirname(name: str) -> str:
    """The folder of ``name`` (absolute for a local path)."""
    return str(path(absolute(name)).parent)


def basename(name: str) -> str:
    return path(name).name


def exists(name: str) -> bool:
    return path(name).exists()


def isdir(name: str) -> bool:
    return path(name).is_dir()


def isfile(name: str) -> bool:
    return path(name).is_file()


def makedirs(name: str) -> None:
    """Create the folder ``name`` and its parents (nothing when it exists)."""
    path(name).mkdir(parents=True, exist_ok=True)


def listdir(name: str) -> list[str]:
    """The names in folder ``name``, sorted ([] when it does not exist)."""
    return sorted(p.name for p in path(name).iterdir()) if isdir(name) else []


def walk(root: str, skip: Sequence[str] = ()) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(root)`` top-down in sorted order, on any filesystem; folders named in ``skip``
    are not entered (a caller may also prune ``dirs`` in place)."""
    names = listdir(root)
    dirs = [n for n in names if n not in skip and isdir(join(root, n))]
    files = [n for n in names if n not in dirs and n not in skip]
    yield root, dirs, files
    for name in dirs:
        yield from walk(join(root, name), skip)


def read_text(name: str) -> str:
    with path(name).open("r") as f:
        return f.read()


def read_bytes(name: str) -> bytes:
    with path(name).open("rb") as f:
        return f.read()


def write_atomic(name: str, data: str | bytes) -> None:
    """Write ``data`` to ``name`` through a temporary file in the same folder, then a rename
    (what a reader and a kill see: the module's rules); the folder is created if missing."""
    target = path(absolute(name))
    temporary = target.parent / f".{target.name}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        with disk.space_checked(str(target.parent), len(data)):
            target.parent.mkdir(parents=True, exist_ok=True)
            with temporary.open("wb" if isinstance(data, bytes) else "w") as f:
                f.write(data)
                if not is_url(name):  # on the disk before the rename: a power loss leaves
                    _fsync(f)  # the old file or the new one, never an empty new name
            temporary.replace(target)
            if not is_url(name):
                _fsync_folder(str(target.parent))
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _fsync(f) -> None:
    """``f`` flushed to the disk; a no-op where the filesystem cannot (EINVAL)."""
    try:
        f.flush()
        os.fsync(f.fileno())
    except (OSError, AttributeError, ValueError):
        pass


def _fsync_folder(folder: str) -> None:
    """The folder's entries (a rename) on the disk; a no-op where a folder cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def append_text(name: str, text: str) -> None:
    """Append ``text`` to ``name`` (created if missing; see the module's rules)."""
    if not is_url(name):
        with disk.space_checked(dirname(name), len(text)):
            makedirs(dirname(name))
            with open(name, "a", encoding="utf-8") as f:
                f.write(text)
        return
    write_atomic(name, (read_text(name) if exists(name) else "") + text)


def remove(name: str) -> None:
    """Delete the file ``name`` (nothing when it does not exist)."""
    path(name).unlink(missing_ok=True)


def rmtree(name: str) -> None:
    """Delete the folder ``name`` and everything in it (nothing when it does not exist)."""
    path(name).rmtree(missing_ok=True)


def check_url(flag: str, name: str | None) -> None:
    """``--flag=name`` given as a URL must be ``gs://`` with the ``gcsfs`` package installed
    (what fsspec reads gs:// with); one ``UserError`` line otherwise."""
    if not is_url(name):
        return
    scheme = name.split("://", 1)[0]
    if scheme != "gs":
        raise UserError(f"--{flag}={name}: {scheme}:// is not supported (a local path or gs://)")
    import fsspec
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError:
        raise UserError(f"--{flag}={name}: gs:// paths need the gcsfs package, which is not "
                        f"installed: pip install gcsfs") from None
