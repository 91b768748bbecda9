"""A run: its config, the learner and data it builds, its workdir, and reading it back.

    from cfsl_jax.training.config import TrainConfig
    from cfsl_jax.training.runs import build, restore, evaluate_run
    learner, splits = build(TrainConfig(learner="protonets", task="B3"))
    learner, params, spec = restore("/tmp/run")  # a finished run: best epoch (or ensemble)
    report = evaluate_run("/tmp/run")            # re-tested from its checkpoints

A workdir holds one run: ``config.json`` (written first; the same workdir with a
different config is refused), its checkpoints, ``val_history.json`` and, once
finished, ``results.json``. ``cfsl_jax.training.train`` trains a run; this module is what a
run is (its ``TrainConfig``, the learner and splits it builds, whether every split
it samples tasks from can supply its spec) and what is read back from its workdir; the config
itself is ``cfsl_jax.training.config``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from cfsl_jax.runtime import backend, checksums, files, json_files, progress, seeding
from cfsl_jax import data
from cfsl_jax.training import results
from cfsl_jax.training import checkpoints
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training.evaluate import evaluate
from cfsl_jax.learners import get_learner
from cfsl_jax.protocol import episode
from cfsl_jax.protocol.learner import Learner
from cfsl_jax.protocol.sampler import check_split
from cfsl_jax.protocol.spec import TaskSpec
from cfsl_jax.training.config import TrainConfig, from_json


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
    training = learner.recipe.training
    return training == "meta" or (training == "pretrain" and config.pretrain_data == "tasks")


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
                            f"{splits[name].info.dataset_variant}: {error}") from None


def build(config: TrainConfig) -> tuple[Learner, dict[str, data.Split]]:
    """The learner and the train/val/test splits of a config; refuses (UserError) a spec that a
    split it samples tasks from cannot supply, before anything is compiled."""
    config.check()
    splits = load_splits(config)
    image_shape = tuple(splits["train"].images.shape[1:])
    learner = get_learner(config.learner, config.spec, image_shape=image_shape,
                          compute_dtype=config.compute_dtype, **config.learner_options)
    check_feasible(config, splits,
                   splits_touched(learner.recipe.training, config.pretrain_data))
    return learner, splits


def init_params(learner: Learner, split: data.Split, seed: int) -> Any:
    """The learner's initial parameters, drawn by one jitted program (not op by op)."""
    example_x = jnp.zeros((1, *split.images.shape[1:]), jnp.float32)
    init = jax.jit(learner.init_params, static_argnums=2)
    return init(seeding.purpose_key(seed, "init"), example_x, learner.spec)


def config_differences(saved: dict, config: TrainConfig) -> list[str]:
    """Fields in which a saved ``config.json`` differs from ``config`` (a field the file lacks
    is read as ``config.from_json`` reads it)."""
    saved = json.loads(json.dumps(from_json(saved).to_json()))
    current = json.loads(json.dumps(config.to_json()))
    return sorted(k for k in set(saved) | set(current)
                  if saved.get(k) != current.get(k) and k not in _NOT_IDENTITY)


def describe_differences(saved: dict, config: TrainConfig, sweep: bool = False) -> str:
    """How ``config`` differs from a saved ``config.json``, as the end of a refusal ('' if it
    does not): the fields, or, where only learner options differ, each option with both values
    and the flags that continue the saved run (``sweep``: ``launch.sweep``'s, scoped to the
    learner, and another sweep directory for other fields)."""
    differs = config_differences(saved, config)
    if differs != ["learner_options"]:
        elsewhere = "another sweep directory" if sweep else "a new workdir"
        return f" (fields: {', '.join(differs)}); use {elsewhere}" if differs else ""
    ran = from_json(saved).learner_options  # both resolved: every option of the learner
    given = config.to_json()["learner_options"]
    names = sorted(k for k in set(ran) | set(given) if ran.get(k) != given.get(k))
    words = "; ".join(f"learner_options {k}: the workdir ran {_flag_value(ran.get(k))}, this "
                      f"command gives {_flag_value(given.get(k))}" for k in names)
    scope = f"{config.learner}:" if sweep else ""
    flags = " ".join(f"--learner_option={scope}{k}={_flag_value(ran.get(k))}" for k in names)
    return f": {words} (add {flags} to continue it)"


def _flag_value(value: Any) -> str:
    """An option's value as --learner_option takes it (a string bare, others as JSON)."""
    return value if isinstance(value, str) else json.dumps(value)


# Config fields that do not change what a run computes (where the files are read from -- the
# dataset variant and split sizes are recorded in results.json and checked by verify -- and
# where its metrics are also sent).
_NOT_IDENTITY = ("download", "data_dir", "manual_dir", "tensorboard", "wandb_project")


def check_workdir_config(workdir: str, config: TrainConfig, create: bool = True) -> None:
    path = files.join(workdir, "config.json")
    if files.exists(workdir) and not files.isdir(workdir):
        raise UserError(f"--workdir={workdir} is a file, not a folder; give another path")
    if files.exists(path):
        recorded = results.read_json(path)
    else:
        # without config.json (deleted, as its damage is told to be mended), a finished run
        # is still the run its results.json records: another config is refused the same way
        recorded = _check_no_other_results(workdir).get("config")
        if recorded is None:
            _check_recorded_checksum(path, config)
    if recorded is not None:
        differs = describe_differences(recorded, config)
        if differs:
            raise UserError(f"workdir {workdir!r} holds a run with a different config{differs}")
    if create and not files.exists(path):
        files.makedirs(workdir)
        results.write_json(path, config.to_json())


def _check_recorded_checksum(path: str, config: TrainConfig) -> None:
    """UserError when ``path`` (a deleted config.json) had its SHA-256 recorded and ``config``'s
    text differs: the checkpoints there were trained with other flags."""
    known = checksums.recorded_sha256(path)
    if known and checksums.sha256(json_files.text(config.to_json())) not in known:
        raise UserError(
            f"{path} is missing, and these flags' config is not the one its checksum was "
            f"recorded for in {checksums.MANIFEST}: the run there was started with other flags; "
            f"run its own command again, or give a new --workdir")


def _check_no_other_results(workdir: str) -> dict[str, Any]:
    """UserError when ``workdir`` holds another kind of run's results.json (a FLUID run's: no
    config.json, no ``test`` entry), which a CFSL run must not resume, print or overwrite; else
    its results.json ({} where there is none)."""
    stored = results.read_json(files.join(workdir, "results.json"), default={})
    if stored and "test" not in stored:
        kind = "a FLUID run" if "streams" in stored else "another kind of run"
        raise UserError(f"--workdir={workdir} holds {kind} (its results.json has no CFSL test "
                        f"results and there is no config.json): give a new --workdir")
    return stored


def finished_results(workdir: str, config: TrainConfig, mend: bool = False
                     ) -> dict[str, Any] | None:
    """The stored results of ``workdir`` when it holds a finished run of ``config``; ``mend``:
    a missing config.json is written again (from ``config``, which is the run's)."""
    path = files.join(workdir, "results.json")
    if not files.isfile(path):
        return None
    check_workdir_config(workdir, config, create=mend)
    return results.read_json(path)


def restore(workdir: str, ensemble: bool = False) -> tuple[Learner, Any, TaskSpec]:
    """(learner, params, spec) of a finished run: the best epoch, or the stacked ensemble."""
    config = load_config(workdir)
    learner, splits = build(config)
    return learner, restore_params(config, learner, splits, workdir, ensemble), config.spec


def validated(workdir: str) -> list[dict]:
    """The rows of ``workdir``'s ``val_history.json`` (one per validated epoch)."""
    return results.read_json(files.join(workdir, "val_history.json"), default=[])


def check_trained(config: TrainConfig, learner: Learner, workdir: str,
                  ckpt: checkpoints.Checkpoints) -> None:
    """UserError unless the run's training is finished: every epoch validated and every best
    epoch that validation ranks among the kept ones present (for a run that selects epochs),
    the pretrained checkpoint (for one pretrained on images). A re-test or verify of a run
    stopped part-way would otherwise report its early epochs as the finished run."""
    again = "finish its training first (re-run launch.train with its flags)"
    if selects_epochs(config, learner):
        history = validated(workdir)
        done = {h["epoch"] for h in history}
        if not done >= set(range(config.epochs)):
            raise UserError(f"the run in {workdir} has validated {len(done)} of its "
                            f"{config.epochs} epochs: delete its results.json (if any) and "
                            f"{again}")
        missing = ckpt.missing_best(history)
        if missing:
            raise UserError(f"{next(iter(missing.values()))}: delete the run's results.json "
                            f"(if any) and re-run launch.train with its flags, which re-creates "
                            f"it by training again (the same numbers)")
    elif learner.recipe.training == "pretrain" and ckpt.pretrained.latest_step() is None:
        raise UserError(f"the run in {workdir} has no pretrained checkpoint: {again}")


def restore_params(config: TrainConfig, learner: Learner, splits, workdir: str,
                   ensemble: bool = False) -> Any:
    """The params of ``restore``, for a learner and splits already built; refused (UserError)
    for a run whose training is not finished (``check_trained``)."""
    params = init_params(learner, splits["train"], config.seed)
    ckpt = checkpoints.Checkpoints(workdir, config.keep_best, read_only=True)
    try:
        check_trained(config, learner, workdir, ckpt)
        if selects_epochs(config, learner):
            members = ckpt.restore_best(params)
            params = checkpoints.stack(members) if ensemble else members[0]
        elif learner.recipe.training == "pretrain":
            params = ckpt.restore_pretrained(params)
    finally:
        ckpt.close()
    return params


def load_config(workdir: str) -> TrainConfig:
    path = files.join(workdir, "config.json")
    if not files.exists(workdir):
        raise UserError(f"--workdir={workdir} does not exist")
    if not files.exists(path):
        raise UserError(f"--workdir={workdir} holds no run (no config.json): give the folder a "
                        f"run was trained into")
    return from_json(results.read_json(path))


def per_task_meta_step_macs(config: TrainConfig, learner: Learner, params: Any,
                            image_shape: tuple[int, ...]) -> float:
    """XLA's MACs of one task's meta-training step, with every support set counted.

    A learner with its own meta-loss is rebuilt with ``unroll=True`` and
    ``unroll_inner=True`` where its factory has those options (MAML++/SCA), since XLA counts
    a loop body once.
    """
    try:
        learner = get_learner(config.learner, config.spec, image_shape=image_shape,
                              compute_dtype=config.compute_dtype,
                              **{**config.learner_options, "unroll": True,
                                 "unroll_inner": True})
    except ValueError:  # no such option: the episode scan is the only loop
        pass
    return episode.meta_step_macs(learner, params, image_shape)


def check_test_data(workdir: str, test: data.Split) -> None:
    """UserError when ``workdir``'s results.json records a test-data digest
    (``test_data_sha256``) other than ``test``'s: the dataset changed since the run was tested,
    so a re-test would give other numbers (and record the new digest as if nothing changed)."""
    from cfsl_jax.training.evaluate import data_digest
    stored = results.read_json(files.join(workdir, "results.json"), default={})
    recorded = stored.get("test_data_sha256")
    if recorded is None:  # a record from before the digest: nothing to compare
        return
    now = data_digest(test)
    if now != recorded:
        raise UserError(
            f"--workdir={workdir} was tested on other test data than {test.info.source} now "
            f"holds (results.json records SHA-256 {recorded[:12]}, now {now[:12]}): the dataset "
            f"changed since, and a re-test would give other numbers; give the --data_dir of the "
            f"data it was tested on, or re-prepare that data")


def evaluate_run(workdir: str, num_tasks: int | None = None,
                 mesh: Mesh | None = None) -> dict[str, Any]:
    """Re-test a finished run from its checkpoints (the same numbers as its training wrote).

    The recorded ``wall_seconds`` stay the training run's (when it recorded them); the
    re-test's own seconds are ``test.seconds``."""
    started, compiled = time.perf_counter(), backend.compile_totals()
    config = load_config(workdir)
    with progress.stage("[evaluate] loading the data and building the learner", quiet_below=1.0):
        learner, splits = build(config)
    check_test_data(workdir, splits["test"])
    ensemble = selects_epochs(config, learner)
    with progress.stage(f"[evaluate] restoring the {'best checkpoints' if ensemble else 'params'}",
                        quiet_below=1.0):
        params = restore_params(config, learner, splits, workdir, ensemble=True)
    report = evaluate(learner, params, splits["test"], num_tasks=num_tasks or config.test_tasks,
                      seed=config.task_seed, purpose="test", batch_size=config.eval_batch,
                      ensemble=ensemble, mesh=mesh, per_task=True)
    best = []
    if ensemble:
        ckpt = checkpoints.Checkpoints(workdir, config.keep_best, read_only=True)
        best = ckpt.best_epochs()
        ckpt.close()
    stored = results.read_json(files.join(workdir, "results.json"), default={})
    report = report.replace(  # the test's programs (and ATM and MACs per task), not the count below
        retest_compile_seconds=backend.compile_stats(compiled)["compile_seconds"])
    if learner.recipe.training == "meta":  # counted again: a count recorded before a fix is not
        member = jax.device_get(jax.tree.map(lambda x: x[0], params))  # carried into the re-test
        with progress.stage("[evaluate] counting the MACs of a meta-training step (XLA)"):
            report = report.replace(macs_per_meta_step=per_task_meta_step_macs(
                config, learner, member, tuple(splits["train"].images.shape[1:])))
    wall = stored.get("wall_seconds", time.perf_counter() - started)
    kept = {k: stored[k] for k in backend.compile_stats() if k in stored} or None
    return results.record(config, learner, splits, report, workdir, wall_seconds=wall,
                          best_epochs=best, compile_since=compiled, run_stats=kept,
                          retest=True)
