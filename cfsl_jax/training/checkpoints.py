"""Checkpoints of a run's workdir (orbax).

    workdir/checkpoints/latest/<step>/   params + optimiser state, the newest two (resume)
    workdir/checkpoints/best/<epoch>/    params of the best ``keep_best`` epochs by val accuracy
    workdir/checkpoints/pretrained/0/    params after pretraining (learners with training="pretrain")

A checkpoint is written only after its step's loss was checked finite. Orbax writes each
checkpoint to a temporary folder and renames it when complete; then the SHA-256 of each of its
files is written into it (``checksums.seal``). Every restore checks them first
(``checksums.check_folder``): a resume checkpoint that fails (or cannot be read) is reported
in one line naming the file, removed, and the run falls back to the one before it (the same
numbers: every step's tasks are a function of its number); with none left, a ``UserError``.
A best-epoch checkpoint that fails is never ensembled: ``damaged_best`` lists them and the
training re-creates them (``repair_best``), a re-test refuses (``restore_best``). A workdir
written before checksums (no ``checksums.json``) is read unchecked, with a note. A full disk
while saving is ``disk.DiskFull`` (checked up front with the checkpoint's size; orbax's
temporary folder is removed). The workdir may be a local path or a ``gs://`` URL: orbax gets
it as an ``epath.Path`` (a local path made absolute, a URL as given).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from cfsl_jax.runtime import checksums, disk, files, progress
from cfsl_jax.runtime.errors import UserError

KEEP_LATEST = 2  # resume checkpoints kept: a damaged newest one falls back to the one before
disk.quiet_disk_full_logs()  # orbax's threads log a full disk's tracebacks: DiskFull says it


def _manager(directory: str, max_to_keep: int | None, best: bool = False
             ) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=True,
        best_fn=(lambda m: m["val_acc"]) if best else None, best_mode="max")
    return ocp.CheckpointManager(files.path(files.absolute(directory)), options=options)


class Checkpoints:
    """The three checkpoint series of one workdir."""

    def __init__(self, workdir: str, keep_best: int = 5, read_only: bool = False):
        """``read_only``: the workdir must already hold checkpoints (nothing is saved then)."""
        self.root = root = files.join(workdir, "checkpoints")
        if read_only and not files.isdir(root):
            raise FileNotFoundError(f"no checkpoints in {workdir!r} (looked for {root})")
        # checked: a workdir of this version (its JSON files have checksums); else legacy
        self.checked = checksums.from_the_start(workdir)
        if not checksums.has_manifest(workdir) and files.isdir(root):
            checksums.legacy(workdir)
        self.resume_limit: int | None = None  # restore_latest: no step after it (repair_best)
        self.latest = _manager(files.join(root, "latest"), KEEP_LATEST)
        self.best = _manager(files.join(root, "best"), keep_best, best=True)
        self.keep_best = keep_best
        self.pretrained = _manager(files.join(root, "pretrained"), 1)

    # -- saving ------------------------------------------------------------------
    def save_latest(self, step: int, params: Any, opt_state: Any) -> None:
        _save(self.latest, step, {"params": params, "opt_state": opt_state})

    def save_best(self, epoch: int, params: Any, val_acc: float) -> None:
        kept = self.best.all_steps()
        if epoch in kept:  # re-validated after a resume: same params
            return
        accs = list(self._kept_scores().values())  # None: unknown (then every epoch is saved)
        if len(kept) >= self.keep_best and None not in accs and float(val_acc) < min(accs):
            return  # below every kept epoch: orbax would delete it at once, so no write
        _save(self.best, epoch, {"params": params}, metrics={"val_acc": float(val_acc)})

    def _kept_scores(self) -> dict[int, float | None]:
        """{kept best epoch: the validation accuracy stored with it (None: unknown)}."""
        if not hasattr(self.best, "metrics"):
            return dict.fromkeys(self.best.all_steps())
        return {e: None if (acc := (self.best.metrics(e) or {}).get("val_acc")) is None
                else float(acc) for e in self.best.all_steps()}

    def save_pretrained(self, params: Any) -> None:
        _save(self.pretrained, 0, {"params": params}, force=True)

    # -- restoring ---------------------------------------------------------------
    def restore_latest(self, params: Any, opt_state: Any) -> tuple[int, Any, Any] | None:
        """(step, params, opt_state) of the newest intact checkpoint (at most
        ``resume_limit``), or None when there is none; damaged ones are removed, saying so."""
        target = {"params": _abstract(params), "opt_state": _abstract(opt_state)}
        steps = sorted(self.latest.all_steps(), reverse=True)
        if self.resume_limit is not None:
            for step in [s for s in steps if s > self.resume_limit]:
                self.latest.delete(step)  # re-created, the same, by training again
            steps = [s for s in steps if s <= self.resume_limit]
        for i, step in enumerate(steps):
            try:
                restored = self._restore(self.latest, step, target)
            except UserError as error:
                if i + 1 == len(steps):
                    raise UserError(f"{error}; no earlier resume checkpoint is intact: delete "
                                    f"{self.latest.directory} to train from step 0 (the same "
                                    f"numbers)") from None
                progress.say(f"warning: {error}; falling back to the checkpoint of step "
                             f"{steps[i + 1]} (it is removed; training again from there gives "
                             f"the same numbers)")
                self.latest.delete(step)
                continue
            return step, restored["params"], restored["opt_state"]
        return None

    def resumable_step(self) -> int:
        """The step ``restore_latest`` would resume from (0: none): the newest latest
        checkpoint that passes its check (at most ``resume_limit``); removes nothing."""
        for step in sorted(self.latest.all_steps(), reverse=True):
            if self.resume_limit is not None and step > self.resume_limit:
                continue
            try:
                self._check(self.latest, step)
            except UserError:
                continue
            return step
        return 0

    def restore_pretrained(self, params: Any, repair: bool = False) -> Any | None:
        """The pretrained params, or None; ``repair``: a damaged checkpoint is removed (saying
        so) and None returned, so the caller pretrains again."""
        if self.pretrained.latest_step() is None:
            return None
        if repair:
            try:
                self._check(self.pretrained, 0)
            except UserError as error:
                progress.say(f"warning: {error}; pretraining again (the same numbers)")
                self.pretrained.delete(0)
                return None
        return self._restore(self.pretrained, 0, {"params": _abstract(params)})["params"]

    def damaged_best(self) -> dict[int, str]:
        """{epoch: why} of the best-epoch checkpoints that fail their check."""
        damaged = {}
        for epoch in self.best.all_steps():
            try:
                self._check(self.best, epoch)
            except UserError as error:
                damaged[epoch] = str(error)
        return damaged

    def missing_best(self, history: list[dict]) -> dict[int, str]:
        """{epoch: why} of the epochs that ``history`` (``val_history.json``'s rows) ranks among
        the best ``keep_best`` but that have no best-epoch checkpoint (a folder deleted, or
        not copied with the others): a test would quietly ensemble fewer epochs. Validation
        writes an epoch's checkpoint before its row, so a finished epoch has both."""
        scores = {h["epoch"]: float(h["val_acc"]) for h in history}
        stored = self._kept_scores()  # as save_best compares them, else the history's
        kept = set(stored)
        floor = min((s if s is not None else scores.get(e, float("inf"))
                     for e, s in stored.items()), default=float("inf"))
        ranked = sorted((e for e in scores if e not in kept), key=lambda e: (-scores[e], e))
        short = max(0, min(self.keep_best, len(scores)) - len(kept))
        missing = set(ranked[:short]) | {e for e in ranked if scores[e] > floor}
        return {e: (f"the best-epoch checkpoint of epoch {e} is missing from "
                    f"{files.join(self.root, 'best')} (val_history.json ranks it among the best "
                    f"{self.keep_best})") for e in sorted(missing)}

    def repair_best(self, iters_per_epoch: int, history: list[dict] | None = None) -> None:
        """Remove the damaged best-epoch checkpoints and set ``resume_limit`` so that training
        resumes before the first of them, or of those missing (``missing_best``, given the
        validation ``history``): re-training re-creates them (bit for bit)."""
        damaged = {**self.damaged_best(), **self.missing_best(history or [])}
        if not damaged:
            return
        first = min(damaged)
        self.resume_limit = first * iters_per_epoch
        for epoch in sorted(damaged):
            if epoch in self.best.all_steps():
                self.best.delete(epoch)
        progress.say(f"warning: {damaged[first]}; re-creating best epoch(s) "
                     f"{sorted(damaged)} by training again from step {self.resume_limit} or "
                     f"the nearest intact checkpoint before it (the same numbers)")

    def best_epochs(self) -> list[int]:
        """Kept epochs, best validation accuracy first."""
        kept = {e: self.best.metrics(e)["val_acc"] for e in self.best.all_steps()}
        return sorted(kept, key=lambda e: (-kept[e], e))

    def restore_best(self, params: Any, epochs: list[int] | None = None) -> list[Any]:
        """Params of the given (default: all kept) best epochs, best first."""
        epochs = self.best_epochs() if epochs is None else epochs
        target = {"params": _abstract(params)}
        return [self._restore(self.best, e, target)["params"] for e in epochs]

    def check_all(self) -> list[str]:
        """Check every checkpoint's checksums (``Corrupt`` at the first that fails); returns
        the folders checked (not those of a legacy workdir, which have none)."""
        checked = []
        for manager in (self.latest, self.best, self.pretrained):
            for step in manager.all_steps():
                try:
                    if self._check(manager, step):
                        checked.append(_folder(manager, step))
                except UserError as error:
                    raise checksums.Corrupt(f"{error}; {self._advice(manager)}", getattr(
                        error, "path", _folder(manager, step))) from None
        return checked

    def _advice(self, manager: ocp.CheckpointManager) -> str:
        """What to do about a damaged checkpoint of ``manager``'s series."""
        if manager is self.latest:
            return ("running the training command again falls back to the checkpoint before it "
                    "(the same numbers)")
        again = ("re-creates that epoch by training again" if manager is self.best
                 else "pretrains again")
        return (f"delete the run's results.json (if any) and run its training command again "
                f"(--flagfile=WORKDIR/flags.txt): it {again}, with the same numbers")

    def _check(self, manager: ocp.CheckpointManager, step: int) -> bool:
        return checksums.check_folder(_folder(manager, step), required=self.checked)

    def _restore(self, manager: ocp.CheckpointManager, step: int, target: Any) -> Any:
        try:
            self._check(manager, step)
            return _restore(manager, step, target)
        except UserError as error:
            if manager is self.latest:
                raise
            raise UserError(f"{error}; {self._advice(manager)}") from None

    def close(self) -> None:
        for manager in (self.latest, self.best, self.pretrained):
            manager.close()


def _folder(manager: ocp.CheckpointManager, step: int) -> str:
    return files.join(str(manager.directory), str(step))


def _save(manager: ocp.CheckpointManager, step: int, tree: Any, **options) -> None:
    """Save ``tree`` as ``step``, wait for it, then write its checksums; a full disk is
    ``DiskFull`` naming the folder and the checkpoint's size (orbax's temporary folder is
    removed)."""
    folder = str(manager.directory)
    needed = sum(np.asarray(leaf).nbytes if not hasattr(leaf, "nbytes") else leaf.nbytes
                 for leaf in jax.tree.leaves(tree)) + (64 << 10)
    before = set(threading.enumerate())
    try:
        with disk.space_checked(folder, needed, checkpoint=True):
            manager.save(step, args=ocp.args.StandardSave(tree), **options)
            manager.wait_until_finished()
            # one host writes (orbax's files are shared); a best epoch worse than the kept ones
            # is deleted by orbax at once: nothing to seal
            if jax.process_index() == 0 and files.isdir(_folder(manager, step)):
                checksums.seal(_folder(manager, step))
    except disk.DiskFull:
        disk.quiet_closed_event_loops()
        try:  # orbax's threads may still be writing its temporary folder: let them end first
            manager.wait_until_finished()
        except Exception:  # noqa: BLE001  (the same full disk, raised again)
            pass
        _join_writers(before)
        for name in files.listdir(folder):
            if "orbax-checkpoint-tmp" in name:
                _remove_when_still(files.join(folder, name))
        if step in manager.all_steps() and not files.exists(
                files.join(_folder(manager, step), checksums.SEAL)):
            manager.delete(step)
        raise


def _join_writers(before: set[threading.Thread], timeout: float = 120.0) -> None:
    """Wait for the orbax threads started since ``before`` to end. After one array's write
    fails, ``wait_until_finished`` returns while the other arrays' threads still write: a
    temporary folder removed before they end is created again by their next write."""
    deadline = time.monotonic() + timeout
    for thread in set(threading.enumerate()) - before:
        if thread is not threading.current_thread() and type(thread).__module__.startswith(
                "orbax"):
            try:
                thread.join(max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001  (its join raises its error: the same full disk)
                pass


def _remove_when_still(folder: str, still: float = 0.5, timeout: float = 60.0) -> None:
    """Remove ``folder`` once nothing has changed in it for ``still`` seconds, and again
    should it come back within ``still`` seconds: tensorstore's own threads finish the writes
    already begun after the Python side failed, creating the folders they write into."""
    if "://" in folder:  # a full disk is local; a bucket has no such stragglers
        files.rmtree(folder)
        return
    deadline = time.monotonic() + timeout
    seen = _contents(folder)
    while True:
        time.sleep(still)
        now = _contents(folder)
        if now != seen and time.monotonic() < deadline:
            seen = now  # still being written
            continue
        files.rmtree(folder)
        if now is None or time.monotonic() >= deadline:
            return
        seen = None  # removed: it must stay away for ``still`` seconds


def _contents(folder: str) -> tuple | None:
    """What is in ``folder`` (names, sizes, change times); None when it does not exist."""
    if not os.path.isdir(folder):
        return None
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                info = os.stat(os.path.join(root, name))
            except OSError:  # removed while walking
                continue
            found.append((os.path.join(root, name), info.st_size, info.st_mtime_ns))
    return tuple(sorted(found))


def _restore(manager: ocp.CheckpointManager, step: int, target: Any) -> Any:
    """``manager``'s checkpoint ``step`` restored as ``target``; one that cannot be read
    (truncated, corrupt, of another run) is a UserError naming its folder."""
    try:
        return manager.restore(step, args=ocp.args.StandardRestore(target))
    except Exception as error:  # noqa: BLE001  (orbax and tensorstore raise many kinds)
        path = files.join(str(manager.directory), str(step))
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise UserError(f"checkpoint {path} cannot be read ({first})") from None


def _abstract(tree: Any) -> Any:
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def stack(trees: list[Any]) -> Any:
    """Stack pytrees along a new leading (ensemble) axis."""
    return jax.tree.map(lambda *leaves: np.stack(leaves), *trees)
