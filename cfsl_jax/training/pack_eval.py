"""A pack's evaluation: its runs validated and tested on tasks sampled once, in one program.

The validation tasks (after each epoch) and the test tasks are a function of the shared
evaluation seed (``task_seed``), the same for every run of a pack: ``evaluate(..., runs=True)``
samples and gathers each chunk's tasks once and runs the K runs' params on them one after
another (``lax.map`` over the run axis), each run's computation the one it runs alone, so its
numbers are the lone run's (the test-task fingerprint always; accuracy and CE bit-equal on CPU,
``tests/test_pack_eval.py``). Each run still writes its own ``val_history.json``, best-epoch
checkpoints and results.json: ``SharedValidation`` answers each run's ``Validation`` hook from
one evaluation of the pack per epoch, ``test_pack`` gives each run's test record to
``train.train_and_evaluate`` (``tested=``), which writes the run's results as alone.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from cfsl_jax.runtime import files, parallel, progress, stops
from cfsl_jax.training import checkpoints, loop, runs
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.training.evaluate import evaluate
from cfsl_jax.training.records import EvalRecord


class SharedValidation:
    """One validation of a pack per epoch, shared by its runs' ``Validation`` hooks.

    ``learner_at(epoch)`` is the learner validated after ``epoch``, ``params_of(epoch,
    stacked params)`` the params (run axis first);
    ``for_run(k)`` is run k's ``ValidateFn``: the first run asking at an epoch end validates
    every run, the others read their record (a run that resumed with its entry written does
    not ask)."""

    def __init__(self, learner_at: Callable[[int], Any], split, config: TrainConfig,
                 params_of: Callable[[int, Any], Any] = lambda epoch, params: params):
        self.learner_at, self.split, self.config = learner_at, split, config
        self.params_of = params_of
        self._at: tuple[int, int] | None = None
        self._records: list[EvalRecord] = []
        self._params: Any = None

    def _validate(self, epoch: int, pack: loop.TrainState) -> None:
        if self._at == (epoch, pack.step):
            return
        c = self.config
        params = self.params_of(epoch, pack.params)
        self._records = evaluate(self.learner_at(epoch), params, self.split,
                                 num_tasks=c.val_tasks, seed=c.task_seed, purpose="val",
                                 batch_size=c.eval_batch, cost_metrics=False,
                                 mesh=parallel.make_mesh(), runs=True)
        self._params, self._at = params, (epoch, pack.step)

    def for_run(self, k: int):
        def validate(epoch: int, view):
            self._validate(epoch, view.pack)
            return self._records[k], jax.tree.map(lambda x: x[k], self._params)
        return validate


def ready_to_test(config: TrainConfig, workdir: str) -> bool:
    """Whether the run in ``workdir`` finished its training and every epoch's validation (its
    best checkpoints intact) and has no results yet: its test is all that is left."""
    if runs.finished_results(workdir, config) is not None or not files.isdir(
            files.join(workdir, "checkpoints")):
        return False
    history = runs.validated(workdir)
    validated = {h["epoch"] for h in history}
    ckpt = checkpoints.Checkpoints(workdir, config.keep_best, read_only=True)
    try:
        return (ckpt.latest.latest_step() == config.epochs * config.iters_per_epoch
                and validated >= set(range(config.epochs)) and not ckpt.damaged_best()
                and not ckpt.missing_best(history))
    finally:
        ckpt.close()


def test_pack(config: TrainConfig, configs: Sequence[TrainConfig], workdirs: Sequence[str]
              ) -> dict[str, EvalRecord]:
    """The test records (by workdir) of the runs of a pack that have only their test left,
    tested as one program on the test tasks sampled once; ``{}`` when fewer than two have,
    or for a learner that selects no epochs. ``config`` is any run's config (they differ only
    in ``pack_runs.PACKABLE`` fields, which evaluation does not read, and share their test
    tasks' seed: ``pack_runs.pack_configs``)."""
    if len({c.task_seed for c in configs}) > 1:
        raise ValueError(f"a pack's runs must share their test tasks' seed, got "
                         f"{sorted({c.task_seed for c in configs})}")
    ready = [(c, w) for c, w in zip(configs, workdirs) if ready_to_test(c, w)]
    if len(ready) < 2:
        return {}
    learner, splits = runs.build(config)
    if not runs.selects_epochs(config, learner):
        return {}
    with progress.stage(f"[test] restoring the best checkpoints of a pack of {len(ready)}",
                        quiet_below=1.0):
        members = [runs.restore_params(c, learner, splits, w, ensemble=True) for c, w in ready]
    if len({jax.tree.leaves(m)[0].shape for m in members}) > 1:
        return {}  # different numbers of best epochs: each run is tested alone
    try:
        with stops.handled():
            records = evaluate(learner, stack(members), splits["test"],
                               num_tasks=config.test_tasks, seed=config.task_seed,
                               purpose="test", batch_size=config.eval_batch, ensemble=True,
                               per_task=True, runs=True)
    except (stops.StopRequested, SystemExit) as stop:
        stops.clear()
        raise loop.interrupted(stop, "during the pack's test", "training is complete and "
                               "checkpointed", ", ".join(w for _, w in ready),
                               then="test") from None
    return {w: record for (_, w), record in zip(ready, records)}


def stack(trees: Sequence[Any]) -> Any:
    """Trees of one structure stacked along a new leading (run) axis."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


__all__ = ["SharedValidation", "ready_to_test", "stack", "test_pack"]
