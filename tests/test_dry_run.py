"""--dry_run of launch.fluid and of --launcher=slurm: what would run, nothing created."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from cfsl_jax.experiments import slurm, slurm_preview
from cfsl_jax.fluid import experiment
from cfsl_jax.fluid.config import preset
from test_cli import run_cases


def test_the_slurm_preview_is_the_array_script_of_the_items_not_done(tmp_path):
    workdir = str(tmp_path / "fluid")
    config = preset("small", num_streams=3)
    options = slurm.SlurmOptions(gpus_per_job=1, timeout_min=30, setup=("module load cuda",),
                                 options=(("constraint", "a100"),))
    text = slurm_preview.preview(slurm.fluid_work(config, workdir), workdir, options, queued={})
    assert "would submit 3 of 3 as one job array (3 new)" in text
    for line in ("#SBATCH --array=0-2%3", "#SBATCH --gpus-per-node=1", "#SBATCH --time=30",
                 "#SBATCH --constraint=a100", "module load cuda",
                 f"#SBATCH --output={workdir}/slurm/%A_%a_0_log.out"):
        assert line in text.splitlines(), (line, text)
    assert os.listdir(tmp_path) == []  # nothing created
    # stream 1 done: an array of the other two
    os.makedirs(os.path.dirname(experiment.stream_file(workdir, 1)))
    with open(experiment.stream_file(workdir, 1), "w") as f:
        f.write("{}")
    text = slurm_preview.preview(slurm.fluid_work(config, workdir), workdir, options, queued={})
    assert "would submit 2 of 3 as one job array (1 done, 2 new)" in text
    assert "#SBATCH --array=0-1%2" in text.splitlines()
    assert sorted(os.listdir(workdir)) == ["streams"]


def test_fluid_dry_run_prints_the_config_and_what_would_run_and_creates_nothing(tmp_path):
    workdir = str(tmp_path / "f")
    (code, out, err), = run_cases("fluid", [[f"--workdir={workdir}", "--preset=small",
                                             "--method=ncm,exemplar_tuning", "--stream_length=600",
                                             "--dry_run"]])
    assert code == 0, err
    config = json.loads(out[out.index("{"):out.rindex("}") + 1])
    assert config["methods"] == ["ncm", "exemplar_tuning"]
    assert config["stream"]["length"] == 600 and config["pretrain_steps"] == 200
    assert ("would run 1 of 1 test stream(s) of 600 samples (40 classes), each pretrained for "
            "200 steps, x 2 method(s): ncm, exemplar_tuning") in out
    assert not os.path.exists(workdir) and os.listdir(tmp_path) == []


@pytest.mark.skipif(shutil.which("sbatch") is None or shutil.which("srun") is None,
                    reason="needs SLURM's commands on PATH (--launcher=slurm checks them)")
def test_sweep_dry_run_with_slurm_shows_the_sbatch_script_and_submits_nothing(tmp_path):
    workdir = str(tmp_path / "sweep")
    (code, out, err), = run_cases("sweep", [[f"--workdir={workdir}", "--learners=protonets",
                                             "--cells=B3", "--seeds=0,1", "--launcher=slurm",
                                             "--slurm_gpus_per_job=1", "--dry_run"]])
    assert code == 0, err
    assert "would submit 2 of 2 as one job array (2 new)" in out
    assert "#SBATCH --array=0-1%2" in out.splitlines() and "#SBATCH --gpus-per-node=1" in out
    assert not os.path.exists(workdir)
