"""Packed runs: K runs of one config that differ only in their seeds and learning rates
(``PACKABLE``), meta-trained as one program.

    out = packing.train_pack(config, seeds=(0, 1, 2), workdirs=["W/seed0", "W/seed1", "W/seed2"])
    out = packing.train_pack(config, seeds=(0, 0), learning_rates=(1e-3, 3e-4),
                             workdirs=["W/lr0.001/seed0", "W/lr0.0003/seed0"])

Params, optimiser states and keys are stacked on a leading run axis and one jitted program
(``steps.make_steps(..., runs=True)``, ``steps_per_dispatch`` steps per call) trains them all
(``pack_axis``: the runs vmapped, or one after another with ``lax.map``; ``auto``: map on CPU,
vmap on GPU/TPU); run k's step s draws its tasks from ``fold_in(its own train key, s)``, the
tasks it draws alone, and its optimiser steps at its own learning rate (a traced scalar
where the runs' differ: ``steps.make_steps(per_run=train.pack_optimizer)``; which runs pack:
``pack_runs``). Every run keeps its own workdir as an ordinary run: config.json, checkpoints,
``val_history.json``, metrics and, once the pack is trained, the test and results.json of
``train.train_and_evaluate`` (which finds the run's meta-training done). A pack resumes from
its runs' checkpoints; runs that stand at different steps are packed with the runs at the same
step, or run alone. Numbers equal the solo runs' to the rounding of XLA's batched kernels
(vmap), or bit for bit where XLA compiles a run's step in the map as alone (MAML++ on CPU;
docs/results.md, "Packing runs").
"""

from __future__ import annotations

import collections
import contextlib
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from cfsl_jax.runtime import files, memory, progress, seeding
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training import (checkpoints, loop, pack_eval, pretrain, results, runs, sessions,
                               steps, train)
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.training.pack_eval import SharedValidation, stack
from cfsl_jax.training.pack_runs import (PACKABLE, PackOptions, PackTooLarge,  # noqa: F401
                                         check_seeds, check_steps_per_dispatch,
                                         hyper_parameters, largest_fitting, pack_configs,
                                         pack_key)
from cfsl_jax.training.tracking import Tracking


class RunView:
    """Run ``k``'s slice of a pack's ``TrainState`` (sliced on first access): what its hooks
    see."""

    def __init__(self, state: loop.TrainState, k: int):
        self._state, self._k, self.step = state, k, state.step
        self.pack = state  # the whole pack's state (SharedValidation validates every run)

    @functools.cached_property
    def params(self) -> Any:
        return jax.tree.map(lambda x: x[self._k], self._state.params)

    @functools.cached_property
    def opt_state(self) -> Any:
        return jax.tree.map(lambda x: x[self._k], self._state.opt_state)


class Member(loop.Hook):
    """Run ``k``'s ``hook`` in a pack: each call sees the run's slice of the state."""

    def __init__(self, hook: loop.Hook, k: int):
        self.hook, self.k = hook, k

    def _each(self, method: str, state, *args) -> None:
        getattr(self.hook, method)(RunView(state, self.k), *args)

    def begin(self, state):
        self._each("begin", state)

    def before_step(self, state):
        self._each("before_step", state)

    def record(self, state, out):
        self._each("record", state, out)

    def after_step(self, state):
        self._each("after_step", state)

    def on_stop(self, state):
        self._each("on_stop", state)


def train_pack(config: TrainConfig, seeds: Sequence[int], workdirs: Sequence[str],
               steps_per_dispatch: int = 1, stop_after_steps: int | None = None,
               pack_axis: str = "auto", learning_rates: Sequence[float] | None = None
               ) -> list[dict[str, Any]]:
    """Train and test the runs ``config`` with ``seed`` in ``seeds`` (and the learning rate at
    the same place in ``learning_rates``) into ``workdirs``, the meta-training of the runs
    that stand at the same step packed, then the test of those done
    (``pack_eval.test_pack``); returns their results."""
    meta_train_pack(config, seeds, workdirs, steps_per_dispatch, stop_after_steps,
                    pack_axis=pack_axis, learning_rates=learning_rates)
    configs = pack_configs(config, seeds, learning_rates)
    tested = pack_eval.test_pack(config, configs, workdirs)
    # each run: its (remaining) training alone, its results (its test if not tested above)
    return [train.train_and_evaluate(c, workdir, stop_after_steps, tested=tested.get(workdir))
            for c, workdir in zip(configs, workdirs)]


def meta_train_pack(config: TrainConfig, seeds: Sequence[int], workdirs: Sequence[str],
                    steps_per_dispatch: int = 1, stop_after_steps: int | None = None,
                    shrink: bool = False, pack_axis: str = "auto",
                    learning_rates: Sequence[float] | None = None) -> None:
    """The packed part of ``train_pack``: meta-train (or pretrain on tasks: Pretrain+Tune,
    EWC-Pretrain) the unfinished runs that stand at the same step as packs (a learner that
    trains nothing or pretrains uniformly, or a lone run: nothing). A pack that does not fit
    the device's memory is refused (``PackTooLarge``), or with ``shrink`` (``--pack=auto``)
    split into packs of the largest size that fits, said in a line. ``pack_axis``
    (``steps.resolve_pack_axis``): how a pack computes its runs (pretraining too); not part of a
    run's config (it changes how a run is computed, not what: a packed run's config is the solo
    run's). ``learning_rates``: each run's, aligned with ``seeds`` (a pack of runs that differ
    in it; ``PACKABLE``)."""
    configs = pack_configs(config, seeds, learning_rates)
    check_steps_per_dispatch(config, steps_per_dispatch)
    if stop_after_steps is not None and stop_after_steps % steps_per_dispatch:
        raise ValueError(f"stop_after_steps={stop_after_steps} is not a multiple of "
                         f"steps_per_dispatch={steps_per_dispatch}: the pack never stands there")
    steps.resolve_pack_axis(pack_axis)  # a wrong name: refused before anything is built
    todo = [(c, w) for c, w in zip(configs, workdirs) if runs.finished_results(w, c) is None]
    if len(todo) < 2:
        return
    learner, splits = runs.build(config)
    if not runs.selects_epochs(config, learner):
        return
    with _removed_if_refused([w for _, w in todo]) as created, contextlib.ExitStack() as held:
        for _, w in todo:  # as a solo run's: another process's run is refused
            held.enter_context(train.workdir_locked(w))
        held.enter_context(train.emptied_if_refused(created))  # while the locks are held
        for c, w in todo:
            runs.check_workdir_config(w, c)
            sessions.check_data(w, splits)  # a resume on changed data is refused, as alone
        by_step = collections.defaultdict(list)
        for c, w in todo:
            latest = checkpoints.Checkpoints(w, c.keep_best)  # a damaged newest checkpoint:
            by_step[latest.resumable_step()].append((c, w))  # the run resumes before it
            latest.close()
        common = _common_step(todo, min(by_step)) if len(by_step) > 1 else None
        if common is not None:  # a kill between the runs' checkpoints of one step: the runs
            # ahead go back to the others' step, so the pack trains on as it was (its numbers)
            progress.say(f"[train] the runs of this pack stand at steps {sorted(by_step)} (a "
                         f"kill between their checkpoints, or a damaged newest one): each "
                         f"resumes from step {common}, as one pack")
            by_step = {common: list(todo)}
        for group in by_step.values():
            _train_group(learner, splits, group, steps_per_dispatch, stop_after_steps, shrink,
                         pack_axis, common)


def _common_step(todo, step: int) -> int | None:
    """``step`` when every run of ``todo`` can resume from it (step 0, or an intact resume
    checkpoint of that step), else None."""
    if step == 0:
        return 0
    for c, w in todo:
        ckpt = checkpoints.Checkpoints(w, c.keep_best)
        ckpt.resume_limit = step  # its newest intact checkpoint up to ``step``
        try:
            if ckpt.resumable_step() != step:
                return None
        finally:
            ckpt.close()
    return step


@contextlib.contextmanager
def _removed_if_refused(workdirs: Sequence[str]):
    """As a solo run's (``train.train_and_evaluate``): the workdirs (and their folder) that did
    not exist before are removed when the pack is refused (a ``UserError`` such as
    ``PackTooLarge``, a full disk, out of memory) before any of them checkpointed: nothing is
    left half-written. Yields them; their files are removed while their locks are held
    (``train.emptied_if_refused``), the empty folders here, after the release."""
    created = [w for w in workdirs if not files.exists(w)]
    parents = set()  # every folder above them made with them (W/lrR and W), deepest first
    for w in created:
        parent = files.dirname(w)
        while parent and parent != files.dirname(parent) and not files.exists(parent):
            parents.add(parent)
            parent = files.dirname(parent)
    try:
        yield created
    except Exception as error:
        if train.refused(error):
            for w in created:
                train.remove_empty(w)
            for parent in sorted(parents, key=len, reverse=True):
                if files.isdir(parent) and not files.listdir(parent):
                    files.rmtree(parent)
        raise


def _train_group(learner, splits, group, steps_per_dispatch: int,
                 stop_after_steps: int | None, shrink: bool, pack_axis: str = "auto",
                 limit: int | None = None) -> None:
    """The runs of ``group`` (at one step) trained as a pack; with ``shrink``, a pack that
    does not fit as packs of the largest size that does (size 1: each run alone, later)."""
    if len(group) < 2:
        return
    try:
        if learner.recipe.training == "meta":
            _meta_train_pack(learner, splits, group, steps_per_dispatch, stop_after_steps,
                             pack_axis, limit)
        else:
            _pretrain_pack(learner, splits, group, stop_after_steps, pack_axis, limit)
    except PackTooLarge as error:
        if not shrink:
            raise
        size = max(1, error.fits)
        progress.say(f"--pack=auto: a pack of {len(group)} {learner.name} runs does not fit the "
                     f"device's memory (XLA's estimate: {error}); "
                     + (f"packs of {size} instead" if size > 1 else "each run trains alone"))
        for i in range(0, len(group), size):
            _train_group(learner, splits, group[i:i + size], steps_per_dispatch,
                         stop_after_steps, shrink, pack_axis, limit)


# One jitted packed step per settings (as ``train._train_step``): a resumed or repeated pack
# of the same settings in the process lowers the same function (its ``.lower().compile()``
# compiles again, or loads the program from the persistent compilation cache).
_packed_steps = functools.lru_cache(maxsize=16)(steps.make_steps)


def _meta_train_pack(learner, splits, group, steps_per_dispatch: int,
                     stop_after_steps: int | None, pack_axis: str = "auto",
                     limit: int | None = None) -> None:
    config = group[0][0]
    optimizer = train.make_optimizer(config)
    phase = loop.phase(config, "train", "meta-training", None, steps_per_dispatch)
    initial = []
    for c, _ in group:
        params = runs.init_params(learner, splits["train"], c.seed)
        initial.append(loop.TrainState(params, optimizer.init(params)))
    keys = jnp.stack([seeding.purpose_key(c.seed, "train") for c, _ in group])
    split = splits["train"]
    hyper = hyper_parameters([c for c, _ in group])
    extra = () if hyper is None else (hyper,)  # the runs' own learning rates

    def step_for(count: int):
        """The pack's step function of each epoch, ``count`` steps per call: one program per
        distinct ``learner.at_epoch`` (MAML's first-order epochs), compiled on first use."""
        compiled: dict[int, loop.StepFn] = {}

        def for_epoch(epoch: int, state: loop.TrainState) -> loop.StepFn:
            current = learner.at_epoch(epoch)
            if id(current) not in compiled:
                compiled[id(current)] = compile_step(current, state, count)
            return compiled[id(current)]
        return for_epoch

    def compile_step(current, state, count):
        with progress.stage(f"[train] compiling a pack of {len(group)} {learner.name} "
                            f"meta-training runs, {count} step(s) per call"):
            multi = _packed_steps(current, optimizer, config.meta_batch, count,
                                  runs=True, pack_axis=pack_axis,
                                  per_run=None if hyper is None else train.pack_optimizer).lower(
                state.params, state.opt_state, split, keys, state.step,
                np.zeros(count, np.float32), *extra).compile()
        check_pack_fits(multi, len(group), learner.name)

        def step_fn(state, first, at):
            params, opt_state, out = multi(state.params, state.opt_state, split, keys, first, at,
                                           *extra)
            return loop.TrainState(params, opt_state), out
        return step_fn

    validation = SharedValidation(learner.at_epoch, splits["val"], config)
    how = {"axis": steps.resolve_pack_axis(pack_axis), "steps_per_dispatch": steps_per_dispatch}
    _run_pack(phase, group, initial, step_for, validation, stop_after_steps, how, limit)


def _pretrain_pack(learner, splits, group, stop_after_steps: int | None,
                   pack_axis: str = "auto", limit: int | None = None) -> None:
    """``pretrain.pretrain_on_tasks`` of the runs of ``group`` as one program (one device):
    run k's step s trains on the tasks of ``fold_in(its data key, s)``, from its own head."""
    config, split = group[0][0], splits["train"]
    num_classes = int(split.class_table.shape[0])
    classes = pretrain.image_classes(split.class_table)
    phase = loop.phase(config, "pretrain", "pretraining", None)
    initial, data_keys, full = [], [], {}
    for c, _ in group:
        params = runs.init_params(learner, split, c.seed)
        head_key, data_key = jax.random.split(seeding.purpose_key(c.seed, "pretrain"))
        state = pretrain.init_state(learner, params, num_classes, tuple(split.images.shape[1:]),
                                    head_key, c.learning_rate, c.weight_decay)
        initial.append(loop.TrainState(*state))
        data_keys.append(data_key)
        full[c.seed] = params
    keys = jnp.stack(data_keys)
    packed = pretrain.packed_task_step(
        split, classes, keys, pack_axis, rates=hyper_parameters([c for c, _ in group]),
        learner=learner, num_classes=num_classes, tasks=config.meta_batch,
        learning_rate=config.learning_rate, weight_decay=config.weight_decay)

    def compile_step(state):
        with progress.stage(f"[pretrain] compiling a pack of {len(group)} {learner.name} "
                            f"pretraining runs"):
            multi = jax.jit(packed).lower(state.params, state.opt_state, state.step).compile()
        check_pack_fits(multi, len(group), learner.name)

        def step_fn(state, first, at):
            params, opt_state, out = multi(state.params, state.opt_state, first)
            return loop.TrainState(params, opt_state), out
        return step_fn

    def step_for(count: int):  # one step per call (count is 1), one learner for every epoch
        compiled: list[loop.StepFn] = []

        def for_epoch(epoch: int, state: loop.TrainState) -> loop.StepFn:
            if not compiled:
                compiled.append(compile_step(state))
            return compiled[0]
        return for_epoch

    full_params = stack([full[c.seed] for c, _ in group])
    validation = SharedValidation(lambda epoch: learner, splits["val"], config,
                                  lambda epoch, params: {**full_params, "embed": params["embed"]})
    how = {"axis": steps.resolve_pack_axis(pack_axis), "steps_per_dispatch": 1}
    _run_pack(phase, group, initial, step_for, validation, stop_after_steps, how, limit)


def _run_pack(phase: loop.Phase, group, initial: Sequence[loop.TrainState], step_for,
              validation: SharedValidation, stop_after_steps: int | None,
              how: dict[str, Any], limit: int | None = None) -> None:
    """``loop.run`` for the runs of ``group`` at once: each restored from its own checkpoints
    (all at one step), its own hooks on its row; ``step_for(S)(epoch, stacked state)`` gives
    the pack's step function of an epoch, S steps per call. The pack's wall time is a session
    of each run (its ``wall_seconds``: the time it took, shared with the pack's other runs)."""
    with sessions.opened(group):
        _run_hooks(phase, group, initial, step_for, validation, stop_after_steps, how, limit)


def _run_hooks(phase: loop.Phase, group, initial: Sequence[loop.TrainState], step_for,
               validation: SharedValidation, stop_after_steps: int | None,
               how: dict[str, Any], limit: int | None = None) -> None:
    """``_run_pack``'s work; ``limit``: no run resumes after this step (its later resume
    checkpoints are removed: ``Checkpoints.resume_limit``); ``how``: the pack's axis and steps
    per call, recorded in each run's ``packs.json`` with the pack's seeds
    (``results.record_steps``)."""
    members, states, restored_at = [], [], set()
    for k, ((c, w), state) in enumerate(zip(group, initial)):
        outputs = loop.Outputs(w, checkpoints.Checkpoints(w, c.keep_best),
                               Tracking(w, c.tensorboard, c.wandb_project, c.to_json()))
        outputs.ckpt.resume_limit = limit
        restored = outputs.ckpt.restore_latest(state.params, state.opt_state)
        if restored:
            state = loop.TrainState(*restored[1:], step=restored[0])
        restored_at.add(state.step)
        outputs.tracking.rewind(phase.name, state.step)  # records after the restored step: redone
        states.append(state)
        members.append((outputs, _hooks(phase, state.step, outputs, validation.for_run(k), k)))
    if len(restored_at) > 1:  # a checkpoint that passed its check but did not restore (a
        # workdir written before checksums): the damaged ones are removed now, so the runs
        # group by the step each resumes from on the next call
        raise UserError(f"the runs of this pack resumed from different steps "
                        f"{sorted(restored_at)} (a damaged checkpoint fell back): run the same "
                        f"command again, which groups them by those steps")
    (start,) = restored_at
    phase = loop.aligned(phase, start)  # a run stopped at a step S does not divide
    if start:
        progress.say(f"[{phase.name}] resuming a pack of {len(group)} runs from step {start}")
    state = loop.TrainState(stack([s.params for s in states]),
                            stack([s.opt_state for s in states]), step=start)
    for_epoch = step_for(phase.steps_per_dispatch)
    if start < phase.total:  # steps to compute (else only an epoch's validation left)
        seeds = [c.seed for c, _ in group]
        pack = {"seeds": seeds, "learning_rates": [c.learning_rate for c, _ in group], **how,
                "steps_per_dispatch": phase.steps_per_dispatch}
        for _, w in group:
            results.record_steps(w, phase.name, start, pack)
        for_epoch(start // phase.iters_per_epoch, state)  # compiled (and its size checked) now
    # each kind of hook for every run before the next kind (as ``loop.run``'s order within a
    # run): every run's progress line and steps/s are read before the pack's validation, and
    # every run is checkpointed before it
    hooks: list[loop.Hook] = [Member(h[i], k) for i in range(len(members[0][1]))
                              for k, (_, h) in enumerate(members)]
    if stop_after_steps is not None:
        hooks.append(loop.StopAfter(stop_after_steps, phase.total))
    try:
        loop.run_hooks(phase, state, for_epoch, hooks,
                       lambda stop, state: loop.interrupted(
                           stop, f"at step {state.step} of {phase.total}",
                           "each run's checkpoints are",
                           ", ".join(w for _, w in group)))
    finally:
        for outputs, _ in members:
            outputs.tracking.close()
            outputs.ckpt.close()


def check_pack_fits(compiled, size: int, learner_name: str) -> None:
    """PackTooLarge (a UserError: one line naming --pack and the largest pack that fits) when
    the compiled pack cannot fit the device's memory (``memory.check_fits``'s estimate),
    before it runs."""
    limit, with_arguments = memory.device_limit(jax.local_devices()[0])
    need = memory.needed_bytes(compiled, with_arguments)
    if limit is None or need is None or need <= limit:
        return
    fits = largest_fitting(need, limit, size)
    try:
        memory.check_fits(compiled, f"a pack of {size} {learner_name} runs",
                          f"--pack={size} is too many: at most --pack={fits} fits (XLA's "
                          f"estimate)" if fits else "even one run of it does not fit")
    except UserError as error:
        raise PackTooLarge(str(error), fits) from None


def _hooks(phase: loop.Phase, start: int, outputs: loop.Outputs, validate, k: int
           ) -> list[loop.Hook]:
    """Run ``k``'s Metrics, Checkpoint and Validation hooks (``loop.run``'s, on its row)."""
    metrics = loop.Metrics(phase, start, outputs, run=k)
    return [metrics, loop.Checkpoint(phase, start, outputs, metrics),
            loop.Validation(phase, start, outputs, validate, metrics)]


__all__ = ["PACKABLE", "PackOptions", "PackTooLarge", "RunView", "check_pack_fits", "check_seeds",
           "check_steps_per_dispatch", "hyper_parameters", "largest_fitting", "meta_train_pack",
           "pack_configs", "pack_key", "stack", "train_pack"]
