"""A run's wall time over its sessions: ``sessions.json`` in its workdir.

    with sessions.opened([(config, workdir)]) as earlier:  # {workdir: {"seconds", "sessions"}}
        ...  # train; every checkpoint of loop.Checkpoint calls sessions.checkpointed(workdir)

A session is one process working on a run: the first command, each resume, a pack that
trains it. ``sessions.json`` holds the seconds and the number of the run's sessions, the
open one included so far. It is written when a session ends and at every checkpoint while
it runs (``checkpointed``), so a session that never ends cleanly (SIGKILL, a machine taken
away) still counts up to its last checkpoint, which is where its resume starts. A run's
``wall_seconds`` (results.json) is the sum.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator, NamedTuple, Sequence

from cfsl_jax.runtime import backend, files
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training import results
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.training.runs import config_differences

FILE = "sessions.json"


class Open(NamedTuple):
    """A session open in this process."""
    config: TrainConfig
    before: dict[str, float]  # ``earlier`` when it opened
    started: float  # time.perf_counter() when it opened


_OPEN: dict[str, Open] = {}  # workdir -> its open session
_DATA: dict[str, dict[str, str]] = {}  # workdir -> its splits' data digests (``check_data``)


def earlier(workdir: str) -> dict[str, float]:
    """``{"seconds": ..., "sessions": ...}`` of the run's sessions that ended (or reached a
    checkpoint) before this one; zeros for a new run."""
    stored = results.read_json(files.join(workdir, FILE), default={})
    return {"seconds": float(stored.get("seconds", 0.0)),
            "sessions": int(stored.get("sessions", 0))}


def record(workdir: str, config: TrainConfig, before: dict[str, float], seconds: float) -> None:
    """Count a session of ``config``'s run that has run ``seconds`` after the sessions
    ``before``; a workdir that holds no run (refused, or removed) or another config's run
    (refused) gets nothing. Recording the same session again replaces its seconds."""
    path = files.join(workdir, "config.json")
    if files.exists(path) and not config_differences(results.read_json(path), config):
        digests = _DATA.get(workdir) or results.read_json(
            files.join(workdir, FILE), default={}).get("data_sha256")
        results.write_json(files.join(workdir, FILE), {
            "seconds": round(before["seconds"] + seconds, 3),
            "sessions": before["sessions"] + 1, "matmul_precision": backend.precision(),
            **({"data_sha256": digests} if digests else {})})


def check_data(workdir: str, splits: dict) -> None:
    """UserError when the run in ``workdir`` kept steps trained on other data than ``splits``
    hold (``evaluate.data_digest`` of each split, recorded in sessions.json by its earlier
    sessions): a resume would train and test on another dataset than the steps before it (a
    re-prepared or edited dataset, another --data_dir) and silently give other numbers.
    Otherwise the digests are recorded with this session."""
    from cfsl_jax.training.evaluate import data_digest
    now = {name: data_digest(split) for name, split in splits.items()}
    stored = results.read_json(files.join(workdir, FILE), default={}).get("data_sha256") or {}
    changed = [name for name in now if name in stored and stored[name] != now[name]]
    if changed and _kept(workdir):
        source = splits[changed[0]].info.source
        raise UserError(
            f"workdir {workdir} holds a run trained on other data than {source} now holds "
            f"(SHA-256 of the {', '.join(changed)} split{'s' if len(changed) > 1 else ''} other "
            f"than its earlier sessions recorded in {FILE}): the dataset changed since; give "
            f"the --data_dir of the data it was trained on to resume it, or use a new workdir")
    _DATA[workdir] = now


def _kept(workdir: str) -> bool:
    """Whether ``workdir`` keeps any checkpoint (steps a resume continues from)."""
    root = files.join(workdir, "checkpoints")
    return any(name.isdigit() for series in ("latest", "best", "pretrained")
               for name in files.listdir(files.join(root, series)))


def check_precision(workdir: str) -> None:
    """UserError when the run in ``workdir`` kept steps computed at another matmul precision
    (``--precision``) than this process's: a resume would mix the two (and results.json would
    record only the last)."""
    stored = results.read_json(files.join(workdir, FILE), default={}).get("matmul_precision")
    now = backend.precision()
    if stored is not None and stored != now and _kept(workdir):
        raise UserError(f"workdir {workdir} holds a run trained at --precision={stored}; this "
                        f"command computes at --precision={now}: give --precision={stored} to "
                        f"resume it, or use a new workdir")


@contextlib.contextmanager
def opened(runs: Sequence[tuple[TrainConfig, str]]) -> Iterator[dict[str, dict[str, float]]]:
    """A session of each (config, workdir) of ``runs``, recorded when it ends however it ends
    (a pack's runs share one); yields each workdir's ``earlier``."""
    for _, workdir in runs:
        check_precision(workdir)
    started = time.perf_counter()
    before = {workdir: earlier(workdir) for _, workdir in runs}
    _OPEN.update({workdir: Open(config, before[workdir], started) for config, workdir in runs})
    try:
        yield before
    finally:
        for config, workdir in runs:
            _OPEN.pop(workdir, None)
            record(workdir, config, before[workdir], time.perf_counter() - started)
            _DATA.pop(workdir, None)


def checkpointed(workdir: str) -> None:
    """Record the open session of ``workdir`` so far (none open: nothing)."""
    if workdir in _OPEN:
        session = _OPEN[workdir]
        record(workdir, session.config, session.before, time.perf_counter() - session.started)
