"""Workdirs on cloud storage: every file of a run, a sweep, a report and verify goes through
``cfsl_jax.runtime.files`` (etils.epath), on a local disk and on gs:// (here a fake GCS backed by
a local folder, ``fake_gcs``: no network), and nothing turns a URL into a local folder ``gs:``."""

import importlib.util
import json
import os
import threading

import jax
import pytest

from cfsl_jax.runtime import files, plotting
from cfsl_jax.runtime.errors import UserError
from fake_gcs import fake_gcs, orbax_checkpoints_fakeable
from launch_inprocess import command_module, run_in_process
from test_cli import TINY_ARGS, assert_error


def backend_flags() -> list[str]:
    """The suite's precision and compilation cache, as a command's flags."""
    return ["--precision=highest",
            f"--compilation_cache_dir={jax.config.values['jax_compilation_cache_dir'] or ''}"]


@pytest.fixture
def gcs(tmp_path, monkeypatch):
    """A fake gs:// under tmp_path/gcs; the working folder is tmp_path/cwd (checked empty
    after the test: a URL mangled into a local path would land there)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    with fake_gcs(tmp_path / "gcs") as root:  # (conftest restores what a command sets)
        yield root
    assert os.listdir(cwd) == []


@pytest.fixture
def orbax_under_the_fake():
    """For a test that writes orbax checkpoints into the fake gs://."""
    if not orbax_checkpoints_fakeable():
        import orbax.checkpoint
        pytest.skip(f"orbax-checkpoint {orbax.checkpoint.__version__} builds its GCS "
                    "tensorstore spec where the fake cannot reach (0.12.8 is tested)")


def test_paths_are_joined_and_made_absolute_without_mangling_urls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert files.join("gs://b/sweep", "omniglot", "results.json") == \
        "gs://b/sweep/omniglot/results.json"
    assert files.absolute("gs://b/x") == "gs://b/x"  # os.path.abspath: <cwd>/gs:/b/x
    assert files.absolute("run") == os.path.join(os.path.realpath(tmp_path), "run")
    assert files.dirname("gs://b/x/results.json") == "gs://b/x"
    assert (files.is_url("gs://b"), files.is_url("/tmp/gs"), files.is_url(None)) == (
        True, False, False)


@pytest.mark.parametrize("where", ["local", "gs"])
def test_files_round_trip_and_leave_no_temporaries(where, tmp_path, gcs):
    top = str(tmp_path / "top") if where == "local" else "gs://bucket/top"
    target = files.join(top, "a", "results.json")
    files.write_atomic(target, '{"v": 1}')
    files.write_atomic(target, '{"v": 2}')  # replaces
    figure, axis = plotting.subplots(figsize=(2, 2))
    axis.plot([0, 1])
    plotting.save(figure, files.join(top, "b", "c", "image.png"))  # bytes, atomically
    files.append_text(files.join(top, "a", "metrics.jsonl"), "1\n")
    files.append_text(files.join(top, "a", "metrics.jsonl"), "2\n")
    files.makedirs(files.join(top, "a", "checkpoints", "x"))
    assert files.read_text(target) == '{"v": 2}'
    assert files.read_bytes(files.join(top, "b", "c", "image.png"))[:8] == b"\x89PNG\r\n\x1a\n"
    assert files.read_text(files.join(top, "a", "metrics.jsonl")) == "1\n2\n"
    walked = [(root, dirs, names) for root, dirs, names in files.walk(top, skip=("checkpoints",))]
    assert walked == [(top, ["a", "b"], []),
                      (files.join(top, "a"), [], ["metrics.jsonl", "results.json"]),
                      (files.join(top, "b"), ["c"], []),
                      (files.join(top, "b", "c"), [], ["image.png"])]
    assert (files.isdir(top), files.isfile(target), files.isfile(top)) == (True, True, False)
    files.remove(target)
    files.remove(target)  # already gone: nothing
    assert not files.exists(target)
    files.rmtree(top)
    assert not files.exists(top) and files.listdir(top) == []
    if where == "gs":  # it all happened in the bucket's folder
        assert os.listdir(gcs) == ["bucket"]


def test_concurrent_atomic_writes_are_always_read_whole(tmp_path):
    """Two sweep shards writing the same report file at once: a reader sees one writer's file,
    whole, at every moment, and the last one stays."""
    target = str(tmp_path / "report" / "table1.md")
    texts = {name: name * 200_000 for name in "ab"}
    files.write_atomic(target, texts["a"])
    seen, stop = set(), threading.Event()

    def write(name: str) -> None:
        for _ in range(30):
            files.write_atomic(target, texts[name])

    def read() -> None:
        while not stop.is_set():
            seen.add(files.read_text(target))

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(name,)) for name in "ab"]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    stop.set()
    reader.join()
    assert seen <= set(texts.values()) and seen
    assert files.read_text(target) in texts.values()
    assert os.listdir(tmp_path / "report") == ["table1.md"]


def test_urls_other_than_gs_or_without_gcsfs_are_refused_in_one_line():
    with pytest.raises(UserError, match=r"^--workdir=s3://b/x: s3:// is not supported"):
        files.check_url("workdir", "s3://b/x")
    files.check_url("workdir", "/tmp/local")  # nothing to check
    if importlib.util.find_spec("gcsfs") is None:
        with pytest.raises(UserError, match=r"^--workdir=gs://b/x: gs:// paths need the gcsfs "
                                            r"package, which is not installed: pip install gcsfs"):
            files.check_url("workdir", "gs://b/x")


def test_commands_refuse_what_cannot_work_on_gs(gcs):
    run_dir = "gs://bucket/s"
    with command_module("sweep") as module:
        slurm = run_in_process(module, "sweep", [f"--workdir={run_dir}", "--launcher=slurm"])
    with command_module("fluid") as module:
        fluid = run_in_process(module, "fluid", [f"--workdir={run_dir}", "--launcher=slurm"])
    with command_module("train") as module:
        data = run_in_process(module, "train", [*TINY_ARGS, f"--workdir={run_dir}",
                                                "--data_dir=gs://bucket/data"])
    assert_error(slurm, f"--workdir={run_dir}: --launcher=slurm needs a shared POSIX folder")
    assert_error(fluid, f"--workdir={run_dir}: --launcher=slurm needs a shared POSIX folder")
    assert_error(data, "--data_dir=gs://bucket/data: the dataset folder must be a local")
    assert os.listdir(gcs) == []  # nothing created


@pytest.mark.usefixtures("orbax_under_the_fake")
def test_train_verify_sweep_and_report_on_gs(gcs, tmp_path):
    """launch.train into gs://, launch.evaluate re-tests it there and launch.verify says MATCH;
    launch.sweep (local launcher) finds that run done, runs another and writes the report
    there; launch.report reads the sweep from gs:// and writes the same report elsewhere."""
    sweep_dir = "gs://bucket/sweep"
    run_dir = f"{sweep_dir}/synthetic/protonets/B2/seed0"  # the sweep's layout
    backend = backend_flags()
    budget = [arg for arg in TINY_ARGS if not arg.startswith("--task")] + backend
    with command_module("train") as module:
        trained = run_in_process(module, "train", [*budget, "--task=B2", "--learner=protonets",
                                                   f"--workdir={run_dir}"])
        on_disk = run_in_process(module, "train", [*budget, "--task=B2", "--learner=protonets",
                                                   f"--workdir={tmp_path / 'local'}"])
    assert trained[0] == 0 and on_disk[0] == 0, trained[2][-3000:] + on_disk[2][-3000:]
    local = os.path.join(gcs, "bucket", "sweep", "synthetic", "protonets", "B2", "seed0")
    result = json.loads(open(os.path.join(local, "results.json")).read())
    same = json.loads((tmp_path / "local" / "results.json").read_text())
    assert result["test"]["num_tasks"] == 7
    assert result["task_fingerprint"] == same["task_fingerprint"]  # gs:// changes no number
    assert (result["test"]["acc_mean"], result["test"]["ce_mean"]) == (
        same["test"]["acc_mean"], same["test"]["ce_mean"])
    assert result["best_epochs"] == same["best_epochs"]
    assert {"config.json", "results.csv", "metrics.jsonl", "val_history.json", "flags.txt",
            "checkpoints"} <= set(os.listdir(local))
    assert sorted(os.listdir(os.path.join(local, "checkpoints", "best"))) == ["0", "1"]
    assert f"--workdir={run_dir}" in open(os.path.join(local, "flags.txt")).read()
    with command_module("evaluate") as module:
        evaluated = run_in_process(module, "evaluate", [f"--workdir={run_dir}", *backend])
    assert evaluated[0] == 0, evaluated[2][-3000:]
    rows = open(os.path.join(local, "results.csv")).read().splitlines()
    # header, the run, its re-test (appended, marked in the last column)
    assert len(rows) == 3 and rows[2] == rows[1][:-1] + "1" and rows[1].endswith(",0")
    with command_module("verify") as module:
        verified = run_in_process(module, "verify", [f"--workdir={run_dir}", *backend])
    assert verified[0] == 0 and verified[1].strip().splitlines()[-1] == "MATCH", verified
    with command_module("sweep") as module:
        swept = run_in_process(module, "sweep", [
            *budget, "--learners=protonets,init_tune", "--learner_option=init_tune:inner_steps=1",
            "--cells=B2", "--seeds=0", "--workers=0", f"--workdir={sweep_dir}"])
    assert swept[0] == 0, swept[2][-3000:]
    assert "1 finished, 1 skipped" in swept[1]  # protonets was done before: not run again
    assert os.path.isfile(os.path.join(gcs, "bucket", "sweep", "synthetic", "init_tune", "B2",
                                       "seed0", "results.json"))
    report_dir = os.path.join(gcs, "bucket", "sweep", "report")
    assert {"table1_synthetic.md", "table1_synthetic_acc.csv", "figure3_synthetic.png"} <= set(
        os.listdir(report_dir))
    with command_module("report") as module:
        reported = run_in_process(module, "report", [f"--sweep_dir={sweep_dir}",
                                                     "--out_dir=gs://bucket/report2"])
    assert reported[0] == 0, reported[2][-3000:]
    table = open(os.path.join(gcs, "bucket", "report2", "table1_synthetic.md")).read()
    assert table == open(os.path.join(report_dir, "table1_synthetic.md")).read()
    assert f"{100 * result['test']['acc_mean']:.2f}" in table
    assert not [name for _, _, names in os.walk(gcs) for name in names if name.endswith(".tmp")]


@pytest.mark.usefixtures("orbax_under_the_fake")
def test_fluid_on_gs(gcs):
    """launch.fluid (local) writes its results, table and plot into gs:// and resumes there."""
    workdir = "gs://bucket/fluid"
    args = ["--preset=small", "--method=ncm", "--stream_classes=6", "--stream_length=90",
            "--head_threshold=15", "--min_pretrain_samples=5", "--pretrain_steps=3",
            "--filters=8", "--dataset_option=num_classes=20",
            "--dataset_option=samples_per_class=30", "--dataset_option=image_size=16",
            f"--workdir={workdir}", *backend_flags()]
    with command_module("fluid") as module:
        first = run_in_process(module, "fluid", [*args, "--num_streams=1"])
        again = run_in_process(module, "fluid", [*args, "--num_streams=1"])
    assert first[0] == 0, first[2][-3000:]
    local = os.path.join(gcs, "bucket", "fluid")
    assert {"results.json", "results.txt", "rolling_accuracy.png", "flags.txt"} <= set(
        os.listdir(local))
    results = json.loads(open(os.path.join(local, "results.json")).read())
    assert results["complete"] and len(results["streams"]) == 1
    assert again[0] == 0 and "every stream already done" in again[1], again
    assert open(os.path.join(local, "results.txt")).read() in again[1]
