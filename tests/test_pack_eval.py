"""A pack's validation and test as one program on tasks sampled once (``pack_eval``): each run's
records are its own (per task, as alone), each run keeps its own outputs, and a pack
stopped during its validation or its test resumes exactly; ``launch.verify`` confirms a packed run
bit for bit, re-testing it as its pack's program where its lone re-test rounds differently."""

import dataclasses
import os
import shutil
import signal

import jax
import pytest

from conftest import UNOPTIMISED, unoptimised_env
from cfsl_jax.experiments.verify import match_detail, verify
from cfsl_jax.runtime import stops
from cfsl_jax.training import loop, pack_eval, packing, results, runs, tracking
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.training.evaluate import evaluate

# conv=im2col in evaluation too (the default evaluates with gemm_grad): at the suite's -O0 its
# pack's test program and a lone one round apart, which launch.verify must answer (below)
CONFIG = TrainConfig(
    learner="protonets", learner_options={"filters": 8, "conv": "im2col"}, dataset="synthetic",
    dataset_options={"num_classes": 60, "samples_per_class": 8}, task="B2",
    spec_overrides={"nc": 3, "kt": 2}, epochs=2, iters_per_epoch=2, meta_batch=2,
    val_tasks=6, test_tasks=7, eval_batch=4, keep_best=2, log_every=2)
SEEDS = (0, 1)
COMPARED = ("acc_mean", "acc_std", "ce_mean", "ce_std", "group_acc", "task_fingerprint")


def counting(monkeypatch, signal_at=None):
    """``pack_eval.evaluate`` counted by purpose; with ``signal_at=(purpose, n)`` SIGTERM is
    sent to this process as the n-th evaluation of that purpose starts."""
    calls = []
    real = pack_eval.evaluate

    def evaluating(*args, **kwargs):
        calls.append(kwargs["purpose"])
        if signal_at == (kwargs["purpose"], calls.count(kwargs["purpose"])):
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)
    monkeypatch.setattr(pack_eval, "evaluate", evaluating)
    return calls


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """An uninterrupted pack of two seeds: (workdirs, results, evaluations by purpose); the
    evaluations' list also holds, in order, each run's metrics read and checkpoint saved as
    ``("read", workdir, step)`` and ``("save", workdir, step)``."""
    monkeypatch = pytest.MonkeyPatch()
    calls = counting(monkeypatch)
    for hook, method, event in ((loop.Metrics, "read", "read"), (loop.Checkpoint, "save", "save")):
        def logged(self, *args, real=getattr(hook, method), event=event):
            step = args[0] if event == "read" else args[0].step
            calls.append((event, self.outputs.workdir, step))
            return real(self, *args)
        monkeypatch.setattr(hook, method, logged)
    dirs = [str(tmp_path_factory.mktemp("pack") / f"seed{s}") for s in SEEDS]
    try:
        out = packing.train_pack(CONFIG, SEEDS, dirs)
    finally:
        monkeypatch.undo()
    return dirs, out, calls


def test_the_runs_of_a_pack_are_evaluated_as_each_alone_bit_for_bit():
    """``evaluate(runs=True)`` of two runs' params (and of three-member ensembles): each run's
    record equals its own evaluation alone, per task, bit for bit."""
    learner, splits = runs.build(CONFIG)
    members = [runs.init_params(learner, splits["train"], seed) for seed in (0, 1)]
    for ensemble in (False, True):
        # three members: their mean's order of additions matters (two add alike either way)
        params = ([pack_eval.stack([p, *(jax.tree.map(lambda x: f * x, p) for f in (1.01, 0.97)
                                         )]) for p in members] if ensemble else members)
        together = evaluate(learner, pack_eval.stack(params), splits["test"], num_tasks=7,
                            batch_size=4, ensemble=ensemble, per_task=True, runs=True,
                            cost_metrics=False)
        assert len(together) == 2
        for run_params, mine in zip(params, together):
            alone = evaluate(learner, run_params, splits["test"], num_tasks=7, batch_size=4,
                             ensemble=ensemble, per_task=True, cost_metrics=False)
            for name in (*COMPARED, "per_task"):
                assert mine[name] == alone[name], (ensemble, name)
        assert together[0]["ce_mean"] != together[1]["ce_mean"]


def test_a_pack_validates_and_tests_once_and_each_run_verifies(packed, tmp_path, capsys):
    """One validation per epoch and one test for the pack, not one per run; each run's own
    val_history.json and results.json. K copies of a run's params in the pack's program give its
    recorded test bit for bit, so launch.verify says MATCH for every run: from its lone re-test
    where that is bit-equal (XLA's default level), else, and saying so, from that re-test as its
    pack (the suite's -O0 with im2col: 1.650140643 recorded and re-tested as the pack against
    1.650140609 alone for the first run)."""
    dirs, out, calls = packed
    assert [c for c in calls if isinstance(c, str)] == ["val"] * CONFIG.epochs + ["test"]
    learner, splits = runs.build(CONFIG)
    checked = dict(num_tasks=CONFIG.test_tasks, seed=CONFIG.task_seed,
                   batch_size=CONFIG.eval_batch, ensemble=True, cost_metrics=False)
    differed = []
    for seed, workdir, run in zip(SEEDS, dirs, out):
        history = results.read_json(os.path.join(workdir, "val_history.json"))
        assert [h["epoch"] for h in history] == list(range(CONFIG.epochs))
        assert run["best_epochs"] and run["test"]["num_tasks"] == CONFIG.test_tasks
        assert run["test_in_pack"] is True and run["test"]["pack_runs"] == len(SEEDS)
        params = runs.restore_params(dataclasses.replace(CONFIG, seed=seed), learner, splits,
                                     workdir, ensemble=True)
        as_pack = evaluate(learner, pack_eval.stack([params] * len(SEEDS)), splits["test"],
                           runs=True, **checked)[0]
        assert {k: as_pack.to_json()[k] for k in COMPARED} == {k: run["test"][k] for k in COMPARED}
        # alone as verify re-tests it: the tasks run as the record says (in turn or one vmap;
        # on some CPUs the two differ in the last bits)
        alone = evaluate(learner, params, splits["test"], **checked,
                         per_task="per_task" in run["test"],
                         tasks_in_turn=run["test"].get("tasks_in_turn"))
        capsys.readouterr()
        assert verify(workdir) == []  # MATCH
        retested = "re-tested as its pack's test program (2 runs in one), it is bit-equal"
        rounds_apart = any(alone.to_json()[k] != run["test"][k] for k in COMPARED)
        assert (retested in capsys.readouterr().out) == rounds_apart
        differed.append(rounds_apart)
    # at -O0 (this XLA) the first run's lone re-test rounds apart: the answer above was tested
    assert differed[0] or not UNOPTIMISED
    assert "bit-equal (tolerance 0" in match_detail(metrics=True)
    assert out[0]["test"]["ce_mean"] != out[1]["test"]["ce_mean"]
    # a pack's test that the lone re-test does not reproduce bit for bit (im2col's may differ
    # by rounding) is DIFFERS, with a note saying whose test was recorded and by how much
    copy = str(tmp_path / "copy")
    shutil.copytree(dirs[0], copy)
    stored = results.read_json(os.path.join(copy, "results.json"))
    stored["test"]["ce_mean"] *= 1 + 3e-8
    results.write_json(os.path.join(copy, "results.json"), stored)
    differences = verify(copy)
    assert differences[0].startswith("ce_mean: recorded") and len(differences) == 2
    assert differences[1].startswith("note: the recorded test is its pack's")
    assert "the largest difference is 3.0e-08 relative" in differences[1]


def test_every_run_of_a_pack_is_read_and_checkpointed_before_the_pack_validates(packed):
    """At an epoch end each run's metrics are read (its progress line and recorded steps/s end
    with its training, not after the pack's validation) and its checkpoint saved, for every run,
    before the one validation of the pack, as ``loop.run`` orders them for a run alone."""
    dirs, _, calls = packed
    for epoch in range(CONFIG.epochs):
        end = (epoch + 1) * CONFIG.iters_per_epoch
        before = calls[:[i for i, c in enumerate(calls) if c == "val"][epoch]]
        for workdir in dirs:
            assert ("read", workdir, end) in before and ("save", workdir, end) in before
    saves = [c for c in calls if isinstance(c, tuple) and c[0] == "save"]
    assert len(saves) == len(dirs) * CONFIG.epochs  # one checkpoint per run and epoch end
    rows = [tracking.read(os.path.join(w, tracking.METRICS_FILE)) for w in dirs]
    for epoch in range(CONFIG.epochs):
        end = (epoch + 1) * CONFIG.iters_per_epoch
        trained, validated = ([r["time"] for run in rows for r in run
                               if (r["phase"], r["step"]) == (phase, end)]
                              for phase in ("train", "val"))
        assert len(trained) == len(validated) == len(dirs)
        assert max(trained) <= min(validated)  # every run's window logged before any val row


@pytest.mark.parametrize("moment", [("val", 2), ("test", 1)])
def test_a_pack_stopped_during_its_validation_or_test_resumes_exactly(
        packed, moment, monkeypatch, tmp_path):
    """SIGTERM as the pack's 2nd validation or its test starts: the command stops with the
    line saying how to resume; re-run, every run ends with the uninterrupted pack's numbers,
    validation history and best epochs, bit for bit."""
    dirs, out, _ = packed
    again = [str(tmp_path / f"seed{s}") for s in SEEDS]
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    counting(monkeypatch, signal_at=moment)
    try:
        with pytest.raises(loop.Stopped) as stopped:
            packing.train_pack(CONFIG, SEEDS, again)
    finally:
        stops.clear()
        signal.signal(signal.SIGTERM, previous)
    monkeypatch.undo()
    assert stopped.value.exit_status == 128 + signal.SIGTERM
    assert ("during the pack's test" if moment[0] == "test" else "at step") in str(stopped.value)
    assert not any(os.path.exists(os.path.join(w, "results.json")) for w in again)
    resumed = packing.train_pack(CONFIG, SEEDS, again)
    for first, second, a, b in zip(out, resumed, dirs, again):
        assert {k: first["test"][k] for k in COMPARED} == {k: second["test"][k] for k in COMPARED}
        assert first["best_epochs"] == second["best_epochs"]
        assert results.read_json(os.path.join(a, "val_history.json")) == results.read_json(
            os.path.join(b, "val_history.json"))
        if moment[0] == "test":  # resumed with its training done: no steps, no pack recorded
            assert second["packs"] == first["packs"]


def test_a_pack_with_a_run_left_to_test_alone_tests_the_others_together(packed, tmp_path):
    """Only runs whose training and validation are complete are tested together; a run
    already finished is not tested again."""
    dirs, _, _ = packed
    configs = [dataclasses.replace(CONFIG, seed=s) for s in SEEDS]
    assert all(not pack_eval.ready_to_test(c, w) for c, w in zip(configs, dirs))  # finished
    assert pack_eval.test_pack(CONFIG, configs, dirs) == {}


def test_pack_auto_shrinks_to_the_largest_pack_that_fits(monkeypatch, tmp_path, capsys):
    """A device that holds two runs (faked: 4 GiB a run, 10 GiB): --pack=auto's pack of three
    trains as a pack of two and the third run is left to train alone; an explicit pack of
    three is refused with the line naming --pack=2."""
    from types import SimpleNamespace
    from cfsl_jax.runtime import memory
    real = packing.check_pack_fits

    def fake(compiled, size, name):
        analysis = SimpleNamespace(temp_size_in_bytes=3 * size * memory.GIB,
                                   output_size_in_bytes=0, alias_size_in_bytes=0,
                                   argument_size_in_bytes=size * memory.GIB)
        real(SimpleNamespace(memory_analysis=lambda: analysis), size, name)
    monkeypatch.setattr(packing, "check_pack_fits", fake)
    monkeypatch.setattr(memory, "device_limit", lambda device: (10 * memory.GIB, True))
    config = dataclasses.replace(CONFIG, epochs=1)
    dirs = [str(tmp_path / f"seed{s}") for s in (0, 1, 2)]
    with pytest.raises(packing.PackTooLarge, match=r"--pack=3 is too many: at most --pack=2"):
        packing.meta_train_pack(config, (0, 1, 2), dirs)
    capsys.readouterr()
    packing.meta_train_pack(config, (0, 1, 2), dirs, shrink=True)
    out = capsys.readouterr().out
    assert ("--pack=auto: a pack of 3 protonets runs does not fit the device's memory" in out
            and "packs of 2 instead" in out), out
    assert "compiling a pack of 2 protonets" in out
    assert [pack_eval.ready_to_test(dataclasses.replace(config, seed=s), w)
            for s, w in zip((0, 1, 2), dirs)] == [True, True, False]


PRETRAIN_FLAGS = ["--learner=pretrain_tune", "--learner_option=filters=8",
                  "--learner_option=inner_steps=1", "--dataset=synthetic",
                  "--dataset_option=num_classes=40", "--dataset_option=samples_per_class=6",
                  "--dataset_option=image_size=16", "--task=B2", "--nc=2", "--kt=1",
                  "--epochs=2", "--iters_per_epoch=3", "--meta_batch=2", "--val_tasks=4",
                  "--test_tasks=5", "--eval_batch=4", "--keep_best=2", "--log_every=1",
                  "--checkpoint_every=1", "--seeds=0,1"]


def launch_pack(workdir: str, log=None):
    """``launch.train`` of the Pretrain+Tune pack of two seeds into ``workdir``, a subprocess
    at -O0 (all three commands at one level, so their numbers compare bit for bit; output
    merged, into the file ``log`` or piped)."""
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.Popen([sys.executable, "-m", "launch.train", f"--workdir={workdir}",
                             *PRETRAIN_FLAGS], cwd=repo, env=unoptimised_env(),
                            stdout=log or subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow  # three launch.train commands, two at once
def test_a_pretraining_pack_stopped_by_sigterm_resumes_exactly(tmp_path):
    """SIGTERM at a seeded random progress line of a Pretrain+Tune pack's pretraining (a real
    signal at the command's own timing): the command stops saying how to resume; re-run, both
    runs end with the uninterrupted pack's numbers, bit for bit."""
    import random
    import re
    rng = random.Random(4)
    stopped, full = str(tmp_path / "stopped"), str(tmp_path / "full")
    log = open(tmp_path / "full.log", "w")
    uninterrupted = launch_pack(full, log)
    process, lines, seen, nth = launch_pack(stopped), [], 0, rng.randint(1, 5)
    for line in process.stdout:
        lines.append(line)
        if re.match(r"\[pretrain\] [1-9]\d*/\d+ steps \(", line):
            seen += 1
            if seen == nth:
                process.send_signal(signal.SIGTERM)
    output = "".join(lines)
    assert process.wait() == 128 + signal.SIGTERM, output[-2000:]
    assert "interrupted by SIGTERM" in output and "re-run the same command to resume" in output
    assert not os.path.exists(os.path.join(stopped, "seed0", "results.json"))
    resumed = launch_pack(stopped)
    output = resumed.communicate()[0]
    assert resumed.returncode == 0, output[-2000:]
    assert "resuming a pack of 2 runs" in output, output[-2000:]
    assert uninterrupted.wait() == 0, (tmp_path / "full.log").read_text()[-2000:]
    log.close()
    for seed in SEEDS:
        mine, theirs = (results.read_json(os.path.join(w, f"seed{seed}", "results.json"))
                        for w in (stopped, full))
        assert {k: mine["test"][k] for k in COMPARED} == {k: theirs["test"][k] for k in COMPARED}
        assert mine["best_epochs"] == theirs["best_epochs"]
