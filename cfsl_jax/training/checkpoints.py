"""Checkpoints of a run's workdir (orbax).

    workdir/checkpoints/latest/<step>/   params + optimiser state, the newest only (resume)
    workdir/checkpoints/best/<epoch>/    params of the best ``keep_best`` epochs by val accuracy
    workdir/checkpoints/pretrained/0/    params after pretraining (learners with training="pretrain")

A checkpoint is written only after its step's loss was checked finite, so a
run stopped by a NaN keeps its last good checkpoint. Orbax writes each checkpoint to a
temporary folder and renames it when complete; one that cannot be read back is refused in one
line naming its folder (``UserError``). The workdir may be a local path or a ``gs://`` URL:
orbax gets it as an ``epath.Path`` (a local path made absolute, a URL as given).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from cfsl_jax.runtime import files
from cfsl_jax.runtime.errors import UserError


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
        root = files.join(workdir, "checkpoints")
        if read_only and not files.isdir(root):
            raise FileNotFoundError(f"no checkpoints in {workdir!r} (looked for {root})")
        self.latest = _manager(files.join(root, "latest"), 1)
        self.best = _manager(files.join(root, "best"), keep_best, best=True)
        self.pretrained = _manager(files.join(root, "pretrained"), 1)

    # -- saving ------------------------------------------------------------------
    def save_latest(self, step: int, params: Any, opt_state: Any) -> None:
        self.latest.save(step, args=ocp.args.StandardSave({"params": params,
                                                           "opt_state": opt_state}))
        self.latest.wait_until_finished()

    def save_best(self, epoch: int, params: Any, val_acc: float) -> None:
        if epoch in self.best.all_steps():  # re-validated after a resume: same params
            return
        self.best.save(epoch, args=ocp.args.StandardSave({"params": params}),
                       metrics={"val_acc": float(val_acc)})
        self.best.wait_until_finished()

    def save_pretrained(self, params: Any) -> None:
        self.pretrained.save(0, args=ocp.args.StandardSave({"params": params}), force=True)
        self.pretrained.wait_until_finished()

    # -- restoring ---------------------------------------------------------------
    def restore_latest(self, params: Any, opt_state: Any) -> tuple[int, Any, Any] | None:
        """(step, params, opt_state) of the newest checkpoint, or None."""
        step = self.latest.latest_step()
        if step is None:
            return None
        target = {"params": _abstract(params), "opt_state": _abstract(opt_state)}
        restored = _restore(self.latest, step, target)
        return step, restored["params"], restored["opt_state"]

    def restore_pretrained(self, params: Any) -> Any | None:
        if self.pretrained.latest_step() is None:
            return None
        return _restore(self.pretrained, 0, {"params": _abstract(params)})["params"]

    def best_epochs(self) -> list[int]:
        """Kept epochs, best validation accuracy first."""
        kept = {e: self.best.metrics(e)["val_acc"] for e in self.best.all_steps()}
        return sorted(kept, key=lambda e: (-kept[e], e))

    def restore_best(self, params: Any, epochs: list[int] | None = None) -> list[Any]:
        """Params of the given (default: all kept) best epochs, best first."""
        epochs = self.best_epochs() if epochs is None else epochs
        target = {"params": _abstract(params)}
        return [_restore(self.best, e, target)["params"] for e in epochs]

    def close(self) -> None:
        for manager in (self.latest, self.best, self.pretrained):
            manager.close()


def _restore(manager: ocp.CheckpointManager, step: int, target: Any) -> Any:
    """``manager``'s checkpoint ``step`` restored as ``target``; one that cannot be read
    (truncated, corrupt, of another run) is a UserError naming its folder."""
    try:
        return manager.restore(step, args=ocp.args.StandardRestore(target))
    except Exception as error:  # noqa: BLE001  (orbax and tensorstore raise many kinds)
        path = files.join(str(manager.directory), str(step))
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise UserError(f"checkpoint {path} cannot be read ({first}); delete it to train that "
                        f"part of the run again, or give another workdir") from None


def _abstract(tree: Any) -> Any:
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def stack(trees: list[Any]) -> Any:
    """Stack pytrees along a new leading (ensemble) axis."""
    return jax.tree.map(lambda *leaves: np.stack(leaves), *trees)
