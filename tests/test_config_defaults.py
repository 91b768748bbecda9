"""A changed learner-option default never changes what an existing workdir computes: config.json
records every learner option (given or default), and one saved before that (only the options
given on its command line) reads back with the defaults it ran with (ProtoNets' conv=gemm_grad
and tasks_on_cpu=vmap),
also under a later default (``conv_default_auto``: ProtoNets' conv default made "auto", as the
other learners')."""

import dataclasses
import json
import os

import pytest

from cfsl_jax import learners
from cfsl_jax.learners.protonets import ProtoNetsOptions
from cfsl_jax.experiments.verify import match_detail
from cfsl_jax.training import config as config_module
from cfsl_jax.training import results, runs
from cfsl_jax.training.config import TrainConfig
from launch_inprocess import command_module, run_in_process

# A tiny ProtoNets run, as flags and as the config they give.
ARGS = ["--learner=protonets", "--task=B2", "--nc=3", "--kt=2", "--learner_option=filters=8",
        "--dataset_option=num_classes=60", "--dataset_option=samples_per_class=8", "--epochs=1",
        "--iters_per_epoch=2", "--meta_batch=2", "--val_tasks=4", "--test_tasks=5",
        "--eval_batch=5", "--keep_best=1"]
TINY = TrainConfig(
    learner="protonets", learner_options={"filters": 8}, dataset="synthetic",
    dataset_options={"num_classes": 60, "samples_per_class": 8}, task="B2",
    spec_overrides={"nc": 3, "kt": 2}, epochs=1, iters_per_epoch=2, meta_batch=2, val_tasks=4,
    test_tasks=5, eval_batch=5, keep_best=1)


def later_defaults(monkeypatch, **defaults) -> None:
    """Make ProtoNets' options class one whose ``defaults`` differ, everywhere it is looked up."""
    later = dataclasses.make_dataclass(
        "Later", [(name, type(value), dataclasses.field(default=value))
                  for name, value in defaults.items()], bases=(ProtoNetsOptions,), frozen=True)
    real = learners.options_class
    lookup = lambda name: later if name == "protonets" else real(name)  # noqa: E731
    monkeypatch.setattr(learners, "options_class", lookup)
    monkeypatch.setattr(config_module, "options_class", lookup)


@pytest.fixture
def conv_default_auto(monkeypatch):
    later_defaults(monkeypatch, conv="auto")
    assert learners.learner_options("protonets", {}).conv == "auto"


def as_saved_before_resolving(workdir: str, given: dict) -> None:
    """Rewrite a run's config.json and results.json's config as a run saved before config.json
    recorded every learner option: only the options ``given`` on its command line, each file
    with its checksum (as that run wrote them)."""
    config = results.read_json(os.path.join(workdir, "config.json"))
    results.write_json(os.path.join(workdir, "config.json"), {**config, "learner_options": given})
    stored = results.read_json(os.path.join(workdir, "results.json"))
    stored["config"] = {**stored["config"], "learner_options": given}
    results.write_json(os.path.join(workdir, "results.json"), stored)


def file_bytes(folder: str) -> dict[str, bytes]:
    """The bytes of each file directly in ``folder``."""
    paths = {name: os.path.join(folder, name) for name in sorted(os.listdir(folder))}
    return {name: open(path, "rb").read() for name, path in paths.items() if os.path.isfile(path)}


@pytest.fixture(scope="module")
def old_run(tmp_path_factory):
    """A finished ProtoNets run trained with the convolution and the CPU task layout old runs
    used (given explicitly), then made to look as such a run looks: its config.json without
    ``conv`` and ``tasks_on_cpu``, its test record without ``tasks_in_turn``. Returns its
    workdir and the config.json and results.json config it was written with."""
    workdir = str(tmp_path_factory.mktemp("old") / "run")
    with command_module("train") as module:
        code, _, err = run_in_process(module, "train", [
            *ARGS, "--learner_option=conv=gemm_grad", "--learner_option=tasks_on_cpu=vmap",
            f"--workdir={workdir}"])
    assert code == 0, err
    written = {"config.json": results.read_json(os.path.join(workdir, "config.json")),
               "results.json": results.read_json(os.path.join(workdir, "results.json"))["config"]}
    as_saved_before_resolving(workdir, {"filters": 8})
    stored = results.read_json(os.path.join(workdir, "results.json"))
    assert stored["test"].pop("tasks_in_turn") is False  # vmap: on CPU as asked, else always
    results.write_json(os.path.join(workdir, "results.json"), stored)
    return workdir, written


def test_a_run_records_every_learner_option(old_run, tmp_path, conv_default_auto):
    _, written = old_run
    every = {field.name for field in dataclasses.fields(ProtoNetsOptions)}
    for name, config in written.items():
        assert set(config["learner_options"]) == every, name
        assert config["learner_options"]["conv"] == "gemm_grad"
        assert config["learner_options"]["tasks_on_cpu"] == "vmap"
        assert config["learner_options"]["bn_stats"] == "running"
    workdir = str(tmp_path / "new")
    runs.check_workdir_config(workdir, TINY)  # what a new run writes first
    saved = json.load(open(os.path.join(workdir, "config.json")))
    assert saved["learner_options"] == {**dataclasses.asdict(ProtoNetsOptions()), "filters": 8,
                                        "conv": "auto"}


def test_an_old_protonets_config_reads_as_gemm_grad_and_verifies_bit_equal(
        old_run, conv_default_auto):
    workdir, _ = old_run
    assert json.load(open(os.path.join(workdir, "config.json")))["learner_options"] == {
        "filters": 8}
    config = runs.load_config(workdir)
    assert config.learner_options["conv"] == "gemm_grad"
    assert config.learner_options["tasks_on_cpu"] == "vmap"
    assert config.learner_options["filters"] == 8
    with command_module("verify") as module:
        code, out, err = run_in_process(module, "verify", [f"--workdir={workdir}"])
    assert code == 0, out + err
    assert out.rstrip().splitlines()[-2:] == [f"  {match_detail(True)}", "MATCH"], out
    assert "bit-equal (tolerance 0" in match_detail(True)


def test_resuming_an_old_run_with_its_flags_names_the_option_whose_default_changed(
        old_run, conv_default_auto):
    workdir, _ = old_run
    before = file_bytes(workdir)
    with command_module("train") as module:
        code, out, err = run_in_process(module, "train", [*ARGS, f"--workdir={workdir}"])
    assert code == 2, out + err
    assert err.strip().splitlines() == [
        f"error: workdir {workdir!r} holds a run with a different config: learner_options conv: "
        f"the workdir ran gemm_grad, this command gives auto; learner_options tasks_on_cpu: the "
        f"workdir ran vmap, this command gives in_turn (add --learner_option=conv=gemm_grad "
        f"--learner_option=tasks_on_cpu=vmap to continue it)"]
    after = file_bytes(workdir)
    assert after == before  # nothing written
    # With the option the line names, it is the same run: nothing to refuse.
    runs.check_workdir_config(workdir, dataclasses.replace(
        TINY, learner_options={"filters": 8, "conv": "gemm_grad", "tasks_on_cpu": "vmap"}),
        create=False)


def test_a_changed_default_does_not_change_what_a_workdir_resumes_with(tmp_path, monkeypatch):
    workdir = str(tmp_path / "run")
    runs.check_workdir_config(workdir, TINY)  # written with today's defaults
    assert ProtoNetsOptions().bn_stats == "running"
    later_defaults(monkeypatch, conv="xla", bn_stats="batch")  # a release that changed two
    assert learners.learner_options("protonets", {}).conv == "xla"
    resumed = runs.load_config(workdir)
    assert resumed.learner_options["conv"] == ProtoNetsOptions().conv
    assert resumed.learner_options["bn_stats"] == "running"
    assert dataclasses.asdict(learners.learner_options("protonets", resumed.learner_options)) == (
        dataclasses.asdict(ProtoNetsOptions(filters=8)))
    runs.check_workdir_config(workdir, resumed, create=False)  # resuming it: the same run
    with pytest.raises(ValueError, match=(
            r"different config: learner_options bn_stats: the workdir ran running, this command "
            rf"gives batch; learner_options conv: the workdir ran {ProtoNetsOptions().conv}, this "
            rf"command gives xla \(add --learner_option=bn_stats=running "
            rf"--learner_option=conv={ProtoNetsOptions().conv} to continue it\)$")):
        runs.check_workdir_config(workdir, TINY, create=False)  # the same flags, later defaults


def test_other_differences_are_named_by_field():
    saved = TINY.to_json()
    assert runs.describe_differences(saved, TINY) == ""
    changed = dataclasses.replace(TINY, seed=1, learner_options={"filters": 8, "conv": "xla"})
    assert runs.describe_differences(saved, changed) == (
        " (fields: learner_options, seed); use a new workdir")
