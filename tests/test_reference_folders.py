"""An exported reference run's folder names its setting where it is not the default: an
--as_published run and a default one of one learner, cell and seed each keep their own files and
row; the committed folders keep their names; a run never lands in a folder of another config."""

import csv
import json
import os

import pytest

from cfsl_jax.experiments import reference, reference_folders, sweep_plan
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training import as_published
from cfsl_jax.training import results as results_io
from cfsl_jax.training.config import TrainConfig, from_json
from conftest import TINY_SWEEP

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED = os.path.join(REPO, "docs", "reference")
DEFAULT = TrainConfig(**TINY_SWEEP, learner="protonets", task="B2", seed=0)
FEB = as_published.apply(DEFAULT, "feb2020")


def partial_run(sweep_dir: str, config: TrainConfig) -> str:
    """A run folder as a sweep leaves it once the run has started (its config.json)."""
    workdir = sweep_plan.run_dir(sweep_dir, config)
    os.makedirs(workdir)
    results_io.write_json(os.path.join(workdir, "config.json"), config.to_json())
    return workdir


def test_every_committed_run_folder_is_the_one_its_config_names():
    with open(os.path.join(COMMITTED, "results.csv")) as f:
        rows = list(csv.DictReader(f))
    assert rows
    for row in rows:
        with open(os.path.join(COMMITTED, row["run"], "config.json")) as f:
            config = from_json(json.load(f))
        assert reference_folders.run_folder(config, row["budget"]) == row["run"]
        assert reference_folders.setting_label(config) == ""


def test_a_preset_or_changed_option_names_its_folder(monkeypatch):
    plain = TrainConfig(learner="protonets", task="C3", dataset="synthetic", seed=1)
    base = "runs/8x50x8/synthetic/protonets/C3/seed1"
    assert reference_folders.run_folder(plain, "8x50x8") == base
    for preset in ("feb2020", "apr2020"):
        assert reference_folders.run_folder(as_published.apply(plain, preset), "8x50x8") == \
            f"{base}-as_published={preset}"
    maml = TrainConfig(learner="maml_low", task="B3", learner_options={"inner_steps": 1})
    assert reference_folders.setting_label(maml) == "inner_steps=1"
    # options that change only the rounding keep the default setting's folder
    rounding = TrainConfig(learner="protonets", task="B3", learner_options={"conv": "gemm_grad"})
    assert reference_folders.setting_label(rounding) == ""
    # the tiny sweep's spec overrides and filters; a preset adds to them
    assert reference_folders.setting_label(DEFAULT) == "filters=8-kt=2-nc=3"
    assert reference_folders.setting_label(FEB) == "as_published=feb2020-filters=8-kt=2-nc=3"
    monkeypatch.setattr(reference_folders, "LABEL_LIMIT", 12)  # longer: a digest stands for them
    label = reference_folders.setting_label(FEB)
    assert label.startswith("as_published=feb2020-options-") and len(label) == 41
    assert label != reference_folders.setting_label(as_published.apply(
        TrainConfig(**{**TINY_SWEEP, "learner_options": {"filters": 16}}, learner="protonets",
                    task="B2"), "feb2020"))


def test_a_preset_run_and_a_default_run_at_one_seed_keep_their_own_rows_and_files(tmp_path):
    sweep_dir, out = str(tmp_path / "sweep"), str(tmp_path / "out")
    default = partial_run(os.path.join(sweep_dir, "default"), DEFAULT)
    feb = partial_run(os.path.join(sweep_dir, "feb2020"), FEB)
    rows = reference.export(sweep_dir, out)
    assert len(rows) == 2 and len({row["run"] for row in rows}) == 2
    for workdir, row in zip((default, feb), sorted(rows, key=lambda r: r["preset"] != "none")):
        with open(os.path.join(workdir, "config.json")) as a, \
                open(os.path.join(out, row["run"], "config.json")) as b:
            assert a.read() == b.read()
    assert {row["preset"] for row in rows} == {"none", "feb2020"}
    # exported again (each resumes its own folder): the same two rows
    assert reference.export(sweep_dir, out) == rows


def test_a_folder_that_holds_another_config_is_never_overwritten(tmp_path):
    out = str(tmp_path / "out")
    reference.export(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        partial_run(str(tmp_path / "first"), DEFAULT))))), out)
    before = open(os.path.join(out, "results.csv")).read()
    other = TrainConfig(**{**TINY_SWEEP, "eval_seed": 7}, learner="protonets", task="B2", seed=0)
    second = str(tmp_path / "second")
    partial_run(second, other)
    with pytest.raises(UserError) as error:
        reference.export(second, out)
    message = str(error.value)
    folder = os.path.join(out, reference_folders.run_folder(DEFAULT,
                                                            reference.budget_name(DEFAULT)))
    assert message.startswith(f"{folder} holds a run with a different config (fields: "
                              f"eval_seed) than ") and "\n" not in message
    assert open(os.path.join(out, "results.csv")).read() == before
    # two runs of one sweep folder bound for one folder: refused before anything is written
    both = str(tmp_path / "both")
    partial_run(os.path.join(both, "a"), DEFAULT)
    partial_run(os.path.join(both, "b"), other)
    with pytest.raises(UserError, match="would both be exported to"):
        reference.export(both, str(tmp_path / "fresh"))
    assert not os.path.exists(tmp_path / "fresh" / "results.csv")
