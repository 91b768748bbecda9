"""launch.verify on a FLUID workdir: its checksums and seals checked, its stream re-run from the
recorded config and seed, every number compared exactly (MATCH / DIFFERS naming the number);
a sealed file with its seal removed is UNSEALED, never MATCH."""

import json
import os
import shutil

import pytest

from cfsl_jax import fluid
from cfsl_jax.experiments import verify_fluid
from cfsl_jax.fluid import experiment
from cfsl_jax.runtime import checksums, json_files
from launch_inprocess import command_module, run_in_process
from conftest import TINY_FLUID_NEW_CLASS

TINY = TINY_FLUID_NEW_CLASS
CONFIG = experiment.FluidConfig(**TINY, method_options={"ncm": {"new_class": True}})


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A FLUID workdir as a SLURM run leaves it: streams/0.json and new_class.json (sealed),
    then results.json assembled from them."""
    workdir = str(tmp_path_factory.mktemp("fluid") / "run")
    experiment.run_stream_alone(CONFIG, workdir, 0)
    experiment.run_experiment(CONFIG, workdir)
    return workdir


def copy_of(workdir, tmp_path):
    copy = str(tmp_path / "run")
    shutil.copytree(workdir, copy)
    return copy


def verify(*argv):
    with command_module("verify") as module:
        return run_in_process(module, "verify", list(argv))


def test_a_fluid_run_re_run_from_its_record_matches_bit_for_bit(finished):
    assert verify_fluid.is_fluid(finished)
    code, out, err = verify(f"--workdir={finished}")
    assert code == 0, out + err
    lines = out.rstrip().splitlines()
    assert lines[-1] == "MATCH"
    assert lines[-2].startswith("  results.json's checksum, the seals of streams/0.json, "
                                "new_class.json, each stream file equal to results.json's copy")
    assert "stream(s) 0 of 1 re-run: every method's metrics, schedules, training steps, MACs " \
           "bit-equal (tolerance 0" in lines[-2]
    assert lines[-2].endswith("the 'new class' thresholds chosen again on the validation "
                              "streams, equal")


def test_a_number_the_re_run_does_not_give_is_named(finished, tmp_path):
    """A record whose number no re-run gives (files consistent: results.json's checksum and the
    stream file's seal written with it) is DIFFERS, naming the number and both values."""
    workdir = copy_of(finished, tmp_path)
    results = json_files.read_json(os.path.join(workdir, "results.json"))
    metrics = results["streams"][0]["methods"]["ncm"]["metrics"]
    recorded = metrics["accuracy"]
    metrics["accuracy"] = 0.125
    results["summary"] = experiment.summarise([s["methods"] for s in results["streams"]])
    json_files.write_json(os.path.join(workdir, "results.json"), results)
    stream = checksums.read_sealed(experiment.stream_file(workdir, 0), "")
    stream["methods"]["ncm"]["metrics"]["accuracy"] = 0.125
    json_files.write_json(experiment.stream_file(workdir, 0), stream, sealed=True)
    code, out, err = verify(f"--workdir={workdir}", "--nothresholds")
    assert code == 1, out + err
    tail = out[out.index("DIFFERS"):].splitlines()
    assert tail == ["DIFFERS", f"  stream 0 methods.ncm.metrics.accuracy: recorded 0.125, now "
                               f"{recorded!r}"], out
    assert "MATCH" not in out


def test_a_stream_file_with_its_seal_removed_is_unsealed_not_match(finished, tmp_path):
    workdir = copy_of(finished, tmp_path)
    path = experiment.stream_file(workdir, 0)
    with open(path) as f:
        payload = json.load(f)
    del payload[checksums.SEALED]
    with open(path, "w") as f:
        json.dump(payload, f)
    code, out, err = verify(f"--workdir={workdir}", "--nometrics")
    assert code == 1, out + err
    tail = out[out.index("UNSEALED"):].splitlines()
    assert tail == ["UNSEALED", f"  {path} has no seal (sealed_sha256): written before seals, "
                                f"or its seal removed; nothing shows it unchanged since it was "
                                f"written"], out
    assert "MATCH" not in out


def test_a_changed_sealed_file_or_statistic_is_refused_or_named(finished, tmp_path):
    workdir = copy_of(finished, tmp_path)
    path = os.path.join(workdir, "new_class.json")
    with open(path) as f:
        payload = json.load(f)
    payload["thresholds"]["ncm"]["threshold"] = 0.5
    with open(path, "w") as f:
        json.dump(payload, f)
    code, out, err = verify(f"--workdir={workdir}", "--nometrics")
    assert code == 2 and err.strip().splitlines() == [
        f"error: {path} fails its checksum" + err.strip().split("fails its checksum")[1]]
    assert "Traceback" not in err
    # a stream's statistics the config and seed do not give (results.json's checksum kept)
    shutil.rmtree(workdir)
    workdir = copy_of(finished, tmp_path)
    os.remove(experiment.stream_file(workdir, 0))
    results = json_files.read_json(os.path.join(workdir, "results.json"))
    results["streams"][0]["stream"]["head_classes"] += 1
    json_files.write_json(os.path.join(workdir, "results.json"), results)
    code, out, err = verify(f"--workdir={workdir}", "--nometrics")
    assert code == 1, out + err
    assert "  stream 0 statistics.head_classes: recorded" in out
    assert out.rstrip().splitlines()[-1] != "MATCH"


def test_mistakes_are_one_line(finished, tmp_path):
    code, _, err = verify(f"--workdir={finished}", "--streams=3")
    assert code == 2 and err.strip() == "error: --streams=3: the run holds streams 0 to 0"
    study = tmp_path / "study"
    study.mkdir()
    (study / "update_strategy.json").write_text("{}")
    code, _, err = verify(f"--workdir={study}")
    assert code == 2 and "holds a FLUID study (update_strategy.json)" in err
    assert len(err.strip().splitlines()) == 1
    cfsl = tmp_path / "cfsl"
    cfsl.mkdir()
    (cfsl / "config.json").write_text("{}")
    code, _, err = verify(f"--workdir={cfsl}", "--streams=all")
    assert code == 2 and err.strip() == f"error: --streams is for a FLUID workdir; " \
                                        f"--workdir={cfsl} is a CFSL run"
    (tmp_path / "empty").mkdir()
    code, _, err = verify(f"--workdir={tmp_path / 'empty'}", "--streams=0")  # neither
    assert code == 2 and err.strip() == (
        f"error: --streams is for a FLUID workdir; --workdir={tmp_path / 'empty'} is not one "
        f"(no streams, new_class.json or results.json of streams)"), err
