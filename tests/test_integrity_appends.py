"""Append-only files read back checked: a sweep's provenance.jsonl and a run's metrics.jsonl.

A line cut short by a kill or a full disk (the last one, without its newline) is dropped; any
other damage is refused in one line naming the file. metrics.jsonl's part written by the last
checkpoint is sealed (its length and SHA-256 in the workdir's checksums.json): a hand-edited
number in it is refused by its readers, a resume and launch.verify.
"""

import json
import os
import shutil

import pytest

from cfsl_jax.experiments import reference, verify
from cfsl_jax.runtime import checksums
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training import loop, tracking, train
from launch_inprocess import command_module, run_in_process
from test_integrity import CONFIG

ENTRY = {"start": "2000-01-01T00:00:00Z", "commit": "abc123", "flagfile": "f",
         "learners": "protonets", "cell": "B2", "seeds": "0"}


# ---- provenance.jsonl --------------------------------------------------------------------------
def write_provenance(folder, text: str) -> str:
    path = os.path.join(folder, "provenance.jsonl")
    with open(path, "w") as f:
        f.write(text)
    return path


def test_a_provenance_line_cut_short_at_the_end_is_dropped(tmp_path):
    line = json.dumps(ENTRY)
    write_provenance(tmp_path, line + "\n" + line[:25])  # a kill (a full disk) mid-append
    assert reference.read_provenance(str(tmp_path)) == [ENTRY]
    write_provenance(tmp_path, line + "\n" + line)  # whole, only its newline missing: kept
    assert reference.read_provenance(str(tmp_path)) == [ENTRY, ENTRY]


def test_a_damaged_provenance_line_before_the_last_is_refused_naming_it(tmp_path):
    line = json.dumps(ENTRY)
    # a line cut short, then the next invocation's line appended to it
    path = write_provenance(tmp_path, line + "\n" + line[:25] + line + "\n" + line + "\n")
    with pytest.raises(UserError, match=f"^{path} line 2 is not a JSON object") as caught:
        reference.read_provenance(str(tmp_path))
    assert "\n" not in str(caught.value)
    # valid JSON without what the export reads: refused too, not a KeyError later
    path = write_provenance(tmp_path, line + "\n" + json.dumps({"start": "x"}) + "\n")
    with pytest.raises(UserError, match=f"^{path} line 2 .*commit"):
        reference.read_provenance(str(tmp_path))
    path = write_provenance(tmp_path, json.dumps({**ENTRY, "start": "yesterday"}) + "\n")
    with pytest.raises(UserError, match=f"^{path} line 1 .*start"):
        reference.read_provenance(str(tmp_path))


# ---- metrics.jsonl -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """CONFIG's run stopped after step 9 (checkpoints at steps 6 and 8): metrics.jsonl records
    up to step 9, sealed up to the records of the checkpoint of step 8 and the stop."""
    workdir = str(tmp_path_factory.mktemp("stopped") / "w")
    with pytest.raises(loop.Interrupted):
        train.train_and_evaluate(CONFIG, workdir, stop_after_steps=9)
    return workdir


def metrics_path(workdir: str) -> str:
    return os.path.join(workdir, tracking.METRICS_FILE)


def manifest(workdir: str) -> dict:
    with open(os.path.join(workdir, checksums.MANIFEST)) as f:
        return json.load(f)


def edit_first_loss(path: str) -> None:
    """A hand-edited number in the first record (the file still valid JSON lines)."""
    with open(path) as f:
        lines = f.readlines()
    record = json.loads(lines[0])
    lines[0] = json.dumps({**record, "loss": record["loss"] + 1.0}, sort_keys=True) + "\n"
    with open(path, "w") as f:
        f.writelines(lines)


def test_metrics_jsonl_is_sealed_and_a_hand_edited_number_is_refused(tmp_path, stopped_run):
    workdir = shutil.copytree(stopped_run, tmp_path / "w").as_posix()
    path = metrics_path(workdir)
    [[length, digest]] = manifest(workdir)[tracking.METRICS_FILE]
    with open(path, "rb") as f:
        data = f.read()
    assert length == len(data) and digest == checksums.sha256(data)  # sealed whole at the stop
    assert tracking.METRICS_FILE in verify.check_files(workdir)
    edit_first_loss(path)
    with pytest.raises(checksums.Corrupt, match=f"^{path} fails its checksum") as caught:
        tracking.read(path)
    assert "\n" not in str(caught.value)
    with pytest.raises(checksums.Corrupt, match=f"{path} fails its checksum"):
        verify.check_files(workdir)
    with pytest.raises(UserError, match=f"{path} fails its checksum"):
        train.train_and_evaluate(CONFIG, workdir)  # the resume: refused, nothing redone
    assert not os.path.exists(os.path.join(workdir, "results.json"))
    # as the line says: deleted, the run resumes and records from then on, sealed again
    os.remove(path)
    result = train.train_and_evaluate(CONFIG, workdir)
    records = tracking.read(path)
    assert records[-1]["phase"] == "test" and records[-1]["acc_mean"] == result["test"]["acc_mean"]
    assert min(r["step"] for r in records if r["phase"] == "train") == 9  # resumed at 8
    edit_first_loss(path)
    with command_module("verify") as module:  # the command: one line, status 2
        code, _, err = run_in_process(module, "verify", [f"--workdir={workdir}", "--nometrics",
                                                         "--nocosts"])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {path} fails its checksum")


def test_a_resume_keeps_the_seal_true_also_from_an_older_checkpoint(tmp_path, stopped_run):
    """A kill left records after the last checkpoint (step 9): the resume drops them; resumed
    from an older checkpoint (the newest one damaged), it drops sealed records (steps 7 and 8)
    and seals what it kept. No false alarm, and the finished run's file is sealed whole."""
    workdir = shutil.copytree(stopped_run, tmp_path / "w").as_posix()
    shutil.rmtree(os.path.join(workdir, "checkpoints", "latest", "8"))
    train.train_and_evaluate(CONFIG, workdir)
    path = metrics_path(workdir)
    records = tracking.read(path)
    train_steps = [r["step"] for r in records if r["phase"] == "train"]
    assert train_steps == list(range(1, CONFIG.epochs * CONFIG.iters_per_epoch + 1))
    [[length, digest]] = manifest(workdir)[tracking.METRICS_FILE]
    with open(path, "rb") as f:
        data = f.read()
    assert (length, digest) == (len(data), checksums.sha256(data))
    assert tracking.METRICS_FILE in verify.check_files(workdir)


def test_lines_after_the_seal_may_be_cut_and_an_unsealed_file_still_reads(tmp_path, stopped_run):
    workdir = shutil.copytree(stopped_run, tmp_path / "w").as_posix()
    path = metrics_path(workdir)
    before = tracking.read(path)
    with open(path, "a") as f:
        f.write('{"phase": "train", "step": 10, "loss": 1.0}\n{"phase": "train", "st')
    assert tracking.read(path) == [*before, {"phase": "train", "step": 10, "loss": 1.0}]
    # a workdir written before metrics.jsonl was sealed: read unchecked
    stored = manifest(workdir)
    del stored[tracking.METRICS_FILE]
    with open(os.path.join(workdir, checksums.MANIFEST), "w") as f:
        json.dump(stored, f)
    edit_first_loss(path)
    assert tracking.read(path)[0]["loss"] == before[0]["loss"] + 1.0
    assert tracking.METRICS_FILE not in verify.check_files(workdir)


def test_a_seal_extends_the_lines_this_run_appended_without_reading_the_file(tmp_path,
                                                                             monkeypatch):
    path = tmp_path / tracking.METRICS_FILE
    path.write_bytes(b'{"phase": "train", "step": 0}\n{"phase": "tr')  # a kill mid-line
    reads = []
    read_bytes = checksums.files.read_bytes
    monkeypatch.setattr(checksums.files, "read_bytes",
                        lambda name: reads.append(name) or read_bytes(name))

    def sealed() -> list:
        return json.loads((tmp_path / checksums.MANIFEST).read_text())[tracking.METRICS_FILE]

    run = tracking.Tracking(str(tmp_path))
    run.seal()  # the file ends in a line cut short: its complete lines sealed, no digest kept
    assert sealed() == [[30, checksums.sha256(path.read_bytes()[:30])]] and reads
    run.scalars("train", 1, {"loss": 0.5})  # completes the cut line (a line read skips)
    run.seal()  # read again, then extended with each appended line
    for step in range(2, 40):
        run.scalars("train", step, {"loss": 1.0 / step, "acc": [0.5, 0.25]})
        if step % 7 == 0:
            run.seal()
    run.close()
    data = path.read_bytes()
    assert len(reads) == 2 and sealed() == [[len(data), checksums.sha256(data)]]
    assert [r["step"] for r in tracking.read(str(path))] == [0] + list(range(2, 40))
    reads.clear()
    run = tracking.Tracking(str(tmp_path))
    run.seal()
    run.scalars("train", 40, {"loss": 0.0})
    path.write_bytes(data[:data.rfind(b"\n", 0, -1) + 1])  # another hand drops a line
    run.scalars("train", 41, {"loss": 0.0})
    run.seal()  # the file is not what its digest says: read again, and sealed as it is
    data = path.read_bytes()
    assert len(reads) == 2 and sealed() == [[len(data), checksums.sha256(data)]]
