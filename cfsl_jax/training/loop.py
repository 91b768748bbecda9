"""The loop driver: one epoch loop for meta-training and for pretraining on tasks.

    final = loop.run(phase, state, step_for, validate, ckpt, workdir)

It owns a training phase's lifecycle: resume from ``checkpoints/latest``, one jitted step per
iteration (step ``s`` draws its tasks from ``fold_in(phase.key, s)``), the loss checked finite
before any checkpoint, validation after every epoch with the best ``keep_best`` epochs kept,
``val_history.json``, progress lines and metrics, and stop.

Rules:

- A step's result and its step number are recorded together (``Committed``), inside
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
import sys
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from cfsl_jax.runtime import files, progress, stops
from cfsl_jax.runtime.errors import NonFiniteLoss
from cfsl_jax.training import results
from cfsl_jax.training import checkpoints
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.training.tracking import Tracking


class TrainState(NamedTuple):
    params: Any  # what the step trains
    opt_state: Any  # the optimiser's state for ``params``


# (state, key, progress in [0, 1)) -> (new state, {"loss": scalar, "acc": scalar}), on device
StepFn = Callable[[TrainState, jax.Array, jax.Array], tuple[TrainState, dict[str, jax.Array]]]
# (epoch, state) -> (validation report with "acc_mean" and "ce_mean", the params to keep)
ValidateFn = Callable[[int, TrainState], tuple[dict[str, Any], Any]]


class Interrupted(RuntimeError):
    """Raised by ``stop_after_steps`` (tests stop a run at a chosen step with it)."""


class Stopped(KeyboardInterrupt):
    """A run stopped by a signal after its reached step was checkpointed; the message says how
    to resume, ``exit_status`` is 128 + the signal's number (130 for Ctrl-C)."""

    def __init__(self, message: str, exit_status: int = stops.exit_status(2)):
        super().__init__(message)
        self.exit_status = exit_status


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

    @property
    def total(self) -> int:
        return self.epochs * self.iters_per_epoch


def phase(config: TrainConfig, name: str, what: str, key: jax.Array) -> Phase:
    """The schedule of a run's training phase."""
    return Phase(name, what, config.epochs, config.iters_per_epoch, config.checkpoint_every,
                 config.log_every, key)


class Committed(NamedTuple):
    step: int  # steps done
    state: TrainState  # the state after them


class _Window:
    """The (device) metrics of the steps since the host last read them."""

    def __init__(self, start: int):
        self.outs: list[dict[str, jax.Array]] = []
        self.first = start  # the step of outs[0]
        self.clock = time.perf_counter()
        self.last_loss: float | None = None  # of the last step read
        self.last_acc: float | None = None

    def add(self, out: dict[str, jax.Array]) -> None:
        self.outs.append(out)

    def read(self) -> dict[str, np.ndarray]:
        """Every metric of the window on the host (one transfer); the window restarts."""
        values = jax.device_get(self.outs)
        read = {name: np.asarray([v[name] for v in values], np.float64)
                for name in (values[0] if values else {"loss": 0, "acc": 0})}
        self.first += len(self.outs)
        self.outs = []
        return read


def run(phase: Phase, state: TrainState, step_for: Callable[[int, TrainState], StepFn],
        validate: ValidateFn, ckpt: checkpoints.Checkpoints, workdir: str,
        place: Callable[[TrainState], TrainState] = lambda s: s,
        tracking: Tracking | None = None, stop_after_steps: int | None = None) -> TrainState:
    """Train ``state`` for ``phase`` (resuming from ``ckpt``); returns the final state.

    ``step_for(epoch, state)`` gives the epoch's step function (compiled for ``state`` on first
    use; the caller caches it), ``validate`` validates an epoch's state, ``place`` puts a (restored) state on
    the devices, ``tracking`` receives the metrics.
    """
    tracking = tracking or Tracking(None)
    start = 0
    restored = ckpt.restore_latest(state.params, state.opt_state)
    if restored is not None:
        start, params, opt_state = restored
        state = TrainState(params, opt_state)
        progress.say(f"[{phase.name}] resuming from step {start}")
    tracking.rewind(phase.name, start)  # records of steps after the restored one are redone
    committed = Committed(start, place(state))
    history_path = files.join(workdir, "val_history.json")
    history = [h for h in results.read_json(history_path, default=[])
               if h["epoch"] < start // phase.iters_per_epoch]
    saved = start
    window = _Window(start)
    bar = progress.tracker(phase.name, phase.total, "steps", start=start)
    total = phase.total

    def read_window(step: int) -> dict[str, float] | None:
        """Read the window's metrics; FloatingPointError naming the first non-finite step."""
        first = window.first
        if not window.outs:
            return None
        elapsed = time.perf_counter() - window.clock
        read = window.read()
        bad = np.flatnonzero(~np.isfinite(read["loss"]))
        if bad.size:
            at = first + int(bad[0])
            raise NonFiniteLoss(
                f"{phase.what} loss is {read['loss'][bad[0]]} at epoch "
                f"{at // phase.iters_per_epoch}, step {at} (global; step "
                f"{at % phase.iters_per_epoch} of the epoch){resumed_from(start, workdir)}; the "
                f"newest checkpoint, step {ckpt.latest.latest_step()}, is the state before it "
                f"and re-running from it meets the same loss: change the settings (e.g. a lower "
                f"--learning_rate, in a new workdir) or check the data")
        window.clock = time.perf_counter()
        window.last_loss = float(read["loss"][-1])
        window.last_acc = float(read["acc"][-1])
        scalars = {"loss": float(read["loss"].mean()), "acc": float(read["acc"].mean()),
                   "last_loss": window.last_loss,
                   "steps_per_s": len(read["loss"]) / max(elapsed, 1e-9)}
        tracking.scalars(phase.name, step, scalars)
        return scalars

    def save(done: Committed) -> None:
        nonlocal saved
        with stops.deferred():
            ckpt.save_latest(done.step, done.state.params, done.state.opt_state)
            saved = done.step

    def epoch_end(epoch: int, done: Committed, train_loss: float | None) -> None:
        val, keep = validate(epoch, done.state)
        with stops.deferred():  # a checkpoint is never cut short by a signal
            ckpt.save_best(epoch, keep, val["acc_mean"])
            history.append({"epoch": epoch, "val_acc": val["acc_mean"],
                            "val_ce": val["ce_mean"], "train_loss": train_loss})
            results.write_json(history_path, history)
        tracking.scalars("val", done.step, {"acc": val["acc_mean"], "ce": val["ce_mean"],
                                            "epoch": epoch})
        progress.say(f"[{phase.name}] epoch {epoch}: val acc {val['acc_mean']:.4f} "
                     f"ce {val['ce_mean']:.4f}")

    try:
        with stops.handled():
            pending = start // phase.iters_per_epoch - 1
            if start % phase.iters_per_epoch == 0 and pending >= 0 and not any(
                    h["epoch"] == pending for h in history):
                # stopped during this epoch's validation: validate the restored state
                epoch_end(pending, committed, tracking.recorded(phase.name, start, "last_loss"))
                bar = progress.tracker(phase.name, total, "steps", start=start,
                                       first_line=False)
            for step in range(start, total):
                epoch = step // phase.iters_per_epoch
                step_fn = step_for(epoch, committed.state)
                if not window.outs:  # steps/s counts training steps (not compiles, validation)
                    window.clock = time.perf_counter()
                with stops.deferred():
                    new_state, out = step_fn(committed.state, jax.random.fold_in(phase.key, step),
                                             jnp.float32(step / total))
                    committed = Committed(step + 1, new_state)
                    window.add(out)
                done = step + 1
                epoch_done = done % phase.iters_per_epoch == 0
                checkpoint = epoch_done or (phase.checkpoint_every
                                            and done % phase.checkpoint_every == 0)
                if checkpoint or done % phase.log_every == 0 or bar.due() or done == total:
                    read_window(done)
                    bar.update(done, force=done % phase.log_every == 0, epoch=epoch,
                               loss=window.last_loss, acc=window.last_acc)
                if checkpoint:
                    save(committed)
                if epoch_done:
                    epoch_end(epoch, committed, window.last_loss)
                    bar = progress.tracker(phase.name, total, "steps", start=done,
                                           first_line=False)
                if stop_after_steps is not None and done == stop_after_steps and done < total:
                    raise Interrupted(f"stopped after step {done} as asked")
    except (KeyboardInterrupt, SystemExit) as stop:
        stops.clear()
        if committed.step > saved and _alive(committed.state):
            read_window(committed.step)  # checked finite before it is checkpointed
            save(committed)
        where = (f"checkpointed at step {saved}" if saved else "nothing to checkpoint yet")
        cause = f" by {stops.name(stop.signum)}" if isinstance(stop, stops.StopRequested) else ""
        message = (f"interrupted{cause} at step {committed.step} of {total}; {where} in "
                   f"{workdir}: re-run the same command to resume")
        if isinstance(stop, SystemExit):
            print(message, file=sys.stderr, flush=True)
            raise
        status = stop.exit_status if isinstance(stop, stops.StopRequested) else 130
        raise Stopped(message, status) from None
    return committed.state


def resumed_from(start: int, workdir: str) -> str:
    """How the process began the phase, for the non-finite loss message."""
    if start:
        return f"; this process resumed from the checkpoint of step {start} in {workdir}"
    return f"; this process trained from step 0 (no checkpoint) in {workdir}"


def _alive(state: TrainState) -> bool:
    """Whether no buffer of ``state`` was donated to a step that did not return."""
    return not any(getattr(leaf, "is_deleted", lambda: False)() for leaf in jax.tree.leaves(state))


def run_steps(what: str, unit: str, steps: int, state: Any,
              step: Callable[[Any, jax.Array], tuple[Any, dict[str, jax.Array]]],
              key: jax.Array, log_every: int | None = None) -> Any:
    """The plain loop (no epochs, validation or checkpoints): ``state, metrics = step(state,
    fold_in(key, s))`` for ``s < steps``, with progress lines (the device's metrics are read
    only for a line) and, every ``log_every`` steps, an absl line of the metrics' mean since the
    last one (one host read each)."""
    window: list[dict[str, jax.Array]] = []
    started = time.perf_counter()
    bar = progress.tracker(what, steps, unit)
    for s in range(steps):
        state, out = step(state, jax.random.fold_in(key, s))
        if bar.due() or s + 1 == steps:
            bar.update(s + 1, **{name: float(value) for name, value in out.items()})
        if log_every:
            window.append(out)
            if (s + 1) % log_every == 0 or s + 1 == steps:
                means = {name: float(np.mean([v[name] for v in jax.device_get(window)]))
                         for name in out}
                logging.info("%s step %d/%d: %s (%.1f steps/s)", what, s + 1, steps,
                             " ".join(f"{name} {value:.4f}" for name, value in means.items()),
                             (s + 1) / (time.perf_counter() - started))
                window.clear()
    return state

