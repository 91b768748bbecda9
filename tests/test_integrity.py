"""Nothing silently wrong (issue 30): damaged files, concurrent commands, full disks, orphaned
workers, early stops and redone steps each end in one line, or in the uninterrupted numbers.

One uninterrupted run (``reference``) gives the numbers every damaged-then-resumed run must
end with, bit for bit; runs are stopped with ``stop_after_steps`` (no checkpoint of the last
steps: what a SIGKILL leaves).
"""

import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from cfsl_jax.experiments import sweep, verify
from cfsl_jax.protocol import episode
from cfsl_jax.runtime import checksums, disk, locks
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training import evaluate as evaluation
from cfsl_jax.training import loop, results, runs, train, tracking
from cfsl_jax.training.config import TrainConfig
from conftest import unoptimised_env
from launch_inprocess import command_module, run_in_process

CONFIG = TrainConfig(
    learner="protonets", learner_options={"filters": 8}, dataset="synthetic",
    dataset_options={"num_classes": 60, "samples_per_class": 8}, task="B2",
    spec_overrides={"nc": 3, "kt": 2}, epochs=2, iters_per_epoch=6, meta_batch=2,
    val_tasks=6, test_tasks=7, eval_batch=4, keep_best=2, log_every=1, checkpoint_every=2)
COMPARED = ("acc_mean", "acc_std", "ce_mean", "ce_std", "task_fingerprint")


def numbers(result: dict) -> dict:
    return {k: result["test"].get(k, result.get(k)) for k in COMPARED}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """(the uninterrupted run's test numbers, its workdir)."""
    workdir = str(tmp_path_factory.mktemp("ref") / "w")
    return numbers(train.train_and_evaluate(CONFIG, workdir)), workdir


@pytest.fixture(scope="module")
def reference(finished):
    return finished[0]


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """The run stopped after step 9 (step 9 not checkpointed: what a SIGKILL leaves); latest
    holds steps 6 and 8, best epoch 0, metrics.jsonl records up to step 9."""
    workdir = str(tmp_path_factory.mktemp("stopped") / "w")
    with pytest.raises(loop.Interrupted):
        train.train_and_evaluate(CONFIG, workdir, stop_after_steps=9)
    return workdir


def stopped(stopped_run, workdir) -> str:
    """A copy of the stopped run in ``workdir``."""
    return shutil.copytree(stopped_run, workdir).as_posix()


def data_file(checkpoint: str) -> str:
    """The largest array data file of an orbax checkpoint folder."""
    found = [os.path.join(root, name) for root, _, names in os.walk(checkpoint)
             for name in names if os.sep + "d" + os.sep in os.path.join(root, name) + os.sep]
    return max(found, key=os.path.getsize)


def test_a_flipped_bit_in_the_newest_checkpoint_falls_back_to_the_one_before(
        tmp_path, capsys, reference, stopped_run):
    """... and the metrics records of the steps done again are not kept twice."""
    workdir = stopped(stopped_run, tmp_path / "w")
    metrics = os.path.join(workdir, tracking.METRICS_FILE)
    assert max(r["step"] for r in tracking.read(metrics) if r["phase"] == "train") == 9
    latest = os.path.join(workdir, "checkpoints", "latest")
    assert sorted(os.listdir(latest), key=int) == ["6", "8"]
    path = data_file(os.path.join(latest, "8"))
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x40
    open(path, "wb").write(bytes(data))
    out = numbers(train.train_and_evaluate(CONFIG, workdir))
    said = capsys.readouterr().out
    assert f"{path} fails its checksum" in said and "falling back to the checkpoint of step 6" \
        in said and "resuming from step 6" in said
    assert out == reference
    steps = [r["step"] for r in tracking.read(metrics) if r["phase"] == "train"]
    assert steps == list(range(1, 13))
    assert [r["step"] for r in tracking.read(metrics) if r["phase"] == "val"] == [6, 12]


def copied(finished, tmp_path) -> str:
    """A copy of the finished run's workdir."""
    return shutil.copytree(finished[1], tmp_path / "w").as_posix()


def test_damaged_best_checkpoints_are_trained_again_never_ensembled(tmp_path, capsys,
                                                                    finished):
    """The test (killed before, so its results.json missing) meets epoch 0's checkpoint garbled
    (64 random bytes) and epoch 1's truncated: both are trained again, bit for bit."""
    workdir = copied(finished, tmp_path)
    os.remove(os.path.join(workdir, "results.json"))
    garbled = data_file(os.path.join(workdir, "checkpoints", "best", "0"))
    data = open(garbled, "rb").read()
    open(garbled, "wb").write(data[:64] + os.urandom(64) + data[128:])
    truncated = data_file(os.path.join(workdir, "checkpoints", "best", "1"))
    data = open(truncated, "rb").read()
    open(truncated, "wb").write(data[:len(data) // 2])
    out = numbers(train.train_and_evaluate(CONFIG, workdir))
    said = capsys.readouterr().out
    assert f"{garbled} fails its checksum" in said and "re-creating best epoch(s) [0, 1]" in said
    assert "resuming from step" not in said  # from step 0: latest holds steps 10 and 12 only
    assert out == finished[0]  # the epochs re-created bit for bit, in the ensemble


def test_a_missing_best_epoch_is_trained_again_never_left_out_of_the_ensemble(
        tmp_path, capsys, finished):
    """best/1 deleted (an incomplete copy): a re-test and verify refuse the run; its training
    command (results.json removed) re-creates the epoch, bit for bit, before testing."""
    workdir = copied(finished, tmp_path)
    shutil.rmtree(os.path.join(workdir, "checkpoints", "best", "1"))
    missing = "the best-epoch checkpoint of epoch 1 is missing from"
    with pytest.raises(UserError, match=missing):
        runs.evaluate_run(workdir)
    (difference,) = verify.verify(workdir)
    assert difference.startswith(f"training: {missing}"), difference
    os.remove(os.path.join(workdir, "results.json"))
    out = numbers(train.train_and_evaluate(CONFIG, workdir))
    assert "re-creating best epoch(s) [1]" in capsys.readouterr().out
    assert out == finished[0]
    assert verify.verify(workdir) == []


def test_a_run_stopped_part_way_is_never_re_tested_or_verified_as_finished(
        tmp_path, stopped_run, finished):
    """After epoch 0 of 2 a re-test (launch.evaluate) would test epoch 0 as the run; and a
    finished run's results.json copied beside it does not verify: refused as unchecked (its
    folder's manifest records no checksum for it), and, written before checksums (no claim),
    by the training check."""
    workdir = stopped(stopped_run, tmp_path / "w")
    with pytest.raises(UserError, match=f"the run in {workdir} has validated 1 of its 2 epochs: "
                                        f"delete its results.json \\(if any\\) and finish its "
                                        f"training first"):
        runs.evaluate_run(workdir)
    assert not os.path.exists(os.path.join(workdir, "results.json"))
    shutil.copy(os.path.join(finished[1], "results.json"), workdir)
    with pytest.raises(checksums.Corrupt, match="records none for it"):
        verify.verify(workdir)
    with open(os.path.join(finished[1], "results.json")) as f:
        legacy = {k: v for k, v in json.load(f).items() if k != checksums.CLAIM}
    with open(os.path.join(workdir, "results.json"), "w") as f:
        json.dump(legacy, f)
    (difference,) = verify.verify(workdir)
    assert difference.startswith("training: the run in") and "validated 1 of its 2" in difference


def test_two_replacements_cut_short_are_no_false_alarm(tmp_path, monkeypatch):
    """Each write of val_history.json killed between its manifest entry and its rename (the
    file stays the first): the file still checks, a damaged one still does not, and the next
    write lands."""
    from cfsl_jax.runtime import files
    path = str(tmp_path / "val_history.json")
    checksums.write_text(path, "[1]")
    atomic = files.write_atomic

    def cut_short(name, text):
        if name == path:
            raise OSError("killed before the rename")
        atomic(name, text)

    monkeypatch.setattr(files, "write_atomic", cut_short)
    for text in ("[1, 2]", "[1, 2, 3]"):
        with pytest.raises(OSError):
            checksums.write_text(path, text)
    monkeypatch.setattr(files, "write_atomic", atomic)
    checksums.read_checked(path)  # the file there: no alarm
    with pytest.raises(checksums.Corrupt, match="fails its checksum"):
        checksums.check_text(path, "[9]")
    checksums.write_text(path, "[1, 2]")
    assert checksums.read_checked(path) == "[1, 2]"


def test_a_damaged_file_is_refused_by_verify_and_train_naming_it(tmp_path, capsys, finished):
    workdir = copied(finished, tmp_path)
    assert verify.check_files(workdir) == [
        "config.json", "val_history.json", "results.json", "sessions.json", "metrics.jsonl",
        "checkpoints/latest/10", "checkpoints/latest/12", "checkpoints/best/0",
        "checkpoints/best/1"]
    assert "[verify] checksums of 9 files and checkpoints match" in capsys.readouterr().out
    path = data_file(os.path.join(workdir, "checkpoints", "best", "1"))
    open(path, "r+b").write(b"\0" * 8)
    with pytest.raises(checksums.Corrupt, match=f"{path} fails its checksum .*delete the run's "
                                                f"results.json .* re-creates that epoch"):
        verify.verify(workdir)
    results = os.path.join(workdir, "results.json")
    text = open(results).read()
    open(results, "w").write(text.replace('"acc_mean": 0.', '"acc_mean": 1.'))
    with pytest.raises(UserError, match=f"{results} fails its checksum.*delete it and run"):
        train.train_and_evaluate(CONFIG, workdir)


def test_a_workdir_written_before_checksums_still_verifies(tmp_path, capsys, finished):
    """A workdir written before checksums (no checksums.json, no seals, a results.json that does
    not say it was checksummed) is read unchecked and verifies; one whose results.json says so
    and whose checksums.json is gone is refused, naming both (a hand edit behind a deleted
    manifest would otherwise be read, and reported, unchecked)."""
    workdir = copied(finished, tmp_path)
    os.remove(os.path.join(workdir, checksums.MANIFEST))
    for root, _, names in os.walk(workdir):
        if checksums.SEAL in names:
            os.remove(os.path.join(root, checksums.SEAL))
    path = os.path.join(workdir, "results.json")
    with pytest.raises(checksums.Corrupt, match=re.escape(
            f"{path} was written with its folder's checksums, but {workdir} has no "
            f"checksums.json (deleted or lost): its numbers cannot be checked; restore")):
        verify.verify(workdir)
    with open(path) as f:
        recorded = json.load(f)
    del recorded[checksums.CLAIM]  # as results.json was written before checksums
    with open(path, "w") as f:
        json.dump(recorded, f)
    assert verify.verify(workdir) == []
    said = capsys.readouterr().out
    assert said.count(f"note: {workdir} was written before checksums") == 1
    assert "[verify] checksums" not in said


def test_a_run_from_before_tasks_ran_in_turn_is_re_tested_as_it_ran(
        tmp_path, monkeypatch, finished):
    """ProtoNets ran a CPU batch of tasks as one vmap before 2026-11-28 (now one at a time): a
    config.json saved then (no ``tasks_on_cpu``) reads back as ``vmap``, so verify re-tests its
    record (no ``tasks_in_turn``) as one vmap and MATCHes (its training, resumed, reads the
    same rule: ``episode.sequential(mesh, learner)``)."""
    real, asked = evaluation.evaluate, []
    monkeypatch.setattr(evaluation, "evaluate", lambda learner, *a, **k: asked.append(
        (learner.recipe.vmap_on_cpu, k.get("tasks_in_turn"))) or real(learner, *a, **k))
    workdir = copied(finished, tmp_path)
    in_turn = episode.sequential()  # on CPU (on an accelerator a vmap either way)
    assert verify.verify(workdir) == [] and asked == [(False, in_turn)]
    recorded = results.read_json(os.path.join(workdir, "results.json"))
    assert recorded["test"]["tasks_in_turn"] is in_turn
    old = dataclasses.replace(CONFIG, learner_options={**CONFIG.learner_options,
                                                       "tasks_on_cpu": "vmap"})
    learner, splits = runs.build(old)
    params = runs.restore_params(old, learner, splits, workdir, ensemble=True)
    vmapped = real(learner, params, splits["test"], num_tasks=CONFIG.test_tasks,
                   seed=CONFIG.task_seed, batch_size=CONFIG.eval_batch, ensemble=True,
                   cost_metrics=False, per_task=True)
    assert vmapped.tasks_in_turn is False and not episode.sequential(learner=learner)
    del recorded["test"]["tasks_in_turn"]
    # every number verify checks as vmapped (on some CPUs a task's accuracy and CE differ
    # between the two ways in the last bits; the record must be the vmap's)
    recorded["test"].update({k: vmapped[k] for k in verify.CHECKED_METRICS
                             + verify.CHECKED_LISTS if k in recorded["test"]})
    saved = results.read_json(os.path.join(workdir, "config.json"))
    for entry in (saved, recorded["config"]):
        del entry["learner_options"]["tasks_on_cpu"]
    results.write_json(os.path.join(workdir, "results.json"), recorded)
    results.write_json(os.path.join(workdir, "config.json"), saved)
    assert runs.load_config(workdir).learner_options["tasks_on_cpu"] == "vmap"
    assert verify.verify(workdir) == [] and asked[1:] == [(True, None)]


def test_a_nan_names_its_step_and_the_checkpoint_it_resumed_from(tmp_path, monkeypatch,
                                                                 stopped_run):
    workdir = stopped(stopped_run, tmp_path / "w")
    real = loop.run

    def exploding(phase, state, step_for, *args, **kwargs):
        def nan_after_8(epoch, state):
            step = step_for(epoch, state)

            def run(state, key, progress):
                new, out = step(state, key, progress)
                return new, {**out, "loss": out["loss"] * float("nan")}
            return run
        return real(phase, state, nan_after_8, *args, **kwargs)

    monkeypatch.setattr(loop, "run", exploding)
    with pytest.raises(UserError) as error:
        train.train_and_evaluate(CONFIG, workdir)
    message = str(error.value)
    assert isinstance(error.value, FloatingPointError) and "good" not in message
    assert message.startswith("meta-training loss is nan at epoch 1, step 8 ")
    assert f"resumed from the checkpoint of step 8 in {workdir}" in message


def holder(lock: str) -> subprocess.Popen:
    """Another process holding ``lock`` until killed."""
    code = ("import sys, time; from cfsl_jax.runtime import locks\n"
            f"with locks.held({lock!r}, 'x'):\n    print('held', flush=True); time.sleep(600)")
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_second_trainer_on_a_workdir_is_refused_naming_the_holder(tmp_path, capsys):
    workdir = str(tmp_path / "w")
    os.makedirs(workdir)
    other = holder(locks.path_in(workdir))
    try:
        busy = (f"workdir {workdir} is in use by host {socket.gethostname()} pid {other.pid} "
                f"since ")
        with pytest.raises(locks.Busy, match=re.escape(busy)):
            train.train_and_evaluate(CONFIG, workdir)
        with command_module("train") as module:  # the command: one line, status 2
            code, _, err = run_in_process(module, "train", [
                "--dataset=synthetic", f"--workdir={workdir}", "--task=B2"])
        assert code == 2 and err.startswith(f"error: {busy}") and len(err.splitlines()) == 1
        assert os.listdir(workdir) == [".lock"]  # nothing written, nothing removed
    finally:
        other.kill()
        other.wait()
    # the holder was SIGKILLed: its lock is stale, taken over with a line
    assert locks.acquire(locks.path_in(workdir), "w")["pid"] == os.getpid()
    assert f"taking over the stale lock of w (held by host {socket.gethostname()} pid " \
           f"{other.pid}" in capsys.readouterr().out
    # another host's lock: live while refreshed, stale after STALE_AFTER_S
    lock = locks.path_in(str(tmp_path / "elsewhere"))
    os.makedirs(os.path.dirname(lock))
    open(lock, "w").write(json.dumps({"host": "node-b", "pid": 1, "since": 0, "token": "t"}))
    with pytest.raises(locks.Busy, match="in use by host node-b pid 1"):
        locks.acquire(lock, "w")
    os.utime(lock, (time.time() - locks.STALE_AFTER_S - 5,) * 2)
    assert locks.acquire(lock, "w")["host"] == socket.gethostname()


def test_a_lock_taken_over_meanwhile_by_another_process_is_not_removed(tmp_path, monkeypatch):
    """A judges node-b's lock stale; before A moves it aside, B takes it over (its own lock
    now). A's move catches B's live lock: it is put back, and A is refused."""
    lock = locks.path_in(str(tmp_path / "w"))
    os.makedirs(os.path.dirname(lock))
    open(lock, "w").write(json.dumps({"host": "node-b", "pid": 1, "since": 0, "token": "t"}))
    os.utime(lock, (time.time() - locks.STALE_AFTER_S - 5,) * 2)
    take_over, taken = locks._take_over, []

    def b_first(path, judged):
        if not taken:  # B: judged the same stale lock, moved it aside and created its own
            take_over(path, judged)
            taken.append(json.loads(json.dumps({"host": "node-c", "pid": 7, "since": 1,
                                                "token": "b"})))
            open(path, "w").write(json.dumps(taken[0]))
        take_over(path, judged)  # A's move, of the lock it judged, finds B's

    monkeypatch.setattr(locks, "_take_over", b_first)
    with pytest.raises(locks.Busy, match="in use by host node-c pid 7"):
        locks.acquire(lock, "w")
    assert json.load(open(lock))["token"] == "b"
    assert [name for name in os.listdir(os.path.dirname(lock))] == [".lock"]


def test_a_lock_on_gs_is_created_only_if_absent(tmp_path, monkeypatch):
    """Two commands creating a gs:// lock at once, both finding none, the second one's upload
    slower than the first's read-back: one holds it, the other is refused."""
    from fake_gcs import FakeGCS, fake_gcs
    pipe, write = FakeGCS.pipe_file, files_module().write_atomic

    def slow(call):
        def late(*args, **kwargs):
            time.sleep(0.9 if threading.current_thread().name == "slow" else 0.2)
            return call(*args, **kwargs)
        return late

    monkeypatch.setattr(FakeGCS, "pipe_file", slow(pipe))
    monkeypatch.setattr(files_module(), "write_atomic", slow(write))
    outcomes = {}

    def take(name):
        try:
            outcomes[name] = locks.acquire("gs://bucket/run/.lock", "run")["token"]
        except locks.Busy:
            outcomes[name] = "busy"

    with fake_gcs(tmp_path / "gcs"):
        threads = [threading.Thread(target=take, args=(n,), name=n) for n in ("fast", "slow")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert outcomes["slow"] == "busy" and outcomes["fast"] != "busy", outcomes


def files_module():
    from cfsl_jax.runtime import files
    return files


def test_a_sweep_never_trains_a_run_another_process_is_training(tmp_path):
    run = sweep.plan([CONFIG], str(tmp_path))[0][0]
    os.makedirs(run.workdir)
    other = holder(locks.path_in(run.workdir))
    try:
        [outcome] = sweep.run_sweep([CONFIG], str(tmp_path), workers=0, log=lambda line: None)
        assert outcome.status == "busy" and f"pid {other.pid}" in outcome.detail
        assert os.listdir(run.workdir) == [".lock"]
    finally:
        other.kill()
        other.wait()
    # a second sweep command on the same sweep dir (and shard) is refused up front
    with command_module("sweep") as module:
        lock, what = module.sweep_lock(str(tmp_path), (1, 2))
        assert lock.endswith(".sweep-shard-1-of-2.lock") and what.endswith("shard 1/2")
        other = holder(module.sweep_lock(str(tmp_path), None)[0])
        try:
            code, _, err = run_in_process(module, "sweep", [
                f"--workdir={tmp_path}", "--learners=protonets", "--cells=B2",
                "--dataset=synthetic", "--workers=0"])
        finally:
            other.kill()
            other.wait()
    assert code == 2 and err.startswith(f"error: sweep {tmp_path} is in use by host ")


def _commandline(module: str, *args: str) -> list[str]:
    """``python -m module args`` as a terminal starts it: SIGINT not ignored (a background
    pytest's children inherit it ignored) and the launch package seeing the command line."""
    code = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
            f"sys.orig_argv = [sys.executable, '-m', {module!r}, *sys.argv[1:]]; "
            f"sys.argv[0] = {module!r}; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", code, *args]


@pytest.mark.parametrize("after", [0.0, 0.4, 1.2])
def test_a_stop_while_jax_is_imported_is_one_line_and_130(tmp_path, after):
    """Ctrl-C from the command's first line ("[train] starting", printed as the launch
    package is imported) on, while JAX and the command's modules are imported. On an idle fast
    machine the command is training 1.2 s after that line: that stop leaves the workdir it
    started, and says so."""
    workdir = tmp_path / "w"
    process = subprocess.Popen(
        _commandline("cfsl_jax.launch.train", "--dataset=synthetic", f"--workdir={workdir}"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "[train] starting"
    time.sleep(after)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("interrupted") and "Traceback" not in err
    assert not workdir.exists() or (after > 0.5 and err.strip().splitlines()[-1].endswith((
        f"before its first checkpoint; no step is kept in {workdir}: re-run the same command "
        "to start it", f"{workdir}: re-run the same command to resume")))


def mounted_tmpfs(folder, size: str):
    folder.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                       check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {error}")
    return folder


def fill(folder, leave: int) -> str:
    """A file taking all but ``leave`` bytes of ``folder``'s filesystem."""
    path = os.path.join(folder, "filler")
    free = shutil.disk_usage(folder).free
    with open(path, "wb") as f:
        f.write(b"\0" * max(free - leave, 0))
    return path


def test_a_full_disk_is_one_line_leaves_nothing_half_written_and_resumes_exactly(
        tmp_path, reference, stopped_run, caplog):
    mount = mounted_tmpfs(tmp_path / "mnt", "4m")
    try:
        # at start: nothing is created
        filler = fill(mount, 64 << 10)
        with pytest.raises(disk.DiskFull, match=rf"no space left on the disk of {mount}"):
            train.train_and_evaluate(CONFIG, str(mount / "new"))
        assert os.listdir(mount) == ["filler"]
        os.remove(filler)
        # mid-run: a checkpoint that does not fit, refused up front (48 kB free) or failing
        # as orbax writes it (120 kB free: more than its arrays, less than its files)
        workdir = stopped(stopped_run, mount / "w")
        for leave in (48 << 10, 120 << 10):
            filler = fill(mount, leave)
            with pytest.raises(disk.DiskFull, match=r"checkpoints/latest: the write needed "):
                train.train_and_evaluate(CONFIG, workdir)
            leftovers = [name for root, dirs, names in os.walk(workdir) for name in dirs + names
                         if "tmp" in name]
            assert leftovers == [] and sorted(os.listdir(f"{workdir}/checkpoints/latest")) == [
                "6", "8"]
            os.remove(filler)
        assert not [r for r in caplog.records if "RESOURCE_EXHAUSTED" in r.getMessage()]
        assert numbers(train.train_and_evaluate(CONFIG, workdir)) == reference
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_sweep_workers_end_when_the_sweep_process_is_killed(tmp_path):
    long = dataclasses.replace(CONFIG, epochs=100, iters_per_epoch=50)
    code = ("import os, sys; from cfsl_jax.experiments import sweep\n"
            "from cfsl_jax.training.config import TrainConfig\n"
            f"config = TrainConfig(**{long.to_json()!r})\n"
            f"sweep.run_sweep([config], {str(tmp_path)!r}, workers=1)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env=unoptimised_env())  # its worker compiles at -O0 too
    try:
        for line in parent.stdout:  # the worker trains
            if "[train]" in line and "step" in line:
                break
        workers = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) ==
                   parent.pid]
        assert workers
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 90
    while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(_running(pid) for pid in workers)


def _ppid(pid: int) -> int | None:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _running(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_a_retest_is_refused_while_another_command_holds_the_workdir(finished, tmp_path):
    """launch.evaluate takes the workdir's lock too: it rewrites results.json and results.csv."""
    workdir = str(tmp_path / "w")
    shutil.copytree(finished[1], workdir)
    other = holder(locks.path_in(workdir))
    try:
        with command_module("evaluate") as module:
            code, _, err = run_in_process(module, "evaluate", [f"--workdir={workdir}"])
        assert code == 2 and len(err.splitlines()) == 1, err
        assert err.startswith(f"error: workdir {workdir} is in use by host "
                              f"{socket.gethostname()} pid {other.pid} since ")
    finally:
        other.kill()
        other.wait()


def test_verify_on_another_backend_names_the_backends_and_the_size_of_the_difference(
        finished, monkeypatch):
    """A run recorded on one backend and re-tested on another differs by kernel rounding:
    verify still says DIFFERS (no tolerance), and a note names both backends and the largest
    relative difference."""
    _, workdir = finished
    real = verify.results.test_record
    monkeypatch.setattr(verify.results, "test_record", lambda recorded: dataclasses.replace(
        real(recorded), ce_mean=real(recorded).ce_mean * (1 + 2e-5)))  # a GPU's rounding
    monkeypatch.setattr(verify.jax, "default_backend", lambda: "gpu")  # recorded on cpu
    differences = verify.verify(workdir)
    assert differences[0].startswith("ce_mean: recorded ") and len(differences) == 2
    assert differences[1] == ("note: recorded on cpu, recomputed on gpu: the largest difference "
                              "is 2.0e-05 relative, the rounding of another backend's kernels; "
                              "verify on cpu for the bit-for-bit check")
    monkeypatch.setattr(verify.jax, "default_backend", lambda: "cpu")  # the same backend: no note
    assert [d[:8] for d in verify.verify(workdir)] == ["ce_mean:"]


def test_verify_checks_each_task_each_class_group_and_the_costs(finished, monkeypatch):
    """A MATCH covers every number the test recorded: each task's accuracy and CE, each class
    group's accuracy, ATM and the MACs (recounted from the params' shapes), not only the
    means and standard deviations."""
    _, workdir = finished
    assert verify.verify(workdir) == []
    real = verify.results.test_record

    def tampered(recorded):
        record = real(recorded)
        ce = list(record.per_task["ce"])
        ce[3] *= 1 + 1e-6
        return dataclasses.replace(
            record, per_task={"acc": record.per_task["acc"], "ce": ce},
            group_acc=(record.group_acc[0] - 0.01, *record.group_acc[1:]),
            macs_per_meta_step=record.macs_per_meta_step + 1, atm=record.atm * 2)

    monkeypatch.setattr(verify.results, "test_record", tampered)
    differences = verify.verify(workdir)
    assert [d.split(":")[0] for d in differences] == [
        "group_acc", "per_task", "atm", "macs_per_meta_step"]
    assert differences[1] == ("per_task: 1 of the 14 tasks' accuracies and CEs differ (the "
                              "largest by 1.0e-06 relative)")


def test_a_re_test_counts_the_meta_step_again_not_the_recorded_count(tmp_path, finished):
    """launch.evaluate's re-test records the meta-step's MACs counted again: a count recorded
    by a version that counted wrong is not carried into the new results.json."""
    workdir = copied(finished, tmp_path)
    path = os.path.join(workdir, "results.json")
    stored = results.read_json(path)
    right = stored["test"]["macs_per_meta_step"]
    assert stored["macs_rule"] == 2
    results.write_json(path, {**stored, "test": {**stored["test"], "macs_per_meta_step": 1.0}})
    assert verify.verify(workdir) == [f"macs_per_meta_step: recorded 1.0, now {right!r}"]
    older = {k: v for k, v in stored.items() if k != "macs_rule"}  # written before the rules
    results.write_json(path, {**older, "test": {**stored["test"], "macs_per_meta_step": 1.0}})
    difference, note = verify.verify(workdir)
    assert note.startswith("note: the costs were counted by an older rule (1; now 2")
    runs.evaluate_run(workdir)
    assert results.read_json(path)["test"]["macs_per_meta_step"] == right > 1
    assert results.read_json(path)["macs_rule"] == 2
    assert verify.verify(workdir) == []


def test_a_hand_edit_behind_a_removed_manifest_entry_is_refused(tmp_path, finished):
    """results.json edited by hand and its entry removed from checksums.json (the rest of the
    manifest kept): refused as damaged, as with the whole manifest deleted. It was read
    unchecked (a file with no entry: "written before it was checked") and the edited accuracy
    printed as the finished run's."""
    workdir = copied(finished, tmp_path)
    path = os.path.join(workdir, "results.json")
    text = open(path).read()
    open(path, "w").write(text.replace('"acc_mean": 0.', '"acc_mean": 1.'))
    manifest = os.path.join(workdir, checksums.MANIFEST)
    with open(manifest) as f:
        recorded = json.load(f)
    del recorded["results.json"]
    with open(manifest, "w") as f:
        json.dump(recorded, f)
    with pytest.raises(checksums.Corrupt, match=re.escape(
            f"{path} was written with its folder's checksums, but {manifest} records none")):
        train.train_and_evaluate(CONFIG, workdir)
    with pytest.raises(checksums.Corrupt, match="records none"):
        verify.verify(workdir)
