"""Nothing silently wrong, continued (tests/test_integrity.py): every file a run keeps its
numbers in is checked like the others, and every command that writes a workdir holds its lock.
"""

import json
import os
import shutil
import socket

import pytest

from cfsl_jax.experiments import verify
from cfsl_jax.runtime import checksums, locks
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training import loop, sessions, train
from launch_inprocess import command_module, run_in_process
from test_integrity import CONFIG, holder


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """CONFIG's run stopped after step 9: sessions.json counts its session so far."""
    workdir = str(tmp_path_factory.mktemp("stopped") / "w")
    with pytest.raises(loop.Interrupted):
        train.train_and_evaluate(CONFIG, workdir, stop_after_steps=9)
    return workdir


def edited(path: str, **changes) -> None:
    """``path``'s JSON edited by hand (the numbers changed, the file valid JSON)."""
    with open(path) as f:
        stored = json.load(f)
    with open(path, "w") as f:
        json.dump({**stored, **changes}, f)


def test_a_hand_edited_sessions_json_is_refused_naming_it(tmp_path, stopped_run):
    """sessions.json feeds results.json's wall_seconds: checked like config.json and the rest
    (its checksum recorded when written, checked when read, by a resume and by verify)."""
    workdir = shutil.copytree(stopped_run, tmp_path / "w").as_posix()
    path = os.path.join(workdir, sessions.FILE)
    assert sessions.FILE in checksums.recorded(workdir)
    assert "sessions.json" in verify.check_files(workdir)
    earlier = sessions.earlier(workdir)
    assert earlier["sessions"] == 1 and earlier["seconds"] > 0
    edited(path, seconds=earlier["seconds"] + 3600)
    with pytest.raises(checksums.Corrupt, match=f"{path} fails its checksum"):
        verify.check_files(workdir)
    with pytest.raises(UserError, match=f"{path} fails its checksum .*delete it and run the "
                                        f"same command again"):
        train.train_and_evaluate(CONFIG, workdir)  # the resume: refused, nothing redone
    assert not os.path.exists(os.path.join(workdir, "results.json"))
    os.remove(path)  # as the line says: the run then finishes, counting this session alone
    result = train.train_and_evaluate(CONFIG, workdir)
    assert result["wall_seconds"] < earlier["seconds"] + 3600
    assert sessions.earlier(workdir)["sessions"] == 1
    with command_module("verify") as module:  # the command: one line, status 2
        edited(path, sessions=7)
        code, _, err = run_in_process(module, "verify", [f"--workdir={workdir}", "--nometrics",
                                                         "--nocosts"])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {path} fails its checksum")


def test_a_sessions_json_from_before_its_checksum_is_read_then_checked(tmp_path, stopped_run):
    """A workdir whose manifest has no entry for sessions.json (written before it was
    checked): read unchecked, and checked from its next write on."""
    workdir = shutil.copytree(stopped_run, tmp_path / "w").as_posix()
    manifest = os.path.join(workdir, checksums.MANIFEST)
    with open(manifest) as f:
        recorded = json.load(f)
    del recorded[sessions.FILE]
    with open(manifest, "w") as f:
        json.dump(recorded, f)
    edited(os.path.join(workdir, sessions.FILE), seconds=12.5)
    assert sessions.earlier(workdir) == {"seconds": 12.5, "sessions": 1}
    assert "sessions.json" not in verify.check_files(workdir)
    result = train.train_and_evaluate(CONFIG, workdir)
    assert result["wall_seconds"] > 12.5
    assert sessions.FILE in checksums.recorded(workdir)
    assert "sessions.json" in verify.check_files(workdir)


FLUID_TINY = ["--preset=small", "--method=ncm", "--stream_classes=6", "--stream_length=90",
              "--head_threshold=15", "--min_pretrain_samples=5", "--pretrain_steps=3",
              "--filters=8", "--dataset_option=num_classes=20",
              "--dataset_option=samples_per_class=30", "--dataset_option=image_size=16"]


@pytest.mark.parametrize("study", [[], ["--study=update_strategy", "--study_frequencies=45000",
                                        "--study_epochs=1"]])
def test_a_second_fluid_command_on_a_workdir_is_refused_naming_the_holder(tmp_path, study):
    """launch.fluid rewrites results.json, results.txt (the table it prints) and the plots:
    while another command works in the workdir it is refused in one line, as launch.train is,
    and writes nothing."""
    workdir = str(tmp_path / "fluid")
    os.makedirs(workdir)
    other = holder(locks.path_in(workdir))
    try:
        with command_module("fluid") as module:
            code, _, err = run_in_process(module, "fluid", [f"--workdir={workdir}",
                                                            *FLUID_TINY, *study])
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"error: workdir {workdir} is in use by host "
                              f"{socket.gethostname()} pid {other.pid} since ")
        assert os.listdir(workdir) == [".lock"]  # nothing written, nothing removed
    finally:
        other.kill()
        other.wait()


def test_a_results_csv_row_cut_short_is_dropped_not_merged_with_the_next(tmp_path):
    """A run's results.csv is appended to; an append cut short (a kill, or a full disk in the
    middle of the row) left a row without its end, and the next row (a re-test) was glued to
    it: one row of misaligned numbers. The file is now replaced whole (write then rename), and
    a row cut short by an older version is dropped."""
    import csv
    from cfsl_jax.training import results as results_io
    path = str(tmp_path / "results.csv")
    row = {field: 0.25 for field in results_io.CSV_FIELDS}
    first = {**row, "learner": "protonets", "dataset": "synthetic", "spec": "B2", "seed": 0,
             "acc_mean": 0.5, "retest": 0}
    second = {**first, "acc_mean": 0.75, "retest": 1}
    results_io.write_csv_row(path, first)
    with open(path, "a") as f:  # what an append cut short leaves: part of a row, no newline
        f.write(results_io.csv_text([second], results_io.CSV_FIELDS).splitlines()[1][:30])
    results_io.write_csv_row(path, second)
    rows = list(csv.DictReader(open(path)))
    assert all(None not in r for r in rows)  # no row with more fields than the header
    assert [(r["learner"], r["acc_mean"], r["retest"]) for r in rows] == [
        ("protonets", "0.5", "0"), ("protonets", "0.75", "1")]
    assert [name for name in os.listdir(tmp_path)] == ["results.csv"]



def test_a_refused_new_run_is_removed_before_its_lock_is_released(tmp_path, monkeypatch):
    """A run refused before its first checkpoint removes the workdir it created; it did so
    after releasing the lock, so a command that took the lock in between (the same workdir,
    started a moment later) had its lock and files deleted under it. The workdir is now emptied
    while the lock is held; the empty folder is removed after, if no one took it meanwhile."""
    import dataclasses
    workdir = str(tmp_path / "w")
    lock = locks.path_in(workdir)
    release, others = locks.release, []

    def release_then_another_takes_it(path, me):
        release(path, me)
        if path == lock:  # the other command: its lock, and the config.json it writes first
            others.append(locks.acquire(lock, f"workdir {workdir}"))
            with open(os.path.join(workdir, "config.json"), "w") as f:
                f.write("{}")

    monkeypatch.setattr(locks, "release", release_then_another_takes_it)
    too_few = dataclasses.replace(CONFIG, dataset_options={"num_classes": 8,
                                                           "samples_per_class": 8})
    with pytest.raises(UserError, match="cannot be sampled"):
        train.train_and_evaluate(too_few, workdir)
    assert sorted(os.listdir(workdir)) == [".lock", "config.json"]  # the other's, untouched
    with open(lock) as f:
        assert json.load(f)["token"] == others[0]["token"]
    monkeypatch.setattr(locks, "release", release)
    release(lock, others[0])
    os.remove(os.path.join(workdir, "config.json"))
    os.rmdir(workdir)
    # alone, the refused run still leaves nothing
    with pytest.raises(UserError, match="cannot be sampled"):
        train.train_and_evaluate(too_few, workdir)
    assert os.listdir(tmp_path) == []
