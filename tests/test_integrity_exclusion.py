"""Commands that must not run at once on one folder: a whole sweep and a shard of it (shards
beside each other are the point of sharding), two SLURM submissions, a SLURM submission and a
local sweep, two reference exports into one folder. Each
refusal is one line naming the holder (exit status 2), as the existing locks' are.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from cfsl_jax.experiments import reference, reference_report, slurm
from cfsl_jax.runtime import locks
from launch_inprocess import command_module, run_in_process
from test_integrity import holder
from test_reference_tables import fake_run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--learners=protonets", "--cells=B2", "--dataset=synthetic", "--workers=0",
        "--epochs=1", "--iters_per_epoch=1", "--val_tasks=1", "--test_tasks=1", "--nc=2"]


def refused(module, sweep_dir, *args) -> str:
    code, _, err = run_in_process(module, "sweep", [f"--workdir={sweep_dir}", *TINY, *args])
    assert code == 2 and len(err.strip().splitlines()) == 1, (code, err)
    return err


def test_a_whole_sweep_and_a_shard_of_it_exclude_each_other(tmp_path):
    with command_module("sweep") as module:
        whole = holder(module.sweep_lock(str(tmp_path), None)[0])
        try:
            err = refused(module, tmp_path, "--shard=1/2")
        finally:
            whole.kill()
            whole.wait()
        assert err.startswith(f"error: sweep {tmp_path} shard 1/2 cannot run while sweep "
                              f"{tmp_path} runs: it is in use by host {socket.gethostname()} "
                              f"pid {whole.pid} since ")
        shard = holder(module.sweep_lock(str(tmp_path), (2, 3))[0])
        try:
            err = refused(module, tmp_path)
        finally:
            shard.kill()
            shard.wait()
    assert err.startswith(f"error: sweep {tmp_path} cannot run while sweep {tmp_path} shard "
                          f"2/3 runs: it is in use by host {socket.gethostname()} pid "
                          f"{shard.pid} since ")
    assert not os.path.exists(tmp_path / "synthetic")  # nothing trained


def test_shards_run_beside_each_other_but_not_twice_and_a_stale_lock_blocks_nothing(tmp_path):
    with command_module("sweep") as module:
        first = holder(module.sweep_lock(str(tmp_path), (1, 2))[0])
        try:
            with module.sweep_locked(str(tmp_path), (2, 2)):  # another shard: runs
                pass
            with pytest.raises(locks.Busy, match=f"sweep {tmp_path} shard 1/2 is in use by "):
                with module.sweep_locked(str(tmp_path), (1, 2)):
                    pass
        finally:
            first.kill()  # SIGKILL: its lock stays behind, stale
            first.wait()
        assert os.path.exists(module.sweep_lock(str(tmp_path), (1, 2))[0])
        with module.sweep_locked(str(tmp_path), None):  # the dead shard's lock: no bar
            assert os.path.exists(module.sweep_lock(str(tmp_path), None)[0])
        assert not os.path.exists(module.sweep_lock(str(tmp_path), None)[0])


def test_a_slurm_submission_beside_another_or_a_local_sweep_is_refused(tmp_path):
    """Two commands submitting one sweep at once would both find its runs new and queue each
    twice: while one holds the submission lock, a second submission (or --cancel) is refused
    naming it, having submitted, cancelled and recorded nothing; so is a submission while a
    local sweep (or a shard) of the folder runs; once they are over, one goes through."""
    from cfsl_jax.training.config import TrainConfig
    sweep_dir = str(tmp_path)
    configs = [TrainConfig(dataset="synthetic", learner="protonets", task="B2", seed=s)
               for s in range(3)]
    works = slurm.sweep_work(configs, sweep_dir)

    class Recorder:
        calls = []

        def map_array(self, fn, config_jsons, workdirs):
            self.calls.append(workdirs)
            return [type("Job", (), {"job_id": f"8_{i}"})() for i in range(len(workdirs))]

    recorder, cancelled = Recorder(), []

    def submit(**kwargs):
        return slurm.submit(works, sweep_dir, slurm.SlurmOptions(), slurm.RunJob({}),
                            executor=recorder, queued={}, log=lambda line: None, **kwargs)

    what = f"the SLURM submission from {sweep_dir}"
    with command_module("sweep") as module:
        local = lambda: module.local_sweep_locks(sweep_dir)  # noqa: E731  (launch.sweep's)
        for shard, named in ((None, ""), ((2, 3), " shard 2/3")):
            other = holder(module.sweep_lock(sweep_dir, shard)[0])
            try:
                with pytest.raises(locks.Busy) as refusal:
                    submit(excluded=local)
            finally:
                other.kill()
                other.wait()
            assert str(refusal.value).startswith(
                f"{what} cannot run while sweep {sweep_dir}{named} runs: it is in use by host "
                f"{socket.gethostname()} pid {other.pid} since ")
            assert not os.path.exists(slurm.slurm_dir(sweep_dir))  # refused: nothing created
        os.makedirs(slurm.slurm_dir(sweep_dir))
        other = holder(locks.path_in(slurm.slurm_dir(sweep_dir), slurm.SUBMIT_LOCK))
        try:
            for attempt in (submit, lambda: slurm.cancel(works, sweep_dir, queued={},
                                                         command=cancelled.append)):
                with pytest.raises(locks.Busy) as refusal:
                    attempt()
                assert str(refusal.value).startswith(
                    f"{what} is in use by host {socket.gethostname()} pid {other.pid} since ")
        finally:
            other.kill()
            other.wait()
        assert recorder.calls == [] and cancelled == []
        # no jobs.json; only the killed holder's lock, stale, which the next one takes over
        assert os.listdir(slurm.slurm_dir(sweep_dir)) == [slurm.SUBMIT_LOCK]
        submitted = submit(excluded=local)  # the local sweep's locks left behind are stale
    assert len(submitted.jobs) == len(works) == 3 and len(recorder.calls) == 1
    assert sorted(slurm.read_jobs(sweep_dir).values()) == ["8_0", "8_1", "8_2"]
    assert os.listdir(slurm.slurm_dir(sweep_dir)) == [slurm.JOBS_FILE]  # the lock released


def test_a_second_export_into_a_folder_is_refused_naming_the_holder(tmp_path):
    sweep = tmp_path / "sweep"
    fake_run(sweep, "init_tune", 0, np.array([0.2, 0.4]))
    out = tmp_path / "ref"
    out.mkdir()
    other = holder(locks.path_in(str(out), reference.EXPORT_LOCK))
    try:
        with pytest.raises(locks.Busy, match=f"^reference folder {out} is in use by host "
                                             f"{socket.gethostname()} pid {other.pid} since "):
            reference.export(str(sweep), str(out))
        command = subprocess.run(
            [sys.executable, "-m", "benchmarks.reference.export", f"--sweep_dir={sweep}",
             f"--out_dir={out}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    finally:
        other.kill()
        other.wait()
    assert command.returncode == 2, command.stderr
    assert command.stderr.strip().splitlines()[-1].startswith(
        f"error: reference folder {out} is in use by host")
    assert sorted(os.listdir(out)) == [reference.EXPORT_LOCK]  # nothing written
    rows = reference.export(str(sweep), str(out), table=reference_report.write_table)  # once it is free
    assert [row["learner"] for row in rows] == ["init_tune"]
    assert sorted(os.listdir(out)) == ["results.csv", "runs", "table.md"]
    assert json.load(open(out / rows[0]["run"] / "results.json"))["seed"] == 0


def test_a_lock_appears_whole_and_an_empty_one_left_by_a_kill_is_taken_over(tmp_path, capsys):
    """A lock is linked into place already written, so no reader sees it empty; an empty lock
    file (a kill between an exclusive create and its write, as earlier versions wrote it)
    blocked the folder for 120 s as "in use by host ? pid ?"; once older than the time a write
    takes, it is taken over with a line saying so."""
    lock = str(tmp_path / ".lock")
    me = locks.acquire(lock, "workdir w")
    with open(lock) as f:
        assert json.load(f)["token"] == me["token"]
    assert os.listdir(tmp_path) == [".lock"]  # the name it was written under is gone
    assert not locks._create(lock, "{}")  # exclusive
    locks.release(lock, me)
    open(lock, "w").close()
    old = os.stat(lock).st_mtime - 2 * locks.WRITING_S
    os.utime(lock, (old, old))
    taken = locks.acquire(lock, "workdir w")
    with open(lock) as f:
        assert json.load(f)["token"] == taken["token"]
    assert ("note: taking over the stale lock of workdir w (held by no one (the lock file is "
            "empty or damaged), which is gone)") in capsys.readouterr().out
    locks.release(lock, taken)
