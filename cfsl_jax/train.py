"""Meta-training: one jitted step per meta-batch, validation per epoch, best-5 ensemble test.

    from cfsl_jax.train import TrainConfig, train_and_evaluate, restore
    results = train_and_evaluate(TrainConfig(learner="protonets", task="B3"), "/tmp/run")
    learner, params, spec = restore("/tmp/run")

A training step is one XLA program: it samples a meta-batch of tasks from
``fold_in(train_key, step)``, gathers and normalises their images on device,
maps the learner's meta-loss over the tasks, and applies optax Adam with
weight decay 1e-5 added to the gradients (PyTorch Adam's ``weight_decay``, as
in the paper). Because every step's key is a function of (seed, step), a run
resumed from ``checkpoints/latest`` continues bit for bit. After each epoch the
learner is validated on a fixed set of validation tasks; the best
``keep_best`` epochs are kept and the test uses their ensemble (mean logits).
Learners with ``training="pretrain"`` are pretrained instead
(``cfsl_jax.pretrain``: by default on the images of sampled training tasks, with the
same epochs, validation and ensemble; ``pretrain_data="uniform"`` for
``pretrain_steps`` batches of uniformly drawn images); ``training="none"``
learners are only evaluated.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp
import optax

from jax.sharding import Mesh

from cfsl_jax import checkpoints, data, episode, memory, metrics, parallel, progress, results
from cfsl_jax import seeding
from cfsl_jax.errors import UserError
from cfsl_jax.evaluate import evaluate
from cfsl_jax.learners import COMPUTE_DTYPES, get_learner
from cfsl_jax.learners.base import Learner
from cfsl_jax.sampler import check_split, sample_task
from cfsl_jax.spec import TaskSpec


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a run (written to workdir/config.json)."""

    learner: str = "protonets"
    learner_options: dict = dataclasses.field(default_factory=dict)
    dataset: str = "synthetic"
    dataset_options: dict = dataclasses.field(default_factory=dict)
    task: str = "B3"  # a paper cell, a type or type+NSS (TaskSpec.parse)
    spec_overrides: dict = dataclasses.field(default_factory=dict)  # TaskSpec fields to replace
    seed: int = 0
    compute_dtype: str = "float32"  # learners.COMPUTE_DTYPES; params/optimiser stay float32
    epochs: int = 10
    iters_per_epoch: int = 100
    meta_batch: int = 8
    learning_rate: float = 1e-3
    weight_decay: float = 1e-5
    val_tasks: int = 600
    test_tasks: int = 600
    eval_batch: int = 50
    keep_best: int = 5
    checkpoint_every: int = 0  # steps between mid-epoch resume checkpoints (0: epoch ends)
    log_every: int = 50
    pretrain_steps: int = 2000
    pretrain_batch: int = 64
    pretrain_data: str = "tasks"  # pretrain.PRETRAIN_DATA: "tasks" (the authors') or "uniform"
    data_dir: str | None = None
    manual_dir: str | None = None
    download: bool = False  # fetch a dataset's archives when they are not in manual_dir

    @property
    def spec(self) -> TaskSpec:
        base = TaskSpec.parse(self.task)
        return dataclasses.replace(base, **self.spec_overrides) if self.spec_overrides else base

    def check(self) -> None:
        for name in ("epochs", "iters_per_epoch", "meta_batch", "val_tasks", "test_tasks",
                     "eval_batch", "keep_best", "log_every", "pretrain_steps", "pretrain_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise UserError(f"TrainConfig.{name} must be a positive integer, got {value!r}")
        if self.checkpoint_every < 0:
            raise UserError(f"TrainConfig.checkpoint_every must be >= 0, "
                            f"got {self.checkpoint_every}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise UserError(f"TrainConfig.compute_dtype={self.compute_dtype!r}; valid: "
                            f"{tuple(COMPUTE_DTYPES)}")
        if not self.learning_rate > 0:
            raise UserError(f"TrainConfig.learning_rate must be > 0, got {self.learning_rate}")
        from cfsl_jax.pretrain import PRETRAIN_DATA
        if self.pretrain_data not in PRETRAIN_DATA:
            raise UserError(f"TrainConfig.pretrain_data={self.pretrain_data!r}; valid: "
                            f"{PRETRAIN_DATA}")
        self.spec  # noqa: B018  (validates the task)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Interrupted(RuntimeError):
    """Raised by ``stop_after_steps`` (tests simulate a killed run with it)."""


class Stopped(KeyboardInterrupt):
    """Ctrl-C during meta-training, after the reached step was checkpointed (the message says
    how to resume)."""


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    return optax.chain(optax.add_decayed_weights(config.weight_decay),
                       optax.adam(config.learning_rate))


def make_train_step(learner: Learner, optimizer: optax.GradientTransformation, meta_batch: int,
                    mesh: Mesh | None = None):
    """A jitted ``step(params, opt_state, split, key, progress) -> (params, opt_state, metrics)``.

    The meta-batch's tasks are laid along ``mesh`` (default: one device) and
    padded to a multiple of its size with masked copies; each device samples,
    gathers and differentiates its own tasks (``parallel.map_tasks``: a vmap,
    or one task at a time for per-task-weight learners on CPU), and the mean
    gradient over the ``meta_batch`` real tasks is reduced by XLA.
    """
    spec = learner.spec
    mesh = mesh or parallel.make_mesh(1)
    padded = parallel.padded(meta_batch, mesh)

    def task_loss(params, task, progress):  # task: support x, y, target x, y, key
        loss, logits = episode.meta_loss(learner, params, *task, progress)
        return loss, metrics.accuracy(logits, task[3])

    grad_fn = jax.value_and_grad(task_loss, has_aux=True)

    def task_grads(params, split, key, progress):
        task = sample_task(key, split.class_table, split.class_sizes, spec)
        args = (data.gather_normalised(split, task.support_idx), task.support_labels,
                data.gather_normalised(split, task.target_idx), task.target_labels,
                jax.random.fold_in(key, 1))
        (loss, acc), grads = grad_fn(params, args, progress)
        return loss, acc, grads

    @jax.jit
    def step(params, opt_state, split, key, progress):
        keys = jax.random.split(key, meta_batch)
        keys = keys[jnp.arange(padded) % meta_batch]  # padding: repeated tasks, weighted 0
        weights = (jnp.arange(padded) < meta_batch).astype(jnp.float32) / meta_batch
        loss, acc, grads = parallel.map_tasks(
            lambda k: task_grads(params, split, k, progress), (keys,), mesh,
            episode.sequential(learner, mesh))
        loss, acc, grads = jax.tree.map(lambda x: jnp.tensordot(weights, x, axes=1),
                                        (loss, acc, grads))
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss, "acc": acc}

    return step


def load_splits(config: TrainConfig) -> dict[str, data.Split]:
    """The train/val/test splits of a config's dataset (a bad dataset option: UserError)."""
    try:
        return {name: data.load_split(config.dataset, name, data_dir=config.data_dir,
                                      manual_dir=config.manual_dir, download=config.download,
                                      **config.dataset_options)
                for name in data.SPLITS}
    except UserError:
        raise
    except ValueError as error:  # data.py validates its name, split and options so
        prefix = "--dataset_option: " if config.dataset_options else ""
        raise UserError(f"{prefix}{error}") from error


def selects_epochs(config: TrainConfig, learner: Learner) -> bool:
    """Whether the run trains on tasks for epochs, validates each and tests the best epochs'
    ensemble: meta-training, and pretraining on tasks (``pretrain_data="tasks"``)."""
    return learner.training == "meta" or (learner.training == "pretrain"
                                          and config.pretrain_data == "tasks")


def splits_touched(training: str, pretrain_data: str = "uniform") -> tuple[str, ...]:
    """The splits tasks are sampled from: test always, train and val when meta-training or
    pretraining on tasks (``pretrain_data="tasks"``)."""
    on_tasks = training == "meta" or (training == "pretrain" and pretrain_data == "tasks")
    return ("train", "val", "test") if on_tasks else ("test",)


def check_feasible(config: TrainConfig, splits: dict[str, data.Split],
                   touched: tuple[str, ...] = data.SPLITS) -> None:
    """UserError naming the split when one of ``touched`` cannot supply the config's tasks."""
    for name in touched:
        try:
            check_split(splits[name].class_table, splits[name].class_sizes, config.spec)
        except ValueError as error:
            raise UserError(f"--task={config.task} cannot be sampled from the {name} split of "
                            f"{splits[name].info.dataset}: {error}") from None


def build(config: TrainConfig) -> tuple[Learner, dict[str, data.Split]]:
    """The learner and the train/val/test splits of a config; refuses (UserError) a spec that a
    split it samples tasks from cannot supply, before anything is compiled."""
    config.check()
    splits = load_splits(config)
    image_shape = tuple(splits["train"].images.shape[1:])
    learner = get_learner(config.learner, config.spec, image_shape=image_shape,
                          compute_dtype=config.compute_dtype, **config.learner_options)
    check_feasible(config, splits, splits_touched(learner.training, config.pretrain_data))
    return learner, splits


def init_params(learner: Learner, split: data.Split, seed: int) -> Any:
    example_x = jnp.zeros((1, *split.images.shape[1:]), jnp.float32)
    return learner.init_params(seeding.purpose_key(seed, "init"), example_x, learner.spec)


# What ``load_config`` reads for a field a config.json was saved without, where the default has
# changed since (runs saved before pretrain_data existed pretrained on uniform images).
LEGACY_DEFAULTS: dict[str, Any] = {"pretrain_data": "uniform"}


def config_differences(saved: dict, config: TrainConfig) -> list[str]:
    """Fields in which a saved ``config.json`` differs from ``config``.

    Fields added to ``TrainConfig`` since the run was saved take their defaults.
    """
    saved = {**json.loads(json.dumps(TrainConfig().to_json())), **saved}
    current = json.loads(json.dumps(config.to_json()))
    return sorted(k for k in set(saved) | set(current)
                  if saved.get(k) != current.get(k) and k not in _NOT_IDENTITY)


_NOT_IDENTITY = ("download",)  # config fields that do not change what a run computes


def _check_workdir_config(workdir: str, config: TrainConfig, create: bool = True) -> None:
    path = os.path.join(workdir, "config.json")
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise UserError(f"--workdir={workdir} is a file, not a folder; give another path")
    if os.path.exists(path):
        differs = config_differences(results.read_json(path), config)
        if differs:
            raise UserError(f"workdir {workdir!r} holds a run with a different config "
                            f"(fields {differs}); use a new workdir")
    elif create:
        os.makedirs(workdir, exist_ok=True)
        results.write_json(path, config.to_json())


def meta_train(config: TrainConfig, learner: Learner, params: Any, splits, workdir: str,
               ckpt: checkpoints.Checkpoints, stop_after_steps: int | None = None,
               mesh: Mesh | None = None) -> Any:
    """Meta-train ``params`` (resuming from the workdir) over ``mesh``; returns the final params.

    The result does not depend on the mesh beyond float summation order.
    """
    mesh = mesh or parallel.make_mesh()
    if config.meta_batch % mesh.size:
        extra = parallel.padded(config.meta_batch, mesh) - config.meta_batch
        logging.warning("meta_batch %d over %d devices: %d padding task(s) per step are "
                        "computed and dropped; a multiple of %d (or --num_devices) avoids it",
                        config.meta_batch, mesh.size, extra, mesh.size)
    optimizer = make_optimizer(config)
    opt_state = optimizer.init(params)
    start = 0
    restored = ckpt.restore_latest(params, opt_state)
    if restored is not None:
        start, params, opt_state = restored
        logging.info("resuming from step %d", start)
    params, opt_state = parallel.replicate((params, opt_state), mesh)
    split = parallel.place_split(splits["train"], mesh)
    history_path = os.path.join(workdir, "val_history.json")
    history = results.read_json(history_path, default=[])
    history = [h for h in history if h["epoch"] < start // config.iters_per_epoch]
    train_key = seeding.purpose_key(config.seed, "train")
    total = config.epochs * config.iters_per_epoch
    steps: dict[int, Any] = {}  # one compiled step per distinct learner (for_epoch)
    bar = progress.tracker("train", total, "steps", start=start)
    # steps completed and fully recorded (an epoch's end: after its validation); the newest
    # resume checkpoint's step
    done = saved = start
    try:
        for step in range(start, total):
            epoch = step // config.iters_per_epoch
            current = learner.for_epoch(epoch) if learner.for_epoch else learner
            if id(current) not in steps:
                steps[id(current)] = compile_train_step(
                    current, optimizer, config, mesh, params, opt_state, split, train_key)
                bar = progress.tracker("train", total, "steps", start=step)
            params, opt_state, out = steps[id(current)](
                params, opt_state, split, jax.random.fold_in(train_key, step),
                jnp.float32(step / total))
            loss = float(out["loss"])
            if not math.isfinite(loss):
                raise FloatingPointError(
                    f"meta-training loss is {loss} at epoch {epoch}, step {step} "
                    f"(global; step {step % config.iters_per_epoch} of the epoch); the last "
                    f"good checkpoint is step {ckpt.latest.latest_step()} in {workdir}")
            bar.update(step + 1, force=(step + 1) % config.log_every == 0, epoch=epoch,
                       loss=loss, acc=float(out["acc"]))
            if (step + 1) % config.iters_per_epoch == 0:
                val = evaluate(current, params, splits["val"], num_tasks=config.val_tasks,
                               seed=config.seed, purpose="val", batch_size=config.eval_batch,
                               cost_metrics=False, mesh=mesh)
                ckpt.save_best(epoch, params, val["acc_mean"])
                history.append({"epoch": epoch, "val_acc": val["acc_mean"],
                                "val_ce": val["ce_mean"], "train_loss": loss})
                results.write_json(history_path, history)
                done = step + 1
                ckpt.save_latest(done, params, opt_state)
                saved = done
                progress.say(f"[train] epoch {epoch}: val acc {val['acc_mean']:.4f} "
                             f"ce {val['ce_mean']:.4f}")
                bar = progress.tracker("train", total, "steps", start=done, first_line=False)
            else:
                done = step + 1
                if config.checkpoint_every and done % config.checkpoint_every == 0:
                    ckpt.save_latest(done, params, opt_state)
                    saved = done
            if stop_after_steps is not None and done == stop_after_steps and done < total:
                raise Interrupted(f"stopped after step {done} as asked")
    except KeyboardInterrupt:
        if done > saved:
            ckpt.save_latest(done, params, opt_state)
            saved = done
        where = f"checkpointed at step {saved}" if saved else "nothing to checkpoint yet"
        raise Stopped(f"interrupted at step {done} of {total}; {where} in {workdir}: re-run "
                      f"the same command to resume") from None
    return params


def compile_train_step(learner: Learner, optimizer: optax.GradientTransformation,
                       config: TrainConfig, mesh: Mesh, params: Any, opt_state: Any,
                       split: data.Split, key: jax.Array):
    """The training step compiled ahead of time (with a progress line), refused with a
    UserError when XLA's estimate of its memory exceeds the device's."""
    step = make_train_step(learner, optimizer, config.meta_batch, mesh)
    with progress.stage(f"[train] compiling the {learner.name} meta-training step"):
        compiled = step.lower(params, opt_state, split, key, jnp.float32(0)).compile()
    memory.check_fits(compiled, f"one meta-training step of {learner.name} on "
                      f"{config.spec.name}",
                      f"lower --meta_batch (now {config.meta_batch}), --nc, --nss or --kt, "
                      f"or use --compute_dtype=bfloat16", mesh.devices.flat[0])
    return compiled


def per_task_meta_step_macs(config: TrainConfig, learner: Learner, params: Any,
                            image_shape: tuple[int, ...]) -> float:
    """XLA's MACs of one task's meta-training step, with every support set counted.

    A learner with its own meta-loss is rebuilt with ``unroll=True`` where its
    factory has that option (MAML++/SCA), since XLA counts a loop body once.
    """
    try:
        learner = get_learner(config.learner, config.spec, image_shape=image_shape,
                              compute_dtype=config.compute_dtype,
                              **{**config.learner_options, "unroll": True})
    except ValueError:  # no such option: the episode scan is the only loop
        pass
    return metrics.meta_step_macs(learner, params, image_shape)


def finished_results(workdir: str, config: TrainConfig) -> dict[str, Any] | None:
    """The stored results of ``workdir`` when it holds a finished run of ``config``."""
    path = os.path.join(workdir, "results.json")
    if not os.path.isfile(path):
        return None
    _check_workdir_config(workdir, config, create=False)
    return results.read_json(path)


def train_and_evaluate(config: TrainConfig, workdir: str, stop_after_steps: int | None = None,
                       mesh: Mesh | None = None, retest: bool = False) -> dict[str, Any]:
    """Train (or pretrain) as the learner asks, test on the test split, write results.

    Meta-training and evaluation run over ``mesh`` (default: every device). A workdir that
    holds this config's finished run is not redone: its stored results are printed and
    returned, or with ``retest`` tested again (``evaluate_run``; the recorded wall time stays
    the training run's). A user error (UserError, out of memory) before the run's first
    checkpoint removes the workdir this call created, so a refused run leaves nothing.
    """
    done = finished_results(workdir, config)
    if done is not None:
        if retest:
            return evaluate_run(workdir, mesh=mesh)
        progress.say(f"{workdir} holds this finished run (re-test it with --retest):")
        print(results.table(done), flush=True)
        return done
    new = not os.path.exists(workdir)
    try:
        return _train_and_evaluate(config, workdir, stop_after_steps, mesh)
    except Exception as error:
        if new and os.path.isdir(workdir) and _is_user_error(error) and not _has_checkpoints(
                workdir):
            shutil.rmtree(workdir, ignore_errors=True)
        raise


def _has_checkpoints(workdir: str) -> bool:
    root = os.path.join(workdir, "checkpoints")
    return any(name.isdigit() for series in ("latest", "best", "pretrained")
               for name in (os.listdir(os.path.join(root, series))
                            if os.path.isdir(os.path.join(root, series)) else ()))


def _is_user_error(error: BaseException) -> bool:
    return isinstance(error, UserError) or (type(error).__name__ in (
        "XlaRuntimeError", "JaxRuntimeError") and "RESOURCE_EXHAUSTED" in str(error))


def _train_and_evaluate(config: TrainConfig, workdir: str, stop_after_steps: int | None,
                        mesh: Mesh | None) -> dict[str, Any]:
    started = time.perf_counter()
    mesh = mesh or parallel.make_mesh()
    learner, splits = build(config)
    _check_workdir_config(workdir, config)
    params = init_params(learner, splits["train"], config.seed)
    ckpt = checkpoints.Checkpoints(workdir, config.keep_best)
    try:
        ensemble = False
        if learner.training == "meta":
            params = meta_train(config, learner, params, splits, workdir, ckpt, stop_after_steps,
                                mesh)
            params = checkpoints.stack(ckpt.restore_best(params))
            ensemble = True
        elif selects_epochs(config, learner):  # pretraining on tasks, the authors' way
            from cfsl_jax.pretrain import pretrain_on_tasks
            params = pretrain_on_tasks(config, learner, params, splits, workdir, ckpt,
                                       stop_after_steps, mesh)
            ensemble = True
        elif learner.training == "pretrain":
            from cfsl_jax.pretrain import pretrain
            pretrained = ckpt.restore_pretrained(params)
            if pretrained is None:
                pretrained = pretrain(learner, params, splits["train"],
                                      seeding.purpose_key(config.seed, "pretrain"),
                                      steps=config.pretrain_steps,
                                      batch_size=config.pretrain_batch,
                                      weight_decay=config.weight_decay)
                ckpt.save_pretrained(pretrained)
            params = pretrained
        report = evaluate(learner, params, splits["test"], num_tasks=config.test_tasks,
                          seed=config.seed, purpose="eval", batch_size=config.eval_batch,
                          ensemble=ensemble, mesh=mesh)
        if learner.training == "meta":
            member = jax.device_get(jax.tree.map(lambda x: x[0], params))
            with progress.stage("[test] counting the MACs of a meta-training step (XLA)"):
                report["macs_per_meta_step"] = per_task_meta_step_macs(
                    config, learner, member, tuple(splits["train"].images.shape[1:]))
        out = results.record(config, learner, splits, report, workdir,
                             wall_seconds=time.perf_counter() - started,
                             best_epochs=ckpt.best_epochs() if ensemble else [])
    finally:
        ckpt.close()
    return out


def restore(workdir: str, ensemble: bool = False) -> tuple[Learner, Any, TaskSpec]:
    """(learner, params, spec) of a finished run: the best epoch, or the stacked ensemble."""
    config = load_config(workdir)
    learner, splits = build(config)
    return learner, restore_params(config, learner, splits, workdir, ensemble), config.spec


def restore_params(config: TrainConfig, learner: Learner, splits, workdir: str,
                   ensemble: bool = False) -> Any:
    """The params of ``restore``, for a learner and splits already built."""
    params = init_params(learner, splits["train"], config.seed)
    ckpt = checkpoints.Checkpoints(workdir, config.keep_best, read_only=True)
    try:
        if selects_epochs(config, learner):
            members = ckpt.restore_best(params)
            if not members:
                raise UserError(f"the run in {workdir} has no best checkpoints yet: finish its "
                                f"training first (re-run launch.train with its flags)")
            params = checkpoints.stack(members) if ensemble else members[0]
        elif learner.training == "pretrain":
            params = ckpt.restore_pretrained(params)
    finally:
        ckpt.close()
    return params


def load_config(workdir: str) -> TrainConfig:
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(workdir):
        raise UserError(f"--workdir={workdir} does not exist")
    if not os.path.exists(path):
        raise UserError(f"--workdir={workdir} holds no run (no config.json): give the folder a "
                        f"run was trained into")
    saved = {**LEGACY_DEFAULTS, **results.read_json(path)}
    return TrainConfig(**{k: v for k, v in saved.items()
                          if k in {f.name for f in dataclasses.fields(TrainConfig)}})


def evaluate_run(workdir: str, num_tasks: int | None = None,
                 mesh: Mesh | None = None) -> dict[str, Any]:
    """Re-test a finished run from its checkpoints (the same numbers as its training wrote).

    The recorded ``wall_seconds`` stay the training run's (when it recorded them); the
    re-test's own seconds are ``test.seconds``."""
    started = time.perf_counter()
    config = load_config(workdir)
    learner, splits = build(config)
    params = restore_params(config, learner, splits, workdir, ensemble=True)
    ensemble = selects_epochs(config, learner)
    report = evaluate(learner, params, splits["test"], num_tasks=num_tasks or config.test_tasks,
                      seed=config.seed, purpose="eval", batch_size=config.eval_batch,
                      ensemble=ensemble, mesh=mesh)
    best = []
    if ensemble:
        ckpt = checkpoints.Checkpoints(workdir, config.keep_best, read_only=True)
        best = ckpt.best_epochs()
        ckpt.close()
    stored = results.read_json(os.path.join(workdir, "results.json"), default={})
    if "macs_per_meta_step" in stored.get("test", {}):
        report["macs_per_meta_step"] = stored["test"]["macs_per_meta_step"]
    wall = stored.get("wall_seconds", time.perf_counter() - started)
    return results.record(config, learner, splits, report, workdir, wall_seconds=wall,
                          best_epochs=best)
