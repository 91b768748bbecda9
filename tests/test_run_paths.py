"""A run records where its data is as absolute paths and which dataset variant it read, so it
verifies from any folder; a run recorded with relative paths still resumes and verifies."""

import json
import os

import pytest
from absl import flags

from cfsl_jax.experiments import verify
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training import runs, train
from launch_inprocess import command_module
from test_cli import write_tiny_workdir


def test_a_run_records_its_data_folders_as_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with command_module("train") as module:
        flags.FLAGS(["cfsl-train", "--dataset=omniglot", "--manual_dir=../zips",
                     "--data_dir=~/tfds", "--workdir=w"])
        config = module.config_from_flags()
    assert config.manual_dir == os.path.join(os.path.dirname(os.path.realpath(tmp_path)), "zips")
    assert config.data_dir == os.path.join(os.path.abspath(os.path.expanduser("~")), "tfds")


def test_results_name_the_variant_a_plain_omniglot_resolved_to(omniglot_splits):
    info = omniglot_splits["test"].info
    assert (info.dataset, info.variant) == ("omniglot", "omniglot/small_nearest")
    assert info.source.startswith("omniglot/small_nearest prepared in ")


def test_a_run_recorded_with_relative_paths_resumes_and_verifies_with_folders_given(tmp_path,
                                                                                   monkeypatch):
    workdir = str(tmp_path / "old")
    write_tiny_workdir(workdir)
    path = os.path.join(workdir, "config.json")
    with open(path) as f:
        saved = json.load(f)
    saved.update(manual_dir="../shared/data/omniglot", data_dir="data")  # as an older run did
    with open(path, "w") as f:
        json.dump(saved, f)
    os.remove(os.path.join(workdir, "checksums.json"))  # an older run: written before checksums
    with open(os.path.join(workdir, "results.json"), "w") as f:
        json.dump({"splits": {}}, f)
    now = runs.TrainConfig(**{**saved, "manual_dir": "/abs/zips", "data_dir": "/abs/data"})
    assert runs.config_differences(saved, now) == []  # where the data is is not the run
    train.check_workdir_config(workdir, now, create=False)  # the same command resumes it
    monkeypatch.chdir(tmp_path)  # a folder where neither recorded path exists
    for given, missing in (({}, "manual_dir='../shared/data/omniglot'"),
                           ({"manual_dir": str(tmp_path / "zips")}, "data_dir='data'")):
        with pytest.raises(UserError) as refused:  # from a folder where they are not
            verify.load(workdir, **given)
        assert f"{workdir}/config.json records {missing}, relative to the folder the run " \
               f"started in" in str(refused.value)
        assert str(refused.value).endswith(f"or give --{missing.split('=')[0]}=FOLDER")
    config, recorded = verify.load(workdir, manual_dir=str(tmp_path / "zips"),
                                   data_dir=str(tmp_path / "data"))
    assert config.manual_dir == str(tmp_path / "zips") and config.data_dir == str(tmp_path / "data")
    assert recorded == {"splits": {}}
    assert runs.config_differences(saved, runs.TrainConfig(**{**saved, "seed": 5})) == ["seed"]
