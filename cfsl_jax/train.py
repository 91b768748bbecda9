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
(``cfsl_jax.pretrain``); ``training="none"`` learners are only evaluated.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp
import optax

from jax.sharding import Mesh

from cfsl_jax import checkpoints, data, episode, metrics, parallel, results, seeding
from cfsl_jax.evaluate import evaluate
from cfsl_jax.learners import COMPUTE_DTYPES, get_learner
from cfsl_jax.learners.base import Learner
from cfsl_jax.sampler import sample_task
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
    data_dir: str | None = None
    manual_dir: str | None = None

    @property
    def spec(self) -> TaskSpec:
        base = TaskSpec.parse(self.task)
        return dataclasses.replace(base, **self.spec_overrides) if self.spec_overrides else base

    def check(self) -> None:
        for name in ("epochs", "iters_per_epoch", "meta_batch", "val_tasks", "test_tasks",
                     "eval_batch", "keep_best", "log_every", "pretrain_steps", "pretrain_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TrainConfig.{name} must be a positive integer, got {value!r}")
        if self.checkpoint_every < 0:
            raise ValueError(f"TrainConfig.checkpoint_every must be >= 0, "
                             f"got {self.checkpoint_every}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"TrainConfig.compute_dtype={self.compute_dtype!r}; valid: "
                             f"{tuple(COMPUTE_DTYPES)}")
        if not self.learning_rate > 0:
            raise ValueError(f"TrainConfig.learning_rate must be > 0, got {self.learning_rate}")
        self.spec  # noqa: B018  (validates the task)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Interrupted(RuntimeError):
    """Raised by ``stop_after_steps`` (tests simulate a killed run with it)."""


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
            episode.sequential(learner))
        loss, acc, grads = jax.tree.map(lambda x: jnp.tensordot(weights, x, axes=1),
                                        (loss, acc, grads))
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss, "acc": acc}

    return step


def build(config: TrainConfig) -> tuple[Learner, dict[str, data.Split]]:
    """The learner and the train/val/test splits of a config."""
    config.check()
    splits = {name: data.load_split(config.dataset, name, data_dir=config.data_dir,
                                    manual_dir=config.manual_dir, **config.dataset_options)
              for name in ("train", "val", "test")}
    image_shape = tuple(splits["train"].images.shape[1:])
    learner = get_learner(config.learner, config.spec, image_shape=image_shape,
                          compute_dtype=config.compute_dtype, **config.learner_options)
    return learner, splits


def init_params(learner: Learner, split: data.Split, seed: int) -> Any:
    example_x = jnp.zeros((1, *split.images.shape[1:]), jnp.float32)
    return learner.init_params(seeding.purpose_key(seed, "init"), example_x, learner.spec)


def config_differences(saved: dict, config: TrainConfig) -> list[str]:
    """Fields in which a saved ``config.json`` differs from ``config``.

    Fields added to ``TrainConfig`` since the run was saved take their defaults.
    """
    saved = {**json.loads(json.dumps(TrainConfig().to_json())), **saved}
    current = json.loads(json.dumps(config.to_json()))
    return sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))


def _check_workdir_config(workdir: str, config: TrainConfig) -> None:
    path = os.path.join(workdir, "config.json")
    if os.path.exists(path):
        differs = config_differences(results.read_json(path), config)
        if differs:
            raise ValueError(f"workdir {workdir!r} holds a run with a different config "
                             f"(fields {differs}); use a new workdir")
    else:
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
    clock = time.perf_counter()
    for step in range(start, total):
        epoch = step // config.iters_per_epoch
        current = learner.for_epoch(epoch) if learner.for_epoch else learner
        if id(current) not in steps:
            steps[id(current)] = make_train_step(current, optimizer, config.meta_batch, mesh)
        progress = jnp.float32(step / total)
        params, opt_state, out = steps[id(current)](
            params, opt_state, split, jax.random.fold_in(train_key, step), progress)
        loss = float(out["loss"])
        if not math.isfinite(loss):
            raise FloatingPointError(
                f"meta-training loss is {loss} at epoch {epoch}, step {step} "
                f"(global; step {step % config.iters_per_epoch} of the epoch); the last good "
                f"checkpoint is step {ckpt.latest.latest_step()} in {workdir}")
        if (step + 1) % config.log_every == 0:
            rate = config.log_every / (time.perf_counter() - clock)
            clock = time.perf_counter()
            logging.info("epoch %d step %d/%d: loss %.4f acc %.4f (%.1f steps/s)", epoch,
                         step + 1, total, loss, float(out["acc"]), rate)
        if (step + 1) % config.iters_per_epoch == 0:
            val = evaluate(current, params, splits["val"], num_tasks=config.val_tasks,
                           seed=config.seed, purpose="val", batch_size=config.eval_batch,
                           cost_metrics=False, mesh=mesh)
            ckpt.save_best(epoch, params, val["acc_mean"])
            history.append({"epoch": epoch, "val_acc": val["acc_mean"], "val_ce": val["ce_mean"],
                            "train_loss": loss})
            results.write_json(history_path, history)
            ckpt.save_latest(step + 1, params, opt_state)
            logging.info("epoch %d: val acc %.4f ce %.4f", epoch, val["acc_mean"], val["ce_mean"])
        elif config.checkpoint_every and (step + 1) % config.checkpoint_every == 0:
            ckpt.save_latest(step + 1, params, opt_state)
        if stop_after_steps is not None and step + 1 == stop_after_steps and step + 1 < total:
            raise Interrupted(f"stopped after step {step + 1} as asked")
    return params


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


def train_and_evaluate(config: TrainConfig, workdir: str, stop_after_steps: int | None = None,
                       mesh: Mesh | None = None) -> dict[str, Any]:
    """Train (or pretrain) as the learner asks, test on the test split, write results.

    Meta-training and evaluation run over ``mesh`` (default: every device).
    """
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
    params = init_params(learner, splits["train"], config.seed)
    ckpt = checkpoints.Checkpoints(workdir, config.keep_best, read_only=True)
    try:
        if learner.training == "meta":
            members = ckpt.restore_best(params)
            if not members:
                raise FileNotFoundError(f"no best checkpoints in {workdir!r}")
            params = checkpoints.stack(members) if ensemble else members[0]
        elif learner.training == "pretrain":
            params = ckpt.restore_pretrained(params)
    finally:
        ckpt.close()
    return learner, params, config.spec


def load_config(workdir: str) -> TrainConfig:
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{workdir!r} is not a cfsl_jax workdir (no config.json)")
    return TrainConfig(**results.read_json(path))


def evaluate_run(workdir: str, num_tasks: int | None = None,
                 mesh: Mesh | None = None) -> dict[str, Any]:
    """Re-test a finished run from its checkpoints (the same numbers as its training wrote)."""
    started = time.perf_counter()
    config = load_config(workdir)
    learner, params, _ = restore(workdir, ensemble=True)
    splits = build(config)[1]
    ensemble = learner.training == "meta"
    report = evaluate(learner, params, splits["test"], num_tasks=num_tasks or config.test_tasks,
                      seed=config.seed, purpose="eval", batch_size=config.eval_batch,
                      ensemble=ensemble, mesh=mesh)
    best = []
    if ensemble:
        ckpt = checkpoints.Checkpoints(workdir, config.keep_best, read_only=True)
        best = ckpt.best_epochs()
        ckpt.close()
    return results.record(config, learner, splits, report, workdir,
                          wall_seconds=time.perf_counter() - started, best_epochs=best)
