"""The loop driver: one epoch loop for meta-training and for pretraining on tasks.

    final = loop.run(phase, state, step_for, validate, loop.Outputs(workdir, ckpt, tracking))

It owns a training phase's lifecycle: resume from ``checkpoints/latest``, then ``run_hooks``: a
short loop of one jitted step per iteration (step ``s`` draws its tasks from
``fold_in(phase.key, s)``) with the periodic work as hooks, as flax's and big_vision's
"periodic actions": ``Metrics`` (the loss checked finite before any checkpoint, metrics and
progress lines), ``Checkpoint``, ``Validation`` (after every epoch, the best ``keep_best``
epochs kept, ``val_history.json``) and ``StopAfter``; and stop (``interrupted``).

Rules:

- A step's result and its step number are recorded together (``TrainState.step``), inside
  ``stops.deferred()``: a stop signal during a step waits for its end. A checkpoint always
  pairs a state with the step that produced it, so a resumed run repeats no step and skips none.
- Metrics stay on the device between log steps: the host reads the losses of the steps since
  its last read once per log interval (``log_every`` steps, or a progress line due, the end of
  an epoch, a checkpoint or a stop); every loss since the last checkpoint is checked finite
  before the next one is written (``NonFiniteLoss``: one line naming the step and the
  checkpoint the process resumed from). A resume first drops the metrics records of the steps
  after the restored one (``Tracking.rewind``).
- The end of epoch ``e`` checkpoints the state first, then validates it. A run stopped during
  validation resumes by validating the restored state (an epoch end without its entry in
  ``val_history.json``).
- A stop (a stop signal, Ctrl-C, or a ``SystemExit`` raised by a scheduler library's signal
  handler) checkpoints the last recorded step, if it is newer than the last checkpoint and its
  losses are finite, and raises ``Stopped`` (``SystemExit``: the same line is printed and the
  ``SystemExit`` goes on).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from cfsl_jax.runtime import files, progress, stops
from cfsl_jax.runtime.errors import NonFiniteLoss
from cfsl_jax.training import checkpoints, results, sessions
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.training.tracking import Tracking


class TrainState(NamedTuple):
    params: Any  # what the step trains
    opt_state: Any  # the optimiser's state for ``params``
    step: int = 0  # steps done (a host int): a state and the step that produced it go together


# (state, first step, progress float32 [S] in [0, 1)) -> (the state S steps later, {"loss",
# "acc"}: a scalar for S = 1, else [S] (a pack: a leading run axis)), on device. Step s draws
# its tasks from fold_in(the run's key, s) (``per_step`` adapts a one-step function).
StepFn = Callable[[TrainState, int, np.ndarray], tuple[TrainState, dict[str, jax.Array]]]
# (epoch, state) -> (validation report with "acc_mean" and "ce_mean", the params to keep)
ValidateFn = Callable[[int, TrainState], tuple[dict[str, Any], Any]]


def per_step(key: jax.Array, fn: Callable[[TrainState, jax.Array, jax.Array], Any]) -> StepFn:
    """The ``StepFn`` (S = 1) of ``fn(state, key, progress)``: step s draws ``fold_in(key, s)``."""
    return lambda state, first, progress: fn(state, jax.random.fold_in(key, first), progress[0])


class Interrupted(RuntimeError):
    """Raised by ``stop_after_steps`` (tests stop a run at a chosen step with it)."""


class Stopped(KeyboardInterrupt):
    """A run stopped by a signal after its reached step was checkpointed; the message says how
    to resume, ``exit_status`` is 128 + the signal's number (130 for Ctrl-C)."""

    def __init__(self, message: str, exit_status: int = stops.exit_status(2)):
        super().__init__(message)
        self.exit_status = exit_status


def interrupted(stop: BaseException, when: str, where: str, workdir: str,
                then: str = "resume") -> BaseException:
    """What to raise for ``stop`` (a stop signal, Ctrl-C, or a scheduler library's
    ``SystemExit``): a ``Stopped`` whose one line says when the run stopped, what is kept in
    ``workdir`` and that re-running the command will ``then``; a ``SystemExit`` goes on
    itself, its line printed to stderr. The only place that line is built."""
    cause = f" by {stops.name(stop.signum)}" if isinstance(stop, stops.StopRequested) else ""
    message = (f"interrupted{cause} {when}; {where} in {workdir}: re-run the same command to "
               f"{then}")
    if isinstance(stop, SystemExit):
        print(message, file=sys.stderr, flush=True)
        return stop
    return Stopped(message, stop.exit_status if isinstance(stop, stops.StopRequested) else 130)


@dataclasses.dataclass(frozen=True)
class Phase:
    """A training phase's schedule (all in steps)."""

    name: str  # "train" or "pretrain": progress lines, messages and metrics
    what: str  # "meta-training" or "pretraining": messages
    epochs: int
    iters_per_epoch: int
    checkpoint_every: int  # steps between mid-epoch checkpoints (0: epoch ends only)
    log_every: int  # steps between log lines (and host reads of the losses)
    key: jax.Array  # step s draws with fold_in(key, s)
    steps_per_dispatch: int = 1  # S: steps per host call (it divides the intervals above)

    @property
    def total(self) -> int:
        return self.epochs * self.iters_per_epoch

    def epoch_end(self, step: int) -> bool:
        """Whether ``step`` steps done end an epoch."""
        return step % self.iters_per_epoch == 0

    def checkpoint_due(self, step: int) -> bool:
        return self.epoch_end(step) or bool(self.checkpoint_every
                                            and step % self.checkpoint_every == 0)


def phase(config: TrainConfig, name: str, what: str, key: jax.Array,
          steps_per_dispatch: int = 1) -> Phase:
    """The schedule of a run's training phase."""
    return Phase(name, what, config.epochs, config.iters_per_epoch, config.checkpoint_every,
                 config.log_every, key, steps_per_dispatch)


class Outputs(NamedTuple):
    """Where a phase writes: its workdir, checkpoints and metrics."""

    workdir: str
    ckpt: checkpoints.Checkpoints
    tracking: Tracking


class Hook:
    """Periodic work around the steps (flax's and big_vision's "periodic actions"): ``begin``
    once before the first step; ``before_step``; ``record(state, out)`` the step's result,
    inside ``stops.deferred()`` (bookkeeping only); ``after_step`` after every step (it decides
    whether it is due); ``on_stop`` when a stop interrupts the phase."""

    def begin(self, state: TrainState) -> None:
        pass

    def before_step(self, state: TrainState) -> None:
        pass

    def record(self, state: TrainState, out: dict[str, jax.Array]) -> None:
        pass

    def after_step(self, state: TrainState) -> None:
        pass

    def on_stop(self, state: TrainState) -> None:
        pass


class Metrics(Hook):
    """Keeps the steps' metrics on the device and reads them once per log interval (or a
    progress line due, a checkpoint, the end of an epoch or of the phase): checks every loss
    finite (``NonFiniteLoss``, a FloatingPointError naming the first non-finite step and the
    checkpoint this process resumed from), writes their means to
    ``tracking`` and updates the progress line."""

    def __init__(self, phase: Phase, start: int, outputs: Outputs, run: int | None = None):
        self.phase, self.outputs, self.run = phase, outputs, run  # run: its row in a pack
        self.start = start  # the step this process began the phase at (0, or a resume)
        self.outs: list[dict[str, jax.Array]] = []
        self.first = start  # the step of outs[0]
        self.clock = time.perf_counter()
        self.last_loss: float | None = None  # of the last step read
        self.last_acc: float | None = None
        self.bar = progress.tracker(phase.name, phase.total, "steps", start=start)

    def restart_bar(self, step: int) -> None:
        self.bar = progress.tracker(self.phase.name, self.phase.total, "steps", start=step,
                                    first_line=False)

    def before_step(self, state: TrainState) -> None:
        if not self.outs:  # steps/s counts training steps (not compiles, validation)
            self.clock = time.perf_counter()

    def record(self, state: TrainState, out: dict[str, jax.Array]) -> None:
        self.outs.append(out)

    def after_step(self, state: TrainState) -> None:
        done, phase = state.step, self.phase
        if (phase.checkpoint_due(done) or done % phase.log_every == 0 or self.bar.due()
                or done == phase.total):
            self.read(done)
            self.bar.update(done, force=done % phase.log_every == 0,
                            epoch=(done - 1) // phase.iters_per_epoch, loss=self.last_loss,
                            acc=self.last_acc)

    def read(self, step: int) -> None:
        """Read the window's metrics (one transfer), check them and write their means."""
        if not self.outs:
            return
        values = jax.device_get(self.outs)  # waits for the device: the time includes the work
        elapsed = time.perf_counter() - self.clock

        def column(name: str) -> np.ndarray:  # the steps' values, in order
            rows = [np.asarray(v[name], np.float64) for v in values]
            return np.concatenate([np.ravel(r if self.run is None else r[self.run])
                                   for r in rows])

        loss, acc = column("loss"), column("acc")
        first = self.first
        bad = np.flatnonzero(~np.isfinite(loss))
        if bad.size:
            self.first, self.outs = self.first + len(loss), []
            at, phase = first + int(bad[0]), self.phase
            raise NonFiniteLoss(
                f"{phase.what} loss is {loss[bad[0]]} at epoch {at // phase.iters_per_epoch}, "
                f"step {at} (global; step {at % phase.iters_per_epoch} of the epoch)"
                f"{resumed_from(self.start, self.outputs.workdir)}; the newest checkpoint, step "
                f"{self.outputs.ckpt.latest.latest_step()}, is the state before it and "
                f"re-running from it meets the same loss: change the settings (e.g. a lower "
                f"--learning_rate, in a new workdir) or check the data")
        # the window is dropped with its record written, never before: a stop in between would
        # leave neither (on_stop reads the window again; a resume's validation of an epoch end
        # reads its last_loss from this record)
        with stops.deferred():
            self.outputs.tracking.scalars(self.phase.name, step, {
                "loss": float(loss.mean()), "acc": float(acc.mean()),
                "last_loss": float(loss[-1]), "steps_per_s": len(loss) / max(elapsed, 1e-9)})
            self.first, self.outs = self.first + len(loss), []
            self.clock = time.perf_counter()
            self.last_loss, self.last_acc = float(loss[-1]), float(acc[-1])


class Checkpoint(Hook):
    """Saves ``checkpoints/latest`` (and the session's time: ``sessions``; and seals
    metrics.jsonl: ``Tracking.seal``) at every checkpoint step, epoch end, and on a stop the
    last step reached (losses checked finite first)."""

    def __init__(self, phase: Phase, start: int, outputs: Outputs, metrics: Metrics):
        self.phase, self.outputs, self.metrics = phase, outputs, metrics
        self.saved = start

    def save(self, state: TrainState) -> None:
        with stops.deferred():
            self.outputs.ckpt.save_latest(state.step, state.params, state.opt_state)
            self.saved = state.step
            sessions.checkpointed(self.outputs.workdir)
            self.outputs.tracking.seal()  # metrics.jsonl so far: checked when read

    def after_step(self, state: TrainState) -> None:
        if self.phase.checkpoint_due(state.step):
            self.save(state)

    def on_stop(self, state: TrainState) -> None:
        with stops.stopping():  # a second Ctrl-C does not cut this checkpoint short
            if state.step > self.saved and _alive(state):
                self.metrics.read(state.step)
                self.save(state)

    @property
    def where(self) -> str:
        return f"checkpointed at step {self.saved}" if self.saved else "nothing to checkpoint yet"


class Validation(Hook):
    """At the end of epoch ``e`` (after its checkpoint): validates the state, keeps the best
    ``keep_best`` epochs and appends to ``val_history.json``. A run stopped during validation
    resumes by validating the restored state (an epoch end without its history entry)."""

    def __init__(self, phase: Phase, start: int, outputs: Outputs, validate: ValidateFn,
                 metrics: Metrics):
        self.phase, self.outputs, self.validate, self.metrics = phase, outputs, validate, metrics
        self.path = files.join(outputs.workdir, "val_history.json")
        self.history = [h for h in results.read_json(self.path, default=[])
                        if h["epoch"] < start // phase.iters_per_epoch]

    def begin(self, state: TrainState) -> None:
        pending = state.step // self.phase.iters_per_epoch - 1
        if (self.phase.epoch_end(state.step) and pending >= 0
                and not any(h["epoch"] == pending for h in self.history)):
            self.epoch_end(pending, state, self.outputs.tracking.recorded(
                self.phase.name, state.step, "last_loss"))

    def after_step(self, state: TrainState) -> None:
        if self.phase.epoch_end(state.step):
            self.epoch_end(state.step // self.phase.iters_per_epoch - 1, state,
                           self.metrics.last_loss)

    def epoch_end(self, epoch: int, state: TrainState, train_loss: float | None) -> None:
        val, keep = self.validate(epoch, state)
        with stops.deferred():  # a checkpoint is never cut short by a signal
            self.outputs.ckpt.save_best(epoch, keep, val["acc_mean"])
            self.history.append({"epoch": epoch, "val_acc": val["acc_mean"],
                                 "val_ce": val["ce_mean"], "train_loss": train_loss})
            results.write_json(self.path, self.history)
        self.outputs.tracking.scalars("val", state.step, {
            "acc": val["acc_mean"], "ce": val["ce_mean"], "epoch": epoch})
        progress.say(f"[{self.phase.name}] epoch {epoch}: val acc {val['acc_mean']:.4f} "
                     f"ce {val['ce_mean']:.4f}")
        self.metrics.restart_bar(state.step)


class StopAfter(Hook):
    """Raises ``Interrupted`` after step ``steps`` (tests stop a run at a chosen step)."""

    def __init__(self, steps: int, total: int):
        self.steps, self.total = steps, total

    def after_step(self, state: TrainState) -> None:
        if state.step == self.steps and state.step < self.total:
            raise Interrupted(f"stopped after step {state.step} as asked")


def run(phase: Phase, state: TrainState, step_for: Callable[[int, TrainState], StepFn],
        validate: ValidateFn, outputs: Outputs,
        place: Callable[[TrainState], TrainState] = lambda s: s,
        stop_after_steps: int | None = None) -> TrainState:
    """Train ``state`` for ``phase``, resuming from ``outputs.ckpt``; returns the final state.

    ``step_for(epoch, state)`` gives the epoch's step function (compiled for ``state`` on first
    use; the caller caches it), ``validate`` validates an epoch's state, ``place`` puts a
    (restored) ``(params, opt_state)`` on the devices. The periodic work is hooks:
    ``Metrics``, ``Checkpoint``, ``Validation`` (in that order after each step), ``StopAfter``.
    """
    restored = outputs.ckpt.restore_latest(state.params, state.opt_state)
    if restored is not None:
        state = TrainState(*restored[1:], step=restored[0])
        progress.say(f"[{phase.name}] resuming from step {state.step}")
    outputs.tracking.rewind(phase.name, state.step)  # records after the restored step: redone
    if state.step < phase.total:
        results.record_steps(outputs.workdir, phase.name, state.step, None)
    state = TrainState(*place(tuple(state[:2])), step=state.step)  # the step: a host int
    metrics = Metrics(phase, state.step, outputs)
    checkpoint = Checkpoint(phase, state.step, outputs, metrics)
    hooks = [metrics, checkpoint, Validation(phase, state.step, outputs, validate, metrics)]
    if stop_after_steps is not None:
        hooks.append(StopAfter(stop_after_steps, phase.total))
    return run_hooks(phase, state, step_for, hooks, lambda stop, state: interrupted(
        stop, f"at step {state.step} of {phase.total}", checkpoint.where, outputs.workdir))


def aligned(phase: Phase, start: int) -> Phase:
    """``phase`` with the most steps per call that divide both its own and ``start`` (a run
    stopped at a step its steps per call do not divide: trained alone before, or in a pack of
    other steps per call), said in a line: every epoch end, checkpoint and log step is then
    reached (``run_hooks`` refuses a start its steps per call do not divide)."""
    count = math.gcd(phase.steps_per_dispatch, start)
    if count == phase.steps_per_dispatch:
        return phase
    progress.say(f"[{phase.name}] training resumes from step {start}, which "
                 f"--steps_per_dispatch={phase.steps_per_dispatch} does not divide: {count} "
                 f"step(s) per call")
    return dataclasses.replace(phase, steps_per_dispatch=count)


def run_hooks(phase: Phase, state: TrainState, step_for: Callable[[int, TrainState], StepFn],
              hooks: list[Hook], stopped: Callable[[BaseException, TrainState], BaseException]
              ) -> TrainState:
    """The loop: from ``state.step`` to ``phase.total``, ``phase.steps_per_dispatch`` steps per
    call of the step function, the hooks around each call. A stop (a stop signal, Ctrl-C or a
    scheduler's ``SystemExit``) runs the hooks' ``on_stop`` with the last state reached, then
    raises ``stopped(stop, state)``."""
    count = phase.steps_per_dispatch
    if state.step % count:
        raise ValueError(f"{phase.name} from step {state.step} at {count} steps per call would "
                         f"pass its epoch ends, checkpoints and logs: use loop.aligned")
    try:
        with stops.handled():
            for hook in hooks:
                hook.begin(state)
            for step in range(state.step, phase.total, count):
                step_fn = step_for(step // phase.iters_per_epoch, state)
                for hook in hooks:
                    hook.before_step(state)
                at = np.asarray([(step + i) / phase.total for i in range(count)], np.float32)
                with stops.deferred():  # a state is recorded with the step that produced it
                    new, out = step_fn(state, step, at)
                    state = new._replace(step=step + count)
                    for hook in hooks:
                        hook.record(state, out)
                for hook in hooks:
                    hook.after_step(state)
    except (KeyboardInterrupt, SystemExit) as stop:
        stops.clear()
        for hook in hooks:
            hook.on_stop(state)
        raise stopped(stop, state) from None
    return state


def resumed_from(start: int, workdir: str) -> str:
    """How the process began the phase, for the non-finite loss message."""
    if start:
        return f"; this process resumed from the checkpoint of step {start} in {workdir}"
    return f"; this process trained from step 0 (no checkpoint) in {workdir}"


def _alive(state: TrainState) -> bool:
    """Whether no buffer of ``state`` was donated to a step that did not return."""
    return not any(getattr(leaf, "is_deleted", lambda: False)() for leaf in jax.tree.leaves(state))
