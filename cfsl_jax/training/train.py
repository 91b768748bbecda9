"""Meta-training: one jitted step per meta-batch, validation per epoch, best-5 ensemble test.

    from cfsl_jax.training.config import TrainConfig
from cfsl_jax.training.records import EvalRecord
    from cfsl_jax.training.train import train_and_evaluate
    results = train_and_evaluate(TrainConfig(learner="protonets", task="B3"), "/tmp/run")

A training step is one XLA program: it samples a meta-batch of tasks from
``fold_in(train_key, step)``, gathers and normalises their images on device,
maps the learner's meta-loss over the tasks, and applies optax Adam with
weight decay 1e-5 added to the gradients (PyTorch Adam's ``weight_decay``, as
in the paper). Because every step's key is a function of (seed, step), a run
resumed from ``checkpoints/latest`` continues bit for bit. After each epoch the
learner is validated on a fixed set of validation tasks; the best
``keep_best`` epochs are kept and the test uses their ensemble (mean logits).
Learners with ``training="pretrain"`` are pretrained instead
(``cfsl_jax.training.pretrain``: by default on the images of sampled training tasks, with the
same epochs, validation and ensemble; ``pretrain_data="uniform"`` for
``pretrain_steps`` batches of uniformly drawn images); ``training="none"``
learners are only evaluated.
The run's config is ``cfsl_jax.training.config``; the learner and splits it builds, its
workdir checks, and restoring or re-testing a finished run are ``cfsl_jax.training.runs``; the
epoch loop (resume, stops, checkpoints, validation) is ``cfsl_jax.training.loop``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import optax

from jax.sharding import Mesh

from cfsl_jax.runtime import (backend, disk, files, locks, memory, parallel, progress, seeding,
                              stops)
from cfsl_jax import data
from cfsl_jax.protocol import episode
from cfsl_jax.training import optimizers, results
from cfsl_jax.runtime.errors import NonFiniteLoss, UserError
from cfsl_jax.training.evaluate import evaluate
from cfsl_jax.learners import get_learner
from cfsl_jax.protocol.learner import Learner
from cfsl_jax.training import checkpoints, loop, runs, sessions
from cfsl_jax.training.runs import per_task_meta_step_macs  # noqa: F401 (its home was here)
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.training.pretrain import pretrain, pretrain_on_tasks
from cfsl_jax.training.records import EvalRecord
from cfsl_jax.training.runs import (build, check_workdir_config, evaluate_run, finished_results,
                                    init_params, selects_epochs, validated)
from cfsl_jax.training.steps import make_train_step, train_step_fn  # noqa: F401 (API)
from cfsl_jax.training.tracking import Tracking


START_BYTES = 1 << 20  # free space a new workdir needs before anything is created in it


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    return pack_optimizer(config.learning_rate, config.weight_decay)


def pack_optimizer(learning_rate: float | jax.Array, weight_decay: float | jax.Array
                   ) -> optax.GradientTransformation:
    """Meta-training's optimiser (``make_optimizer``'s), also from a pack's run's traced
    hyper-parameters (``steps.make_steps(per_run=...)``): the same updates to float32
    rounding."""
    return optimizers.optimizer("adam", learning_rate, weight_decay)


def meta_train(config: TrainConfig, learner: Learner, params: Any, splits, workdir: str,
               ckpt: checkpoints.Checkpoints, stop_after_steps: int | None = None,
               mesh: Mesh | None = None, tracking: Tracking | None = None) -> Any:
    """Meta-train ``params`` (resuming from the workdir) over ``mesh``; returns the final params.

    The result does not depend on the mesh beyond float summation order.
    """
    mesh = mesh or parallel.make_mesh()
    if config.meta_batch % mesh.size:
        extra = parallel.padded(config.meta_batch, mesh) - config.meta_batch
        progress.say(f"[train] note: meta_batch {config.meta_batch} over {mesh.size} devices: "
                     f"{extra} padding task(s) per step are computed and dropped; a multiple of "
                     f"{mesh.size} (or --num_devices) avoids it")
    optimizer = make_optimizer(config)
    state = loop.TrainState(params, optimizer.init(params))
    split = parallel.place_split(splits["train"], mesh)
    train_key = seeding.purpose_key(config.seed, "train")
    compiled: dict[int, Any] = {}  # one compiled step per distinct learner (for_epoch)

    def step_for(epoch: int, state: loop.TrainState) -> loop.StepFn:
        current = learner.at_epoch(epoch)
        if id(current) not in compiled:
            step = compile_train_step(current, optimizer, config, mesh, state.params,
                                      state.opt_state, split, train_key)

            def run(state, key, progress_):
                params, opt_state, out = step(state.params, state.opt_state, split, key,
                                              progress_)
                return loop.TrainState(params, opt_state), out

            compiled[id(current)] = loop.per_step(train_key, run)
        return compiled[id(current)]

    def validate(epoch: int, state: loop.TrainState):
        current = learner.at_epoch(epoch)
        return evaluate(current, state.params, splits["val"], num_tasks=config.val_tasks,
                        seed=config.task_seed, purpose="val", batch_size=config.eval_batch,
                        cost_metrics=False, mesh=mesh), state.params

    phase = loop.phase(config, "train", "meta-training", train_key)
    outputs = loop.Outputs(workdir, ckpt, tracking or Tracking(None))
    state = loop.run(phase, state, step_for, validate, outputs,
                     place=lambda s: parallel.replicate(s, mesh),
                     stop_after_steps=stop_after_steps)
    return state.params


# One jitted step per (learner, optimiser, meta-batch, mesh): learners and optimisers with the
# same settings are the same objects (``learners.get_learner``, ``optimizers.optimizer``), so a
# later run of the same settings in the process (a sweep's seeds, a resumed run) finds the
# compiled step instead of tracing and compiling it again.
_train_step = functools.lru_cache(maxsize=16)(make_train_step)


def compile_train_step(learner: Learner, optimizer: optax.GradientTransformation,
                       config: TrainConfig, mesh: Mesh, params: Any, opt_state: Any,
                       split: data.Split, key: jax.Array):
    """The training step compiled ahead of time (with a progress line), refused with a
    UserError when XLA's estimate of its memory exceeds the device's."""
    step = _train_step(learner, optimizer, config.meta_batch, mesh)
    with progress.stage(f"[train] compiling the {learner.name} meta-training step"):
        compiled = step.lower(params, opt_state, split, key, jnp.float32(0)).compile()
    memory.check_fits(compiled, f"one meta-training step of {learner.name} on "
                      f"{config.spec.name}",
                      f"lower --meta_batch (now {config.meta_batch}), --nc, --nss or --kt, "
                      f"or use --compute_dtype=bfloat16", mesh.devices.flat[0])
    return compiled


def train_and_evaluate(config: TrainConfig, workdir: str, stop_after_steps: int | None = None,
                       mesh: Mesh | None = None, retest: bool = False,
                       tested: EvalRecord | None = None) -> dict[str, Any]:
    """Train (or pretrain) as the learner asks, test on the test split, write results.

    Meta-training, pretraining and evaluation run over ``mesh`` (default: every device). A
    workdir that holds this config's finished run is not redone: its stored results are
    printed and returned, or with ``retest`` tested again (``evaluate_run``; the recorded wall
    time stays the training run's). A user error (UserError, out of memory, a full disk)
    before the run's first checkpoint removes the workdir this call created, so a refused run
    leaves nothing. The workdir is locked while it works (``locks``: a second command on it is
    refused, ``locks.Busy``); a damaged best-epoch checkpoint is re-created by training again
    (``Checkpoints.repair_best``) before it could enter the ensemble. ``tested``: the run's
    test record from its pack's test (``pack_eval.test_pack``), used instead of testing it.
    """
    new = not files.exists(workdir)
    try:
        if new:  # nothing is created on a disk without room for the run's first files
            disk.require(files.dirname(workdir), START_BYTES)
        with (stops.handled(), workdir_locked(workdir),
              emptied_if_refused([workdir] if new else [])):
            done = finished_results(workdir, config, mend=True)
            if done is not None:
                results.mend_csv(workdir, done)
                if retest:
                    return evaluate_run(workdir, mesh=mesh)
                progress.say(f"{workdir} holds this finished run (re-test it with --retest):")
                print(results.table(done), flush=True)
                return done
            with sessions.opened([(config, workdir)]) as earlier:  # wall_seconds: all of them
                return _train_and_evaluate(config, workdir, stop_after_steps, mesh,
                                           earlier[workdir]["seconds"], tested)
    except stops.StopRequested as stop:
        if files.exists(files.join(workdir, "results.json")):
            raise  # it landed as the finished run returned
        # outside a phase (building, restoring, between phases): no step was taken since the
        # last checkpoint, so there is nothing to save
        stops.clear()
        if has_checkpoints(workdir):
            raise loop.interrupted(stop, "between training steps", "its checkpoints are",
                                   workdir) from None
        raise loop.interrupted(stop, "before its first checkpoint", "no step is kept",
                               workdir, then="start it") from None
    except Exception as error:
        if new and refused(error):
            remove_empty(workdir)  # emptied while locked (``emptied_if_refused``)
        raise


def workdir_locked(workdir: str):
    """The workdir's lock (``locks.held``), taken by the first host of a multi-host run (every
    host runs the same command on one workdir)."""
    if not results.is_primary():
        return contextlib.nullcontext()
    return locks.workdir(workdir)


@contextlib.contextmanager
def emptied_if_refused(created: Sequence[str]):
    """Inside the locks of the workdirs ``created`` by this command: when it is refused
    (``refused``) before any of them checkpointed, their files but the lock are removed while
    it is still held, so that a command taking a lock just released finds an empty folder,
    never one being removed under it; ``remove_empty`` removes the folders after the release
    (unless another command took one meanwhile)."""
    try:
        yield
    except Exception as error:
        if refused(error) and not any(has_checkpoints(w) for w in created if files.isdir(w)):
            for workdir in created:
                for name in files.listdir(workdir):
                    if name != locks.LOCK_FILE:
                        path = files.join(workdir, name)
                        if files.isdir(path):
                            files.rmtree(path)
                        else:
                            files.remove(path)
        raise


def remove_empty(folder: str) -> None:
    """Remove ``folder`` if it is an empty local folder (on an object store a folder without
    objects does not exist); a folder another command has put files in since is kept."""
    if not files.is_url(folder) and files.isdir(folder) and not files.listdir(folder):
        try:
            os.rmdir(folder)
        except OSError:
            pass


def has_checkpoints(workdir: str) -> bool:
    root = files.join(workdir, "checkpoints")
    return any(name.isdigit() for series in ("latest", "best", "pretrained")
               for name in files.listdir(files.join(root, series)))


def refused(error: BaseException) -> bool:
    """A run refused (bad input, a full disk, out of memory) rather than failed: a workdir it
    created is removed. Not when the workdir is another process's (``locks.Busy``) or the run
    met a non-finite loss (its checkpoints are kept to look at)."""
    return _is_user_error(error) and not isinstance(error, (locks.Busy, NonFiniteLoss))


def _is_user_error(error: BaseException) -> bool:
    return (isinstance(error, UserError) or disk.is_disk_full(error)
            or memory.is_out_of_memory(error))


def _train_and_evaluate(config: TrainConfig, workdir: str, stop_after_steps: int | None,
                        mesh: Mesh | None, earlier_seconds: float = 0.0,
                        tested: EvalRecord | None = None) -> dict[str, Any]:
    started, compiled = time.perf_counter() - earlier_seconds, backend.compile_totals()
    mesh = mesh or parallel.make_mesh()
    learner, splits = build(config)
    check_workdir_config(workdir, config)
    sessions.check_data(workdir, splits)
    params = init_params(learner, splits["train"], config.seed)
    ckpt = checkpoints.Checkpoints(workdir, config.keep_best)
    tracking = Tracking(workdir, config.tensorboard, config.wandb_project, config.to_json())
    try:
        ensemble = False
        if selects_epochs(config, learner):  # a damaged or missing best epoch is trained
            ckpt.repair_best(config.iters_per_epoch, validated(workdir))  # again, never skipped
        if learner.recipe.training == "meta":
            params = meta_train(config, learner, params, splits, workdir, ckpt, stop_after_steps,
                                mesh, tracking)
            with progress.stage("[test] restoring the best checkpoints", quiet_below=1.0):
                params = checkpoints.stack(ckpt.restore_best(params))
            ensemble = True
        elif selects_epochs(config, learner):  # pretraining on tasks, the authors' way
            params = pretrain_on_tasks(config, learner, params, splits, workdir, ckpt,
                                       stop_after_steps, mesh, tracking)
            ensemble = True
        elif learner.recipe.training == "pretrain":
            pretrained = ckpt.restore_pretrained(params, repair=True)
            if pretrained is None:
                pretrained = pretrain(learner, params, splits["train"],
                                      seeding.purpose_key(config.seed, "pretrain"),
                                      steps=config.pretrain_steps,
                                      batch_size=config.pretrain_batch,
                                      weight_decay=config.weight_decay, mesh=mesh)
                with stops.deferred():
                    ckpt.save_pretrained(pretrained)
            params = pretrained
        try:
            report = tested if tested is not None else evaluate(
                learner, params, splits["test"], num_tasks=config.test_tasks,
                seed=config.task_seed, purpose="test", batch_size=config.eval_batch,
                ensemble=ensemble, mesh=mesh, per_task=True)
            if learner.recipe.training == "meta":
                member = jax.device_get(jax.tree.map(lambda x: x[0], params))
                with progress.stage("[test] counting the MACs of a meta-training step (XLA)"):
                    report = report.replace(macs_per_meta_step=per_task_meta_step_macs(
                        config, learner, member, tuple(splits["train"].images.shape[1:])))
        except (stops.StopRequested, SystemExit) as stop:  # SystemExit: a scheduler's handler
            stops.clear()
            raise loop.interrupted(stop, "during the test", "training is complete and "
                                   "checkpointed", workdir, then="test") from None
        out = results.record(config, learner, splits, report, workdir,
                             wall_seconds=time.perf_counter() - started,
                             best_epochs=ckpt.best_epochs() if ensemble else [],
                             compile_since=compiled, pack_test=tested is not None)
        tracking.scalars("test", config.epochs * config.iters_per_epoch if ensemble else 0, {
            k: report[k] for k in (
                "acc_mean", "acc_std", "acc_ci95", "ce_mean", "ce_std", "group_acc", "atm",
                "macs_adapt", "macs_predict", "macs_per_task", "macs_per_meta_step")
            if k in report})
    finally:
        tracking.close()
        ckpt.close()
    return out
