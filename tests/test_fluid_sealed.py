"""FLUID's files written by one job and read by another (streams/<i>.json, new_class.json) hold
their own SHA-256 (checksums.seal_json): a changed one is refused naming it, an older unsealed one
is read, and streams counted with different 'new class' thresholds are never mixed."""

import json
import math
import os
import shutil
import types

import numpy as np
import pytest

from cfsl_jax.fluid import experiment, new_class
from cfsl_jax.runtime import checksums
from cfsl_jax.runtime.errors import UserError
from conftest import TINY_FLUID_NEW_CLASS

TINY = TINY_FLUID_NEW_CLASS
CONFIG = experiment.FluidConfig(**TINY, method_options={"ncm": {"new_class": True}})


@pytest.fixture(scope="module")
def one_stream(tmp_path_factory):
    """A workdir where a job of its own (SLURM) ran stream 0: new_class.json, streams/0.json."""
    workdir = str(tmp_path_factory.mktemp("fluid") / "run")
    experiment.run_stream_alone(CONFIG, workdir, 0)
    return workdir


def copy_of(one_stream, tmp_path):
    workdir = str(tmp_path / "run")
    shutil.copytree(one_stream, workdir)
    return workdir


def edit(path, change):
    with open(path) as f:
        payload = json.load(f)
    change(payload)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2, sort_keys=True)


def test_a_sealed_payload_reads_back_as_written_and_an_edit_is_refused(tmp_path):
    path = str(tmp_path / "x.json")
    payload = {"t": -math.inf, "pair": (1, 2), 10: "ten", 2: {"b": 0.1, "a": [True, None]}}
    with open(path, "w") as f:
        f.write(checksums.seal_json(payload))
    assert checksums.read_sealed(path, "delete it") == json.loads(json.dumps(payload))
    edit(path, lambda p: p["2"].update(b=0.2))
    with pytest.raises(checksums.Corrupt) as error:
        checksums.read_sealed(path, "delete it")
    assert str(error.value).startswith(f"{path} fails its checksum")
    assert str(error.value).endswith("; delete it") and "\n" not in str(error.value)
    with open(path, "w") as f:
        f.write('{"t": 1')  # cut short
    with pytest.raises(checksums.Corrupt, match="is not valid JSON"):
        checksums.read_sealed(path, "delete it")


def test_a_hand_edited_stream_file_is_refused_naming_it(one_stream, tmp_path):
    workdir = copy_of(one_stream, tmp_path)
    path = experiment.stream_file(workdir, 0)
    edit(path, lambda p: p["methods"]["ncm"]["metrics"].update(accuracy=0.99))
    with pytest.raises(UserError) as error:  # checksums.Corrupt: one line, no traceback (cli)
        experiment.run_experiment(CONFIG, workdir)
    message = str(error.value)
    assert isinstance(error.value, checksums.Corrupt) and "\n" not in message
    assert message.startswith(f"{path} fails its checksum") and "stream 0 is run again" in message
    assert not os.path.exists(os.path.join(workdir, "results.json"))


def test_a_hand_edited_new_class_json_is_refused_naming_it(one_stream, tmp_path):
    workdir = copy_of(one_stream, tmp_path)
    path = os.path.join(workdir, "new_class.json")
    edit(path, lambda p: p["thresholds"]["ncm"].update(threshold=0.5))
    os.remove(experiment.stream_file(workdir, 0))  # so that stream 0 runs here, reading it
    with pytest.raises(checksums.Corrupt) as error:
        experiment.run_experiment(CONFIG, workdir)
    assert str(error.value).startswith(f"{path} fails its checksum")
    assert str(error.value).endswith(new_class.ADVICE)


def test_files_written_before_seals_are_read_with_a_note(one_stream, tmp_path, capsys):
    workdir = copy_of(one_stream, tmp_path)
    stream, thresholds = experiment.stream_file(workdir, 0), os.path.join(workdir,
                                                                          "new_class.json")
    for path in (stream, thresholds):
        edit(path, lambda p: p.pop(checksums.SEALED))  # as the code before seals wrote them
    with open(stream) as f:
        legacy = json.load(f)
    results = experiment.run_experiment(CONFIG, workdir)
    assert results["streams"][0]["methods"] == legacy["methods"]
    assert results["new_class"] == legacy["new_class"]
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    assert notes == [f"note: {stream} was written before sealed files (no sealed_sha256): it "
                     f"and the others in {os.path.dirname(stream)} without one are read "
                     f"unchecked"]
    # new_class.json unsealed: still used as stored (no validation stream is run)
    options = {"ncm": {"new_class": True}}
    stored = json.loads(open(thresholds).read())
    chosen = new_class.thresholds(options, thresholds, stored["config"], 1, None)
    assert chosen == stored["thresholds"]


def fake_validation(score):
    """A ``run`` of ``new_class.thresholds``: one validation stream of 4 samples."""
    stream = types.SimpleNamespace(first_appearance=np.array([True, False, True, False]),
                                   is_pretrain_class=np.zeros(4, bool),
                                   label=np.array([0, 0, 1, 1]))
    record = types.SimpleNamespace(prediction=np.array([-1, 0, 0, 1]),
                                   unseen_score=np.asarray(score, np.float64))
    return lambda names, index: (stream, {name: record for name in names})


def test_a_job_uses_the_thresholds_another_job_stored_while_it_chose_its_own(tmp_path):
    path = str(tmp_path / "new_class.json")
    options, config = {"ncm": {"new_class": True}}, {"seed": 0}
    other = str(tmp_path / "other.json")
    theirs = new_class.thresholds(options, other, config, 1, fake_validation([.9, .1, .8, .2]))
    run_mine = fake_validation([.7, .3, .6, .25])  # the same streams on another GPU

    def mine_while_another_job_stores_its_choice(names, index):
        shutil.copy(other, path)
        return run_mine(names, index)

    ours = new_class.thresholds(options, path, config, 1, mine_while_another_job_stores_its_choice)
    assert run_mine(["ncm"], 0) and theirs["ncm"]["threshold"] == 0.2  # its own would be 0.3
    assert ours == theirs
    assert checksums.read_sealed(path, "")["thresholds"] == theirs  # not overwritten


def test_streams_counted_with_different_thresholds_are_refused(one_stream, tmp_path):
    config = experiment.FluidConfig(**{**TINY, "num_streams": 2},
                                    method_options={"ncm": {"new_class": True}})
    workdir = copy_of(one_stream, tmp_path)
    first = experiment.stream_file(workdir, 0)
    stream = checksums.read_sealed(first, "")
    stream["new_class"]["ncm"]["threshold"] += 1e-9  # another job's choice, sealed by that job
    second = experiment.stream_file(workdir, 1)
    with open(second, "w") as f:
        f.write(checksums.seal_json(stream))
    with pytest.raises(UserError) as error:
        experiment.run_experiment(config, workdir)
    message = str(error.value)
    assert message.startswith(f"{second} was counted with other 'new class' thresholds")
    assert message.endswith("delete it and run the same command again: it is run again with "
                            f"{os.path.join(workdir, 'new_class.json')}'s") and "\n" not in message
    with open(os.path.join(workdir, "results.json")) as f:
        assert len(json.load(f)["streams"]) == 1  # stream 0, counted alone
