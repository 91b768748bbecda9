"""A newcomer's mistakes are refused up front: one ``error:`` line naming the flag as typed (and
the value or limit), exit status 2, nothing created. Run in this process (``launch_inprocess``):
every one of them is refused before a command imports its data or compiles anything. Also:
list flags take comma lists and repeats alike, and a command's flags as a ``--flagfile``.
"""

import json
import os

import jax
import pytest
from absl import flags

from cfsl_jax.runtime import backend
from conftest import TEST_PRECISION
from launch_inprocess import command_module, run_in_process
from test_cli import assert_error

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def outcomes(name: str, cases: dict[str, list[str]]) -> dict[str, tuple[int, str, str]]:
    with command_module(name) as module:
        return {case: run_in_process(module, name, argv) for case, argv in cases.items()}


def test_show_task_refuses_an_out_file_in_a_missing_folder(tmp_path):
    missing = tmp_path / "no" / "such"
    out = outcomes("show_task", {
        "missing folder": [f"--out={missing / 'task.png'}"],
        "out is a folder": [f"--out={tmp_path}"],
        "manual_dir": ["--dataset=omniglot/small", f"--manual_dir={missing}"]})
    assert_error(out["missing folder"], f"--out={missing / 'task.png'}: the folder {missing} "
                                        f"does not exist")
    assert_error(out["out is a folder"], f"--out={tmp_path} is a folder")
    assert_error(out["manual_dir"], f"--manual_dir={missing} does not exist")
    assert os.listdir(tmp_path) == []


def test_report_refuses_a_missing_or_empty_sweep_dir_and_creates_nothing(tmp_path):
    empty, typo = tmp_path / "empty", tmp_path / "swep"
    empty.mkdir()
    (tmp_path / "table.json").write_text("{\"values\": {}}")
    out = outcomes("report", {
        "mistyped": [f"--sweep_dir={typo}"],
        "empty": [f"--sweep_dir={empty}"],
        "paper file": ["--figure=atm_macs", f"--paper_results={tmp_path / 'nope.json'}"],
        "paper layout": ["--figure=atm_macs", f"--paper_results={tmp_path / 'table.json'}"],
        "figure": ["--figure=atm_macs,accuracy", f"--sweep_dir={empty}"],
        "nss": ["--figure=atm_macs", "--nss=1,ten"],
        "learners": ["--figure=atm_macs", "--learners=protonets", "--learners=protonet"]})
    assert_error(out["mistyped"], f"--sweep_dir={typo} does not exist")
    assert_error(out["empty"], f"--sweep_dir={empty} holds no results.json")
    assert_error(out["paper file"], f"--paper_results={tmp_path / 'nope.json'} does not exist")
    assert_error(out["paper layout"], "a paper table needs the keys ['source']")
    assert_error(out["figure"], "flag --figure=atm_macs,accuracy: value should be one of "
                                "<accuracy_nss|atm_macs>")
    assert_error(out["nss"], "--nss=1,ten: every value must be a positive integer")
    assert_error(out["learners"], "--learners=protonets,protonet: unknown protonet; valid: ")
    assert sorted(os.listdir(tmp_path)) == ["empty", "table.json"]
    assert os.listdir(empty) == []


def test_sweep_names_the_list_flag_of_a_bad_item(tmp_path):
    workdir = tmp_path / "sweep"
    out = outcomes("sweep", {
        "cells": [f"--workdir={workdir}", "--cells=B3,X7"],
        "cells repeated": [f"--workdir={workdir}", "--cells=B3", "--cells=x7"],
        "seeds": [f"--workdir={workdir}", "--seeds=0,one"],
        "negative seed": [f"--workdir={workdir}", "--seeds=0,-1"],
        "negative workers": [f"--workdir={workdir}", "--workers=-3"],
        "datasets": [f"--workdir={workdir}", "--datasets=synthetic,omniglott"],
        "manual_dir": [f"--workdir={workdir}", f"--manual_dir={tmp_path / 'zips'}"]})
    assert_error(out["cells"], "--cells=B3,X7: cannot parse task 'X7'")
    assert_error(out["cells repeated"], "--cells=B3,x7: cannot parse task 'X7'")
    assert_error(out["seeds"], "--seeds=0,one: ['one'] not integers")
    assert_error(out["negative seed"], "seeds=[0, -1]: a seed is a non-negative integer")
    assert_error(out["negative workers"], "flag --workers=-3: -3 is not a non-negative integer")
    assert_error(out["datasets"], "--datasets=synthetic,omniglott: unknown omniglott; valid: ")
    assert_error(out["manual_dir"], f"--manual_dir={tmp_path / 'zips'} does not exist")
    assert os.listdir(tmp_path) == []


def test_fluid_names_the_stream_flag_and_its_limit(tmp_path):
    workdir = tmp_path / "fluid"
    out = outcomes("fluid", {
        "classes over the preset's length": ["--preset=small", "--stream_classes=5000",
                                             f"--workdir={workdir}"],
        "length under the preset's classes": ["--preset=small", "--stream_length=10",
                                              f"--workdir={workdir}"],
        "both": ["--preset=small", "--stream_classes=50", "--stream_length=20",
                 f"--workdir={workdir}"],
        "split": ["--preset=small", "--stream_classes=200", "--stream_length=5000",
                  f"--workdir={workdir}"],
        "zipf": ["--preset=small", "--zipf_s=-1", f"--workdir={workdir}"],
        "pretrain word": ["--preset=small", "--pretrain_classes=all", f"--workdir={workdir}"],
        "pretrain few": ["--preset=small", "--pretrain_classes=5", f"--workdir={workdir}"],
        "pretrain many": ["--preset=small", "--pretrain_classes=200", f"--workdir={workdir}"],
        "threshold alone": ["--preset=small", "--method_option=ncm:new_class_threshold=0.5",
                            f"--workdir={workdir}"],
        "streams": ["--preset=small", "--num_streams=0", f"--workdir={workdir}"],
        "validation streams": ["--preset=small", "--validation_streams=-1", f"--workdir={workdir}"],
        "method": ["--preset=small", "--method=ncm,nmc", f"--workdir={workdir}"],
        "pretrain steps": ["--preset=small", "--pretrain_steps=-5", f"--workdir={workdir}"],
        "option of a method not run": ["--preset=small", "--method=ncm",
                                       "--method_option=lwf:new_class=true",
                                       f"--workdir={workdir}"]})
    assert_error(out["classes over the preset's length"],
                 "--stream_classes=5000 needs a stream of at least 5000 samples (one per class), "
                 "but --preset=small's is 1200: give --stream_length >= 5000 too")
    assert_error(out["length under the preset's classes"],
                 "--stream_length=10 is shorter than --preset=small's 40 stream classes")
    assert_error(out["both"], "--stream_classes=50 is more than --stream_length=20")
    assert_error(out["split"], "--stream_classes=200 is more than the 190 classes of the train "
                               "split")
    assert_error(out["zipf"], "--zipf_s=-1.0 is invalid: must be in [0, 100)")
    assert_error(out["pretrain word"], "--pretrain_classes='all' is neither 'stream' nor an "
                                       "integer")
    assert out["pretrain word"][2].startswith("error: --pretrain_classes=")  # one --, not ----
    assert_error(out["pretrain few"], "--pretrain_classes=5 is invalid: must be 0 (the stream's "
                                      "pretrain classes only) or an int >= the stream's 10")
    assert_error(out["pretrain many"], "--pretrain_classes=200 needs 190 pretraining-only "
                                       "classes besides the stream's 40, but the train split "
                                       "has 190")
    assert_error(out["threshold alone"], "method ncm: new_class_threshold=0.5 needs "
                                         "new_class=true")
    assert_error(out["streams"], "--num_streams must be a positive integer, got 0")
    assert_error(out["validation streams"], "--validation_streams must be a positive integer, "
                                            "got -1")
    assert_error(out["pretrain steps"], "--pretrain_steps must be an integer >= 0, got -5")
    assert_error(out["method"], "--method=ncm,nmc: unknown nmc; valid: ncm, ")
    assert_error(out["option of a method not run"], "--method_option for methods not run: "
                                                    "['lwf']")
    assert os.listdir(tmp_path) == []


def test_train_refuses_a_manual_dir_that_does_not_exist(tmp_path):
    missing = tmp_path / "omniglot"
    out = outcomes("train", {
        "manual_dir": ["--dataset=omniglot", f"--manual_dir={missing}",
                       f"--workdir={tmp_path / 'w'}"],
        "manual_dir is a file": ["--dataset=omniglot", f"--manual_dir={__file__}",
                                 f"--workdir={tmp_path / 'w'}"],
        "flagfile": [f"--flagfile={missing}/flags.txt"]})
    assert_error(out["manual_dir"], f"--manual_dir={missing} does not exist")
    assert_error(out["manual_dir is a file"], f"--manual_dir={__file__} is a file")
    assert_error(out["flagfile"], f"--flagfile={missing}/flags.txt: no such file or directory")
    assert os.listdir(tmp_path) == []


def test_a_missing_manual_dir_is_named_by_the_data_layer_too(tmp_path):
    from cfsl_jax import data
    from cfsl_jax.datasets.errors import DatasetNotFoundError
    with pytest.raises(DatasetNotFoundError, match="^--manual_dir=.*/nope does not exist"):
        data.load_split("omniglot", "val", data_dir=str(tmp_path / "data"),
                        manual_dir=str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match="^--manual_dir=.*/empty holds no Omniglot "
                                                   "zips \\(expected images_background.zip"):
        data.load_split("omniglot", "val", data_dir=str(tmp_path / "data"),
                        manual_dir=str(tmp_path / "empty"))
    assert os.listdir(tmp_path) == ["empty"] and os.listdir(tmp_path / "empty") == []


def test_list_flags_take_comma_lists_and_repeats_alike():
    with command_module("report"):
        flags.FLAGS(["cfsl-report", "--figure=accuracy_nss,atm_macs", "--nss=1,2",
                     "--nss=4", "--learners", "protonets, init_tune"])
        assert flags.FLAGS.figure == ["accuracy_nss", "atm_macs"]
        assert flags.FLAGS.nss == ["1", "2", "4"]
        assert flags.FLAGS.learners == ["protonets", "init_tune"]
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["cfsl-report"])
        assert flags.FLAGS.figure == ["accuracy_nss"] and len(flags.FLAGS.nss) == 10


def test_a_runs_flags_as_a_flagfile_run_it_again_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with command_module("train") as module:
        cli = module.cli
        flags.FLAGS(["cfsl-train", "--learner=init_tune", "--task=b3", "--workdir=runs/w",
                     "--manual_dir=zips", "--learner_option=inner_steps=2",
                     "--learner_option=filters=8", "--nooverwrite", "--validate_only"])
        text = cli.flagfile_text()
        assert set(text.splitlines()) == {
            "--learner=init_tune", "--task=b3", f"--workdir={tmp_path}/runs/w",
            f"--manual_dir={tmp_path}/zips", "--learner_option=inner_steps=2",
            "--learner_option=filters=8", "--nooverwrite"}
        (tmp_path / "flags.txt").write_text(text)
        flags.FLAGS.unparse_flags()
        monkeypatch.chdir("/")
        flags.FLAGS(["cfsl-train", f"--flagfile={tmp_path / 'flags.txt'}"])
        assert flags.FLAGS.workdir == f"{tmp_path}/runs/w"
        assert flags.FLAGS.learner_option == ["inner_steps=2", "filters=8"]
        assert flags.FLAGS.overwrite is False and flags.FLAGS.learner == "init_tune"


def test_a_learner_evaluated_in_a_new_workdir_writes_its_flags_too(tmp_path):
    workdir = tmp_path / "it"
    argv = ["--learner=init_tune", "--task=b2", "--nc=3", "--kt=2", "--learner_option=filters=8",
            "--learner_option=inner_steps=1", "--dataset_option=num_classes=60",
            "--dataset_option=samples_per_class=8", "--test_tasks=2", "--eval_batch=2",
            f"--workdir={workdir}"]
    code, stdout, stderr = outcomes("evaluate", {"new": argv})["new"]
    assert code == 0, stderr
    assert sorted((workdir / "flags.txt").read_text().splitlines()) == sorted(argv)
    code, again, stderr = outcomes("train", {"flagfile": [f"--flagfile={workdir}/flags.txt"]})[
        "flagfile"]
    assert code == 0 and f"{workdir} holds this finished run" in again, stderr
    assert again.split("holds this finished run")[1].split("\n", 1)[1] in stdout


_SET_BY_A_COMMAND: list[str] = []


def test_a_command_run_in_process_sets_the_users_precision(tmp_path):
    """The command sets JAX's process-wide precision and cache as a user's run does ..."""
    with command_module("train") as module:
        code, _, err = run_in_process(module, "train", [
            "--learner=protonets", "--task=B3", f"--workdir={tmp_path}/w", "--precision=default",
            f"--compilation_cache_dir={tmp_path}/cache", "--dataset=omniglot",
            f"--manual_dir={tmp_path}/none"])  # refused after the settings, before any work
    assert code == 2 and "--manual_dir" in err, err
    assert backend.precision() == "default"
    assert jax.config.jax_compilation_cache_dir == f"{tmp_path}/cache"
    _SET_BY_A_COMMAND.append(f"{tmp_path}/cache")


def test_the_next_test_computes_at_the_suites_precision_again():
    """... and conftest puts them back after the test (on a TF32 GPU, a test after an in-process
    command computed at ``default`` and missed its 1e-4 tolerances)."""
    assert backend.precision() == TEST_PRECISION
    assert jax.config.jax_compilation_cache_dir not in _SET_BY_A_COMMAND


def test_a_workdir_of_another_run_is_refused_by_name(tmp_path):
    """launch.train into a finished FLUID workdir (it printed 'holds this finished run', then a
    KeyError traceback); launch.evaluate with a --learner that is not the run's (it re-tested
    the run's own learner and rewrote its results) or any other config flag that is not (it was
    ignored), or with a mistyped --workdir (it said the
    learner is meta-trained)."""
    from cfsl_jax.training.config import TrainConfig
    fluid, run = tmp_path / "fluid", tmp_path / "pn"
    fluid.mkdir()
    run.mkdir()
    (fluid / "results.json").write_text('{"complete": true, "config": {"methods": ["ncm"]}, '
                                        '"streams": [{}]}')
    (run / "config.json").write_text(__import__("json").dumps(
        TrainConfig(learner="protonets", task="B3").to_json()))
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    train = outcomes("train", {
        "fluid": ["--learner=protonets", f"--workdir={fluid}"],
        "fluid, checked": ["--learner=protonets", f"--workdir={fluid}", "--validate_only"]})
    for outcome in train.values():
        assert_error(outcome, f"--workdir={fluid} holds a FLUID run (its results.json has no "
                              f"CFSL test results and there is no config.json): give a new "
                              f"--workdir")
    evaluate = outcomes("evaluate", {
        "learner": [f"--workdir={run}", "--learner=init_tune"],
        "task": [f"--workdir={run}", "--task=b3", "--seed=1", "--validate_only"],
        "same": [f"--workdir={run}", "--learner=protonets", "--task=b3", "--validate_only"],
        "typo": [f"--workdir={tmp_path / 'pm'}", "--learner=protonets"],
        "options": [f"--workdir={run}", "--nc=4", "--test_tasks=8", "--learner_option=filters=16",
                    "--validate_only"],
        "budget": [f"--workdir={run}", "--budget=quick", "--validate_only"],
        "same options": [f"--workdir={run}", "--test_tasks=600", "--learner_option=filters=64",
                         "--validate_only"]})
    assert_error(evaluate["learner"], f"--learner=init_tune contradicts the run in "
                                      f"--workdir={run} (learner protonets): drop --learner to "
                                      f"re-test that run, or give a new --workdir")
    assert_error(evaluate["task"], f"--seed=1 contradicts the run in --workdir={run} (seed 0)")
    assert evaluate["same"][0] == 0, evaluate["same"]
    # any other config flag: it was ignored (the run re-tested as recorded, status 0)
    assert_error(evaluate["options"], f"--learner_option=filters=16 --test_tasks=8 --nc=4 "
                                      f"contradicts the run in --workdir={run} (learner_options "
                                      f"{{'filters': 64}}; test_tasks 600; nc 5): drop it to "
                                      f"re-test that run as it was trained, or give a new "
                                      f"--workdir")
    assert_error(evaluate["budget"], "--budget=quick contradicts the run in --workdir=")
    assert evaluate["same options"][0] == 0, evaluate["same options"]
    assert_error(evaluate["typo"], f"--workdir={tmp_path / 'pm'} does not exist, and "
                                   f"--learner=protonets is meta-trained")
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_a_finished_run_without_its_config_json_is_still_that_run(tmp_path):
    """config.json deleted (as the error for a damaged one advises): the finished run is the one
    its results.json records, so another config is refused as with config.json (it printed
    'holds this finished run' and rewrote flags.txt), and the same one writes config.json again
    (without it launch.verify and launch.evaluate found no run)."""
    from cfsl_jax.training import results
    from cfsl_jax.training.config import TrainConfig
    run = tmp_path / "pn"
    run.mkdir()
    config = TrainConfig(learner="protonets", task="B3")
    results.write_json(str(run / "results.json"), {"config": config.to_json(), "test": {}})
    train = outcomes("train", {
        "other": [f"--workdir={run}", "--learner=protonets", "--task=B3",
                  "--learning_rate=0.01", "--validate_only"],
        "same": [f"--workdir={run}", "--learner=protonets", "--task=B3", "--validate_only"]})
    assert_error(train["other"], f"workdir '{run}' holds a run with a different config (fields: "
                                 f"learning_rate); use a new workdir")
    assert train["same"][0] == 0, train["same"]
    assert not (run / "config.json").exists()  # --validate_only writes nothing
    from cfsl_jax.training import runs
    assert runs.finished_results(str(run), config, mend=True) is not None
    assert results.read_json(str(run / "config.json")) == config.to_json()


def test_an_unfinished_run_without_its_config_json_refuses_other_flags(tmp_path):
    """config.json of a run stopped part-way deleted: its checkpoints were trained with the
    flags whose SHA-256 checksums.json still records, so other flags are refused (they resumed
    the checkpoints under another config), and the same flags write config.json again."""
    from cfsl_jax.training import runs
    from cfsl_jax.training.config import TrainConfig
    run = str(tmp_path / "pn")
    config = TrainConfig(learner="protonets", task="B3")
    runs.check_workdir_config(run, config)  # as a run's start writes it
    os.remove(os.path.join(run, "config.json"))
    train = outcomes("train", {
        "other": [f"--workdir={run}", "--learner=protonets", "--task=B3",
                  "--learning_rate=0.01", "--validate_only"]})
    assert_error(train["other"], f"{run}/config.json is missing, and these flags' config is not "
                                 f"the one its checksum was recorded for in checksums.json: the "
                                 f"run there was started with other flags; run its own command "
                                 f"again, or give a new --workdir")
    runs.check_workdir_config(run, config)
    with open(os.path.join(run, "config.json")) as f:
        assert json.load(f) == config.to_json()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc (Linux)")
def test_a_folder_that_cannot_be_created_is_named_and_a_cache_is_optional(tmp_path):
    """--workdir=/proc/x (it gave a traceback) is refused naming the folder; a compilation cache
    folder that cannot be created (an unwritable HOME) is a warning, and the run goes on
    without a cache (it gave a traceback in train, verify, sweep and fluid)."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    out = outcomes("train", {
        "workdir": ["--learner=protonets", "--workdir=/proc/cfsl_x"],
        "cache": ["--learner=protonets", f"--workdir={tmp_path / 'w'}",
                  f"--compilation_cache_dir={blocker}/xla", "--dataset=omniglot",
                  f"--manual_dir={tmp_path / 'zips'}"]})  # refused after the backend settings
    assert_error(out["workdir"], "--workdir=/proc/cfsl_x: the folder /proc/cfsl_x cannot be "
                                 "created (No such file or directory); give a folder you can "
                                 "write to")
    code, _, stderr = out["cache"]
    warning, error = stderr.strip().splitlines()
    assert code == 2 and error.startswith(f"error: --manual_dir={tmp_path / 'zips'} does not")
    assert warning == (f"warning: the compilation cache folder {blocker}/xla cannot be written "
                       f"(Not a directory); going on without a cache (every program is compiled "
                       f"afresh): give a writable --compilation_cache_dir (or XDG_CACHE_HOME), "
                       f"or --compilation_cache_dir='' to turn it off")
    assert jax.config.jax_compilation_cache_dir is None
    assert sorted(os.listdir(tmp_path)) == ["a_file"]


def test_a_symlinked_manual_dir_is_recorded_and_echoed_as_typed(tmp_path):
    """(It was recorded, and named in errors, as the symlink's target.)"""
    (tmp_path / "real").mkdir()
    (tmp_path / "zips").symlink_to(tmp_path / "real")
    with command_module("train") as module:
        flags.FLAGS(["cfsl-train", "--dataset=omniglot", f"--manual_dir={tmp_path}/zips",
                     f"--workdir={tmp_path}/w", "--validate_only"])
        assert module.config_from_flags().manual_dir == f"{tmp_path}/zips"
        assert f"--manual_dir={tmp_path}/zips" in module.cli.flagfile_text()
