"""Meta-training and evaluation end to end on small real configs: determinism, resume, NaN stop,
results/verify, the CLIs, and ProtoNets learning on mini-Omniglot."""

import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cfsl_jax import data
from cfsl_jax.protocol import episode, metrics
from cfsl_jax.runtime import backend, parallel
from cfsl_jax.runtime import checksums, json_files
from cfsl_jax.training import loop, runs, sessions, tracking, train
from cfsl_jax.training.config import TrainConfig, from_json
from cfsl_jax.training.evaluate import dataset_identity, evaluate, task_fingerprint
from cfsl_jax.learners import get_learner
from cfsl_jax.experiments.verify import verify
from conftest import traces_counted

# A tiny run: 2-support-set, 3-way tasks on a small synthetic set, a narrow ProtoNet.
TINY = TrainConfig(
    learner="protonets", learner_options={"filters": 8}, dataset="synthetic",
    dataset_options={"num_classes": 60, "samples_per_class": 8}, task="B2",
    spec_overrides={"nc": 3, "kt": 2}, epochs=2, iters_per_epoch=3, meta_batch=2,
    val_tasks=6, test_tasks=7, eval_batch=4, keep_best=2, log_every=2)


def test_train_step_compiles_once():
    learner, splits = runs.build(TINY)
    params = runs.init_params(learner, splits["train"], 0)
    optimizer = train.make_optimizer(TINY)
    step = train.make_train_step(learner, optimizer, TINY.meta_batch)
    opt_state = optimizer.init(params)
    params, opt_state, out = step(params, opt_state, splits["train"], jax.random.key(0),
                                  jnp.float32(0.0))
    with traces_counted() as traced:  # the same shapes again: no new program
        for i in range(1, 3):
            params, opt_state, out = step(params, opt_state, splits["train"],
                                          jax.random.key(i), jnp.float32(i / 3))
    assert traced == [0]
    assert np.isfinite(float(out["loss"]))


def test_a_second_run_of_the_same_settings_compiles_nothing_again():
    """Runs built separately from the same config share their learner and optimiser objects,
    so the training step, the evaluation program and the MACs' programs trace and compile once
    per process."""
    def one_run():
        learner, splits = runs.build(TINY)
        params = runs.init_params(learner, splits["train"], 0)
        optimizer = train.make_optimizer(TINY)
        mesh = parallel.make_mesh()
        split = parallel.place_split(splits["train"], mesh)
        opt_state = optimizer.init(params)
        train.compile_train_step(learner, optimizer, TINY, mesh, params, opt_state, split,
                                 jax.random.key(0))
        record = evaluate(learner, params, splits["val"], num_tasks=6, batch_size=4,
                          cost_metrics=False, mesh=mesh)
        return record, metrics.learner_macs(learner, params, splits["val"].images.shape[1:])

    first, macs = one_run()
    with traces_counted() as traced:
        second, macs_again = one_run()
    assert traced == [0]
    assert second.acc_mean == first.acc_mean and second.ce_mean == first.ce_mean
    assert macs_again == macs and macs["macs_per_task"] > 0
    other = dataclasses.replace(TINY, learner_options={"filters": 4})  # other settings: its own
    assert runs.build(other)[0] is not runs.build(TINY)[0]


def test_same_seed_same_results_and_resume_is_exact(tmp_path):
    full = train.train_and_evaluate(TINY, str(tmp_path / "full"))
    before = backend.compile_totals()
    again = train.train_and_evaluate(TINY, str(tmp_path / "again"))
    during = backend.compile_totals()["seconds"] - before["seconds"]
    assert full["test"] == {**again["test"], "seconds": full["test"]["seconds"],
                            "tasks_per_s": full["test"]["tasks_per_s"]}
    # Each run records its own compile seconds, not the process's since it started (as a sweep
    # worker's second run would): the second run's figure is at most what was compiled while
    # it ran, so it leaves out the first run's (counted, not timed against each other).
    assert full["compile_seconds"] > 0.01
    assert 0 < again["compile_seconds"] <= round(during, 3) + 0.001
    # Kill mid-epoch 1 (step 4 of 6, after a mid-epoch checkpoint at step 2), then resume.
    interrupted = TrainConfig(**{**TINY.to_json(), "checkpoint_every": 2})
    workdir = str(tmp_path / "resumed")
    sessions = [time.perf_counter()]
    with pytest.raises(loop.Interrupted):
        train.train_and_evaluate(interrupted, workdir, stop_after_steps=5)
    sessions.append(time.perf_counter())
    assert not os.path.exists(os.path.join(workdir, "results.json"))
    resumed = train.train_and_evaluate(interrupted, workdir)
    sessions.append(time.perf_counter())
    # wall_seconds counts both sessions (it counted the last one only)
    first, second = sessions[1] - sessions[0], sessions[2] - sessions[1]
    assert 0.95 * (first + second) <= resumed["wall_seconds"] <= first + second
    for name in ("acc_mean", "acc_std", "ce_mean", "ce_std", "group_acc", "task_fingerprint"):
        assert resumed["test"][name] == full["test"][name], name
    history = json.load(open(os.path.join(workdir, "val_history.json")))
    assert [h["epoch"] for h in history] == [0, 1]
    assert resumed["best_epochs"] == full["best_epochs"]


def test_results_record_reproducibility_facts_and_verify_matches(tmp_path):
    workdir = str(tmp_path / "run")
    out = train.train_and_evaluate(TINY, workdir)
    saved = json.load(open(os.path.join(workdir, "results.json")))
    for field in ("seed", "spec", "dataset", "splits", "package_version", "task_fingerprint"):
        assert field in saved
    assert saved["splits"]["train"] == {"classes": 44, "images": 44 * 8}
    assert saved["spec"]["nc"] == 3 and saved["spec"]["nss"] == 2
    test = saved["test"]
    for field in ("acc_mean", "acc_std", "acc_ci95", "ce_mean", "ce_std", "atm", "macs_adapt",
                  "macs_predict", "macs_per_task", "macs_per_meta_step"):
        assert np.isfinite(test[field]), field
    assert open(os.path.join(workdir, "results.csv")).readline().startswith("learner,dataset")
    assert verify(workdir) == []
    # A re-test keeps the training run's wall time and compile statistics.
    again = train.evaluate_run(workdir)
    assert again["test"]["acc_mean"] == test["acc_mean"]
    for field in ("wall_seconds", "compile_seconds", "compilation_cache_hits"):
        assert again[field] == saved[field], field
    assert again["test"]["retest_compile_seconds"] >= 0
    # results.csv: the run's row, then the re-test's, marked; the same re-test again adds none
    train.evaluate_run(workdir)
    rows = open(os.path.join(workdir, "results.csv")).read().splitlines()
    assert [row.split(",")[-1] for row in rows] == ["retest", "0", "1"]
    assert rows[2].split(",")[:-1] == rows[1].split(",")[:-1]
    # A results.json changed behind the run's back fails its checksum; one written with its
    # checksum that does not match its tasks is caught by the re-test.
    saved["task_fingerprint"] = "0" * 64
    saved["test"]["acc_mean"] = 0.0
    json.dump(saved, open(os.path.join(workdir, "results.json"), "w"))
    with pytest.raises(checksums.Corrupt, match="results.json fails its checksum"):
        verify(workdir)
    json_files.write_json(os.path.join(workdir, "results.json"), saved)
    differences = verify(workdir)
    assert len(differences) == 1 and differences[0].startswith("task_fingerprint")
    # The restored ensemble gives the recorded metrics again.
    learner, params, spec = runs.restore(workdir, ensemble=True)
    assert spec == TINY.spec and jax.tree.leaves(params)[0].shape[0] == len(out["best_epochs"])
    _, splits = runs.build(TINY)
    again = evaluate(learner, params, splits["test"], num_tasks=TINY.test_tasks,
                     seed=TINY.task_seed, purpose="test", batch_size=TINY.eval_batch,
                     ensemble=True, cost_metrics=False).to_json()
    for name in ("acc_mean", "ce_mean", "group_acc", "task_fingerprint"):
        assert again[name] == out["test"][name], name
    # Every run's scalars, as JSON lines: training at each log step, validation per epoch, test.
    records = tracking.read(os.path.join(workdir, tracking.METRICS_FILE))
    train_steps = [r["step"] for r in records if r["phase"] == "train"]
    # at least every log_every=2 steps and each epoch's end (3 steps); more when a line is due
    assert {2, 3, 4, 6} <= set(train_steps) and train_steps == sorted(set(train_steps))
    assert all(np.isfinite(r["loss"]) and r["steps_per_s"] > 0 for r in records
               if r["phase"] == "train")
    history = json.load(open(os.path.join(workdir, "val_history.json")))
    assert [(r["step"], r["acc"], r["ce"]) for r in records if r["phase"] == "val"] == [
        (3 * (h["epoch"] + 1), h["val_acc"], h["val_ce"]) for h in history]
    (test,) = [r for r in records if r["phase"] == "test"]
    assert test["acc_mean"] == out["test"]["acc_mean"]
    assert [test[f"group_acc_{g}"] for g in range(2)] == out["test"]["group_acc"]


def test_evaluation_tasks_are_a_function_of_the_seed():
    learner, splits = runs.build(TINY)
    spec = learner.spec
    first = task_fingerprint(splits["val"], spec, 20, seed=0, purpose="val")
    assert task_fingerprint(splits["val"], spec, 20, seed=0, purpose="val") == first
    assert task_fingerprint(splits["val"], spec, 20, seed=1, purpose="val") != first
    assert task_fingerprint(splits["val"], spec, 20, seed=0, purpose="eval") != first


def test_evaluation_tasks_do_not_depend_on_the_chunking_or_the_key_splitting_mode():
    """7 tasks in chunks of 3 pad to 9: the 7 are split(key, 7)'s, also where a longer split
    does not share its prefix (``jax_threefry_partitionable=False``, JAX's default before 0.5)."""
    learner, splits = runs.build(TINY)
    params = runs.init_params(learner, splits["val"], 0)
    for partitionable in (True, False):
        with jax.threefry_partitionable(partitionable):
            expected = task_fingerprint(splits["val"], learner.spec, 7, seed=0, purpose="val")
            for batch_size in (3, 7):
                record = evaluate(learner, params, splits["val"], num_tasks=7, seed=0,
                                  purpose="val", batch_size=batch_size, cost_metrics=False)
                assert record.task_fingerprint == expected, (partitionable, batch_size)


def test_the_task_fingerprint_does_not_depend_on_how_the_source_is_worded():
    split = data.load_split("synthetic", "test", num_classes=60, samples_per_class=8)
    reworded = split.replace(info=dataclasses.replace(split.info, source="made elsewhere"))
    assert split.info.variant == split.info.source.split(" prepared in ")[0]
    assert dataset_identity(reworded) == dataset_identity(split)
    assert task_fingerprint(reworded, TINY.spec, 5, 0) == task_fingerprint(split, TINY.spec, 5, 0)


def test_nan_loss_stops_with_epoch_and_step_and_keeps_last_checkpoint(tmp_path, monkeypatch):
    def exploding(name, spec, **options):
        learner = get_learner(name, spec, **options)

        def meta_loss(params, sx, sy, tx, ty, key, progress):
            loss, logits = episode.target_loss(learner, params, sx, sy, tx, ty, key)
            return jnp.where(progress >= 0.5, jnp.nan, loss), logits

        return learner._replace(recipe=learner.recipe._replace(meta_loss=meta_loss))

    monkeypatch.setattr(runs, "get_learner", exploding)  # what runs.build calls
    workdir = str(tmp_path / "nan")
    with pytest.raises(FloatingPointError, match=r"loss is nan at epoch 1, step 3 .* newest "
                                                 r"checkpoint, step 3, is the state before it"):
        train.train_and_evaluate(TINY, workdir)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints", "latest"))) == ["3"]


def test_a_config_saved_before_pretrain_data_reads_as_uniform_everywhere(tmp_path):
    """One legacy default: resuming, comparing (a sweep's status) and reporting read it alike."""
    saved = {k: v for k, v in TINY.to_json().items() if k != "pretrain_data"}
    assert TINY.pretrain_data == "tasks" and from_json(saved).pretrain_data == "uniform"
    assert runs.config_differences(saved, TINY) == ["pretrain_data"]
    assert runs.config_differences(saved, dataclasses.replace(TINY, pretrain_data="uniform")) == []
    workdir = tmp_path / "old"
    workdir.mkdir()
    (workdir / "config.json").write_text(json.dumps(saved))
    assert runs.load_config(str(workdir)).pretrain_data == "uniform"
    with pytest.raises(ValueError, match=r"different config \(fields: pretrain_data\)"):
        runs.check_workdir_config(str(workdir), TINY)


def test_changed_config_in_an_old_workdir_is_refused(tmp_path):
    workdir = str(tmp_path / "run")
    runs.check_workdir_config(workdir, TINY)
    changed = TrainConfig(**{**TINY.to_json(), "seed": 1})
    with pytest.raises(ValueError, match=r"different config \(fields: seed\)"):
        runs.check_workdir_config(workdir, changed)


@pytest.mark.slow
def test_protonets_learns_b3_on_mini_omniglot(omniglot_dir, data_dir, tmp_path, monkeypatch,
                                              optimised_training_step):
    """A short ProtoNets meta-training beats chance (1/15) widely, and beats init_tune (0.18).

    30 test tasks (60 before; measured at 30: protonets 0.546, init_tune 0.181; at 60: 0.559,
    0.172; the mean's standard error at 30 is 0.013; measured again on omniglot/small_nearest
    with this setting: 0.444, 0.085). The MACs (of a meta-step, of adaptation
    and prediction), which the test counts with extra compilations, are tested elsewhere
    (tests/test_metrics.py, tests/test_maml.py). Both epochs are the best 2 (``keep_best=2``)
    whatever validation says, so 4 validation tasks (20 before) give the same test numbers."""
    monkeypatch.setattr(train, "per_task_meta_step_macs", lambda *args: 0.0)
    monkeypatch.setattr(metrics, "learner_macs", lambda *args: dict.fromkeys(
        ("macs_adapt", "macs_predict", "macs_per_task"), 0.0))
    config = TrainConfig(
        learner="protonets", learner_options={"filters": 16}, dataset="omniglot",
        manual_dir=omniglot_dir, data_dir=data_dir,
        task="B3", epochs=2, iters_per_epoch=15, meta_batch=4, val_tasks=4, test_tasks=30,
        eval_batch=20, keep_best=2, learning_rate=1e-2)
    mesh = parallel.make_mesh(4, devices=jax.devices("cpu"))  # 4 of the 8 CPU devices: no padding
    # ProtoNets' 30 meta-steps compile at XLA's default level (their run time dominates:
    # measured 10 s instead of 95 s, for 28 s more compiling); everything else, Init+Tune's
    # fine-tuning included, at the suite's -O0 (its test program compiled in 14 s instead of 44 s).
    protonets = train.train_and_evaluate(config, str(tmp_path / "pn"), mesh=mesh)["test"]
    tune = dataclasses.replace(config, learner="init_tune")  # its given options (filters)
    init_tune = train.train_and_evaluate(tune, str(tmp_path / "it"), mesh=mesh)["test"]
    print(f"B3 mini-Omniglot: protonets {protonets['acc_mean']:.3f}, "
          f"init_tune {init_tune['acc_mean']:.3f}")
    assert protonets["acc_mean"] > 5 / 15  # five times chance (measured: 0.546)
    assert protonets["acc_mean"] > init_tune["acc_mean"] + 0.1


def test_sessions_add_up_in_their_own_runs_workdir_only(tmp_path):
    workdir = str(tmp_path / "run")
    runs.check_workdir_config(workdir, TINY)
    other = dataclasses.replace(TINY, seed=TINY.seed + 1)
    sessions.record(workdir, other, sessions.earlier(workdir), 5.0)  # refused there
    assert sessions.earlier(workdir) == {"seconds": 0.0, "sessions": 0}
    for seconds in (5.0, 2.5):
        sessions.record(workdir, TINY, sessions.earlier(workdir), seconds)
    assert sessions.earlier(workdir) == {"seconds": 7.5, "sessions": 2}
    sessions.record(str(tmp_path / "refused"), TINY, sessions.earlier(workdir), 1.0)
    assert not os.path.exists(tmp_path / "refused")
    # an open session is recorded at each checkpoint, replacing its own earlier record
    with sessions.opened([(TINY, workdir)]) as earlier:
        assert earlier == {workdir: {"seconds": 7.5, "sessions": 2}}
        for _ in range(2):
            time.sleep(0.05)
            sessions.checkpointed(workdir)
            assert sessions.earlier(workdir)["sessions"] == 3
        assert sessions.earlier(workdir)["seconds"] >= 7.6
    assert sessions.earlier(workdir)["sessions"] == 3
    sessions.checkpointed(workdir)  # no session open: nothing
    assert sessions.earlier(workdir)["sessions"] == 3


KILL_AFTER_CHECKPOINTS = """
import os, signal, sys
from cfsl_jax.training import sessions, train
from cfsl_jax.training.config import TrainConfig
record, saved = sessions.checkpointed, []
def checkpointed(workdir):  # SIGKILL right after the third checkpoint was written
    record(workdir)
    saved.append(workdir)
    if len(saved) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
sessions.checkpointed = checkpointed
train.train_and_evaluate(TrainConfig(**{config}), sys.argv[1])
"""


@pytest.mark.slow  # a launch of its own
def test_a_killed_session_keeps_its_time_up_to_its_last_checkpoint(tmp_path):
    """A real SIGKILL (the process kills itself after its third checkpoint): no cleanup runs,
    yet sessions.json counts the killed session, and the resumed run's wall_seconds adds it."""
    import subprocess
    import sys
    from conftest import unoptimised_env
    config = dataclasses.replace(TINY, checkpoint_every=1)
    workdir = str(tmp_path / "killed")
    code = KILL_AFTER_CHECKPOINTS.replace("{config}", repr(config.to_json()))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, workdir], capture_output=True, text=True,
                          env=unoptimised_env(CFSL_PROGRESS="0"),
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    killed_for = time.perf_counter() - started
    assert done.returncode == -9, done.stderr[-2000:]
    assert not os.path.exists(os.path.join(workdir, "results.json"))
    killed = sessions.earlier(workdir)
    assert killed["sessions"] == 1 and 0 < killed["seconds"] < killed_for
    resumed_at = time.perf_counter()
    result = train.train_and_evaluate(config, workdir)
    this_session = time.perf_counter() - resumed_at
    assert killed["seconds"] < result["wall_seconds"] <= killed["seconds"] + this_session
    assert sessions.earlier(workdir)["sessions"] == 2


def test_a_stop_as_results_json_lands_leaves_its_csv_row(monkeypatch, tmp_path):
    """SIGTERM just after results.json is written: the run is done, and its results.csv row
    is written with it (the stop waits for it); a results.csv lost anyway (SIGKILL between the
    two writes) is written again by the next command, which finds the finished run. Before,
    the row was never written: the stop landed between the writes and every later command
    printed the stored results and returned."""
    import csv
    import os
    import signal

    from cfsl_jax.runtime import files, stops
    config = dataclasses.replace(TINY, epochs=1, iters_per_epoch=2)
    workdir = str(tmp_path / "run")
    write = files.write_atomic

    def signal_after_results(name, data):
        write(name, data)
        if files.basename(name) == "results.json":
            os.kill(os.getpid(), signal.SIGTERM)  # handled by the run: lands here

    monkeypatch.setattr(files, "write_atomic", signal_after_results)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(stops.StopRequested):
            train.train_and_evaluate(config, workdir)
    finally:
        signal.signal(signal.SIGTERM, previous)
        stops.clear()
    monkeypatch.undo()
    csv_path = os.path.join(workdir, "results.csv")

    def rows():
        with open(csv_path) as f:
            return list(csv.DictReader(f))

    stored = json.load(open(os.path.join(workdir, "results.json")))
    assert [float(r["acc_mean"]) for r in rows()] == [stored["test"]["acc_mean"]]
    os.remove(csv_path)  # as a SIGKILL between the two writes leaves it
    again = train.train_and_evaluate(config, workdir)
    assert [float(r["acc_mean"]) for r in rows()] == [again["test"]["acc_mean"]]
    assert [r["retest"] for r in rows()] == ["0"]


def test_a_resume_at_another_matmul_precision_is_refused(tmp_path):
    """A run stopped part-way, resumed with another --precision: refused naming both (it was
    taken, mixing the two precisions in one run, and results.json recorded only the last);
    resumed at its own precision it ends as the uninterrupted run."""
    from cfsl_jax.runtime import backend
    from cfsl_jax.runtime.errors import UserError
    config = dataclasses.replace(TINY, epochs=2, iters_per_epoch=2)
    workdir = str(tmp_path / "run")
    with pytest.raises(loop.Interrupted):
        train.train_and_evaluate(config, workdir, stop_after_steps=2)
    trained = backend.precision()  # the tests' (conftest)
    other = "default" if trained != "default" else "highest"
    backend.set_precision(other)
    try:
        with pytest.raises(UserError, match=f"--precision={trained}.*--precision={other}"):
            train.train_and_evaluate(config, workdir)
    finally:
        backend.set_precision(trained)
    resumed = train.train_and_evaluate(config, workdir)
    assert resumed["matmul_precision"] == trained
    full = train.train_and_evaluate(config, str(tmp_path / "full"))
    assert resumed["test"]["acc_mean"] == full["test"]["acc_mean"]
