"""Stop signals at random moments: every stopped run, resumed, ends with the uninterrupted run's
test accuracy, CE and task fingerprint, bit for bit.

Real signals (``os.kill`` of this process from a thread) are sent at seeded random moments: a
random progress line of the phase (with ``log_every=1`` a line follows every step), then a
random delay within about a step, so that most land while the next step is in flight. One
chain of runs per training phase keeps this cheap: each stop is resumed by the next run of
the same config, and only the last run reaches the test.
"""

import os
import random
import signal
import threading
import time

import numpy as np
import pytest

from cfsl_jax.runtime import progress, stops
from cfsl_jax.training import loop, pretrain, train
from cfsl_jax.training.config import TrainConfig

SIGINT, SIGTERM, SIGUSR1, SIGUSR2 = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1,
                                     signal.SIGUSR2)

META = TrainConfig(
    learner="protonets", learner_options={"filters": 8}, dataset="synthetic",
    dataset_options={"num_classes": 60, "samples_per_class": 8}, task="B2",
    spec_overrides={"nc": 3, "kt": 2}, epochs=3, iters_per_epoch=4, meta_batch=2,
    val_tasks=6, test_tasks=7, eval_batch=4, keep_best=2, log_every=1)
PRETRAIN = TrainConfig(
    learner="pretrain_tune", learner_options={"filters": 8, "inner_steps": 1},
    dataset="synthetic", dataset_options={"num_classes": 40, "samples_per_class": 6,
                                          "image_size": 16},
    task="B2", spec_overrides={"nc": 2, "kt": 1}, epochs=3, iters_per_epoch=4, meta_batch=2,
    val_tasks=4, test_tasks=5, eval_batch=4, keep_best=2, log_every=1)
COMPARED = ("acc_mean", "acc_std", "ce_mean", "ce_std", "group_acc", "task_fingerprint")


class Signaller:
    """Sends ``signum`` to this process ``delay`` seconds after the ``nth`` progress line that
    starts with ``marker`` (``"val"``, ``"test"``: the ``nth`` evaluation of that purpose,
    as it starts), never after the run ended."""

    def __init__(self, monkeypatch, signum: int, marker: str, nth: int, delay: float):
        self.signum, self.marker, self.nth, self.delay = signum, marker, nth, delay
        self.seen, self.sent = 0, False
        self.ready, self.ended, self.lock = threading.Event(), threading.Event(), threading.Lock()
        say, evaluate = progress.say, train.evaluate

        def watching(line: str) -> None:
            say(line)
            self.saw(line.startswith(self.marker))

        def evaluating(*args, **kwargs):
            self.saw(kwargs.get("purpose") == self.marker)
            return evaluate(*args, **kwargs)

        monkeypatch.setattr(progress, "say", watching)
        for module in (train, pretrain):  # what validation and the test call
            monkeypatch.setattr(module, "evaluate", evaluating)
        self.thread = threading.Thread(target=self._fire, daemon=True)
        self.thread.start()

    def saw(self, match: bool) -> None:
        if match:
            self.seen += 1
            if self.seen == self.nth:
                self.ready.set()
                if self.marker in ("val", "test"):
                    self.thread.join()  # the signal lands in this evaluation

    def _fire(self) -> None:
        while not self.ready.wait(0.02):
            if self.ended.is_set():
                return
        time.sleep(self.delay)
        with self.lock:
            if not self.ended.is_set():
                os.kill(os.getpid(), self.signum)
                self.sent = True

    def end(self) -> None:
        with self.lock:
            self.ended.set()
        self.thread.join()


def run_until_stopped(monkeypatch, config, workdir, signum, marker, nth, delay):
    """One run of ``config`` in ``workdir`` with a signal at the given moment: the Stopped it
    raised, or None when the run ended first."""
    signaller = Signaller(monkeypatch, signum, marker, nth, delay)
    try:
        try:
            train.train_and_evaluate(config, workdir)
        finally:
            signaller.end()
    except (loop.Stopped, SystemExit) as stopped:
        return stopped
    except stops.StopRequested:  # sent as the run returned: it finished
        stops.clear()
    finally:
        monkeypatch.undo()
    assert not signaller.sent or os.path.exists(os.path.join(workdir, "results.json"))
    return None


def scheduler_exit(signum, frame):
    """A scheduler library's handler (as submitit's): requeue, then ``sys.exit``."""
    raise SystemExit(-1)


def check_chain(monkeypatch, capsys, tmp_path, config, moments, seed):
    """Stop ``config``'s run at each of ``moments`` ((signal, marker, max nth) in order), each
    at a seeded random line and delay, resuming after each; the final results must equal the
    uninterrupted run's. A negative signal: its number, handled by ``scheduler_exit``."""
    previous = {s: signal.getsignal(s) for s in stops.SIGNALS}
    signal.signal(SIGINT, signal.default_int_handler)  # as in a terminal (see conftest)
    rng = random.Random(seed)
    workdir = str(tmp_path / "stopped")
    stopped_at = []
    try:
        for signum, marker, lines in moments:
            foreign = signum < 0
            signum = abs(signum)
            default = signal.default_int_handler if signum == SIGINT else signal.SIG_DFL
            signal.signal(signum, scheduler_exit if foreign else default)
            for attempt in range(3):  # a moment after the phase ended: try an earlier one
                delay = 0.0 if marker in ("val", "test") else rng.uniform(0.0, 0.05)
                stop = run_until_stopped(monkeypatch, config, workdir, signum, marker,
                                         rng.randint(1, lines), delay)
                if stop is not None:
                    break
                lines = 1
            assert stop is not None, f"{stops.name(signum)} at {marker!r} never landed"
            signal.signal(signum, default)
            if foreign:
                assert isinstance(stop, SystemExit) and stop.code == -1
                message = capsys.readouterr().err.strip().splitlines()[-1]
                assert (" at step " in message and message.endswith("to resume")) or (
                    message.endswith("during the test; training is complete and checkpointed "
                                     f"in {workdir}: re-run the same command to test")), message
                stopped_at.append(message)
                continue
            message = str(stop)
            assert stop.exit_status == 128 + signum
            assert message.endswith(f"in {workdir}: re-run the same command to resume") or (
                "during the test" in message), message
            assert stops.name(signum) in message, message
            assert not os.path.exists(os.path.join(workdir, "results.json"))
            stopped_at.append(message)
        resumed = train.train_and_evaluate(config, workdir)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    full = train.train_and_evaluate(config, str(tmp_path / "full"))
    for name in COMPARED:
        assert resumed["test"][name] == full["test"][name], (name, stopped_at)
    assert resumed["task_fingerprint"] == full["task_fingerprint"]
    assert resumed["best_epochs"] == full["best_epochs"]
    return stopped_at


def test_stops_during_meta_training_validation_and_test_resume_exactly(monkeypatch, capsys,
                                                                        tmp_path):
    """SIGINT, SIGTERM, SIGUSR1 and SIGUSR2 at random steps of meta-training (4 steps an
    epoch), SIGUSR1 during validation, and SIGINT, SIGUSR1 and SIGTERM during the test."""
    stopped = check_chain(monkeypatch, capsys, tmp_path, META, [
        (SIGINT, "[train] ", 3), (SIGTERM, "[train] ", 3), (SIGUSR1, "val", 2),
        (SIGUSR2, "[train] ", 3), (SIGUSR1, "[train] ", 2), (SIGINT, "test", 1),
        (SIGUSR1, "test", 1), (SIGTERM, "test", 1)], seed=0)
    assert all("during the test" in line for line in stopped[-3:])
    assert not any("during the test" in line for line in stopped[:-3])


def test_stops_during_pretraining_on_tasks_resume_exactly(monkeypatch, capsys, tmp_path):
    """Pretrain+Tune's task pretraining (the default): SIGTERM and SIGINT at random steps, and
    a scheduler library's SIGUSR2 handler raising SystemExit, at a random step and in the
    test."""
    assert PRETRAIN.pretrain_data == "tasks"
    stopped = check_chain(monkeypatch, capsys, tmp_path, PRETRAIN, [
        (SIGTERM, "[pretrain] ", 4), (SIGINT, "[pretrain] ", 4), (-SIGUSR2, "[pretrain] ", 3),
        (-SIGUSR2, "test", 1)], seed=1)
    assert all(" at step " in line for line in stopped[:-1])
    assert "during the test" in stopped[-1]


def test_a_stop_inside_a_deferred_block_waits_for_its_end():
    previous = signal.getsignal(SIGUSR1)
    try:
        stops.install()
        done = []
        with pytest.raises(stops.StopRequested) as raised:
            with stops.deferred():
                os.kill(os.getpid(), SIGUSR1)
                time.sleep(0.01)  # the handler has run: only noted
                done.append(1)
        assert done == [1] and raised.value.signum == SIGUSR1
        assert raised.value.exit_status == 138
    finally:
        stops.clear()
        signal.signal(SIGUSR1, previous)


def test_a_scheduler_handler_inside_a_deferred_block_runs_at_its_end():
    """A foreign handler (as submitit's, raising SystemExit) never cuts a checkpoint short."""
    previous = signal.getsignal(SIGUSR2)
    try:
        signal.signal(SIGUSR2, scheduler_exit)
        done = []
        with pytest.raises(SystemExit):
            with stops.deferred():
                os.kill(os.getpid(), SIGUSR2)
                time.sleep(0.01)  # the signal arrived: held
                done.append(1)
        assert done == [1] and signal.getsignal(SIGUSR2) is scheduler_exit
    finally:
        signal.signal(SIGUSR2, previous)


def test_a_stop_outside_every_phase_says_how_to_resume(monkeypatch, tmp_path):
    """SIGTERM while the run is being built (before a phase holds state): one ``Stopped`` that
    names the signal, that no step is kept and how to start it, with the termination status;
    nothing is written."""
    workdir = str(tmp_path / "stopped")
    built = train.init_params

    def init_then_signal(*args, **kwargs):
        params = built(*args, **kwargs)
        os.kill(os.getpid(), SIGTERM)  # handled by the run: lands here, synchronously
        return params

    monkeypatch.setattr(train, "init_params", init_then_signal)
    stop = stopped_run(META, workdir, SIGTERM)
    assert stop.exit_status == 128 + SIGTERM
    assert stops.name(SIGTERM) in str(stop)
    assert str(stop).endswith(f"before its first checkpoint; no step is kept in {workdir}: "
                                    "re-run the same command to start it")
    assert not os.path.exists(os.path.join(workdir, "results.json"))


def test_a_second_press_while_the_stop_checkpoints_does_not_cut_it_short(monkeypatch,
                                                                         tmp_path):
    """Ctrl-C twice: the second press lands while the first one's checkpoint is written. It
    ended in 'interrupted ... between training steps' and lost the steps since the last
    checkpoint."""
    import dataclasses

    from cfsl_jax.training import checkpoints
    from test_train import TINY
    config = dataclasses.replace(TINY, epochs=1, iters_per_epoch=6, checkpoint_every=0)
    save = checkpoints.Checkpoints.save_latest
    pressed = []

    def pressed_again_while_saving(self, step, *args):
        pressed.append(step)
        os.kill(os.getpid(), SIGINT)  # handled by the run: lands here, synchronously
        return save(self, step, *args)

    def first_press(step_fn):
        def step(*args):
            if int(np.asarray(args[-1])[0] * 6) == 3:  # progress 3/6: the fourth step
                os.kill(os.getpid(), SIGINT)
            return step_fn(*args)
        return step

    original_run = loop.run

    def run(phase, state, step_for, *args, **kwargs):
        return original_run(phase, state, lambda e, s: first_press(step_for(e, s)), *args,
                            **kwargs)

    monkeypatch.setattr(loop, "run", run)
    monkeypatch.setattr(checkpoints.Checkpoints, "save_latest", pressed_again_while_saving)
    workdir = str(tmp_path / "run")
    stopped = stopped_run(config, workdir, SIGINT, signal.default_int_handler)  # a terminal's
    assert pressed == [4]
    assert str(stopped) == (f"interrupted by SIGINT at step 4 of 6; checkpointed at step 4 "
                                  f"in {workdir}: re-run the same command to resume")
    assert stopped.exit_status == 130
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints", "latest"))) == ["4"]


def test_a_stop_while_an_epoch_end_record_is_written_keeps_its_train_loss(monkeypatch,
                                                                          tmp_path):
    """SIGTERM as the metrics of the steps up to an epoch end are written (the window read off
    the device, its record not yet appended): the stop checkpoints that step and the resume
    validates it. The window was dropped before its record was written, so neither the record
    nor the on-stop read kept it: the resumed run's val_history.json had ``train_loss`` None
    where the uninterrupted run has the epoch's last loss."""
    import dataclasses
    import json

    from cfsl_jax.runtime import files
    from test_train import TINY
    config = dataclasses.replace(TINY, epochs=2, iters_per_epoch=2, log_every=50)
    append = files.append_text
    sent = []

    def signal_before_the_epoch_end_record(name, text):
        record = json.loads(text)
        if not sent and record.get("phase") == "train" and record.get("step") == 2:
            sent.append(record["step"])
            os.kill(os.getpid(), SIGTERM)  # handled by the run: lands here, synchronously
        return append(name, text)

    monkeypatch.setattr(files, "append_text", signal_before_the_epoch_end_record)
    workdir = str(tmp_path / "stopped")
    stopped = stopped_run(config, workdir, SIGTERM)
    monkeypatch.undo()
    assert sent == [2] and "at step 2 of 4" in str(stopped)
    resumed = train.train_and_evaluate(config, workdir)
    full = train.train_and_evaluate(config, str(tmp_path / "full"))
    assert resumed["test"]["acc_mean"] == full["test"]["acc_mean"]

    def history(folder):
        with open(os.path.join(folder, "val_history.json")) as f:
            return json.load(f)

    assert history(workdir) == history(str(tmp_path / "full"))
    assert history(workdir)[0]["train_loss"] is not None


def stopped_run(config, workdir: str, signum: int, handler=None) -> loop.Stopped:
    """The stop of ``train_and_evaluate(config, workdir)`` by ``signum`` (a test's monkeypatch
    sends it), with ``handler`` installed meanwhile; the signal's handler is restored."""
    previous = signal.getsignal(signum)
    if handler is not None:
        signal.signal(signum, handler)
    try:
        with pytest.raises(loop.Stopped) as stopped:
            train.train_and_evaluate(config, workdir)
    finally:
        signal.signal(signum, previous)
    return stopped.value
