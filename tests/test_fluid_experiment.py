"""FLUID end to end: the CLI on a tiny synthetic stream, pretraining data, Omniglot alphabets."""

import dataclasses
import json
import os
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from cfsl_jax import data, fluid
from cfsl_jax.fluid.experiment import alphabet_pretrain_mask
from cfsl_jax.runtime.errors import UserError
from conftest import unoptimised_env
from launch_inprocess import command_module, run_in_process
from test_cli import assert_error

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cli_writes_results_table_and_plot_and_extends_a_finished_run(tmp_path):
    workdir = tmp_path / "fluid"
    command = [sys.executable, "-m", "launch.fluid", "--preset=small", f"--workdir={workdir}",
               "--method=ncm,exemplar_tuning", "--stream_classes=6", "--stream_length=90",
               "--head_threshold=15", "--min_pretrain_samples=5",
               "--pretrain_steps=3", "--filters=8",
               "--dataset_option=num_classes=20", "--dataset_option=samples_per_class=30",
               "--dataset_option=image_size=16",
               "--method_option=exemplar_tuning:learning_rate=0.002"]
    env = unoptimised_env(JAX_PLATFORMS="cpu")  # files, counts and refusals: any level

    def fluid(*extra):
        return subprocess.run(command + list(extra), cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=400)

    done = fluid("--num_streams=1")
    assert done.returncode == 0, done.stderr[-3000:]
    first = json.loads((workdir / "results.json").read_text())
    assert first["complete"] and len(first["streams"]) == 1
    # A second stream into the same workdir: stream 0 is kept as stored, not run again.
    done = fluid("--num_streams=2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "exemplar_tuning" in done.stdout and "AUROC" in done.stdout
    assert "Table 3 (l)" in done.stdout and "58.16" in done.stdout  # the paper's row beside ours
    results = json.loads((workdir / "results.json").read_text())
    assert len(results["streams"]) == 2 and results["complete"]
    assert results["streams"][0] == first["streams"][0]  # its seconds included
    # A different setting into the same workdir, or fewer streams than it holds: one line.
    for extra, words in [(["--num_streams=2", "--seed=1"], "different configuration"),
                         (["--num_streams=1"], "holds 2")]:
        refused = fluid(*extra)
        assert refused.returncode == 2 and words in refused.stderr
        assert "Traceback" not in refused.stderr
    stats = results["streams"][0]["stream"]
    assert stats["length"] == 90 and stats["classes"] == 6 and stats["pretrain_classes"] == 2
    assert results["config"]["method_options"] == {"exemplar_tuning": {"learning_rate": 0.002}}
    for stream in results["streams"]:
        for name in ("ncm", "exemplar_tuning"):
            result = stream["methods"][name]
            correct = result["metrics"]["accuracy"] * stats["length"]  # a count of samples
            assert correct == pytest.approx(round(correct), abs=1e-9) and correct >= 1
            macs = result["macs"]
            assert macs["total"] == macs["inference"] + macs["updates"] + macs["training"]
            assert macs["total_uncached"] >= macs["total"]
        assert stream["methods"]["ncm"]["train_steps"] == 0
        # the paper's 4 epochs every 5,000 of 90,000 samples, scaled: every 5 of 90 samples
        tuning = stream["methods"]["exemplar_tuning"]
        assert tuning["schedule"] == "4 epochs every 5 samples, batch 256"
        assert tuning["train_steps"] == 17 * 4
    accuracies = [s["methods"]["ncm"]["metrics"]["accuracy"] for s in results["streams"]]
    summary = results["summary"]["ncm"]["metrics.accuracy"]
    assert summary["mean"] == np.mean(accuracies)
    assert summary["std"] == np.std(accuracies, ddof=1)
    assert (workdir / "rolling_accuracy.png").stat().st_size > 1000
    assert "ncm" in (workdir / "results.txt").read_text()


def test_update_strategy_study_writes_its_grid_and_plot(tmp_path):
    workdir = tmp_path / "study"
    command = [sys.executable, "-m", "launch.fluid", "--preset=small", f"--workdir={workdir}",
               "--study=update_strategy", "--study_frequencies=30000,45000",
               "--study_epochs=1,2", "--stream_classes=6", "--stream_length=90",
               "--head_threshold=15", "--min_pretrain_samples=5", "--pretrain_steps=3",
               "--filters=8", "--dataset_option=num_classes=20",
               "--dataset_option=samples_per_class=30", "--dataset_option=image_size=16"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    cells = json.loads((workdir / "update_strategy.json").read_text())["cells"]
    steps = {(c["update_every"], c["epochs_per_update"]): c["train_steps"] for c in cells}
    # 90 samples: U=30,000 -> every 30 (phases after 30, 60), U=45,000 -> every 45 (after 45)
    assert steps == {(30000, 1): 2, (30000, 2): 4, (45000, 1): 1, (45000, 2): 2}
    gmacs = {(c["update_every"], c["epochs_per_update"]): c["gmacs"] for c in cells}
    assert gmacs[(30000, 2)] > gmacs[(30000, 1)] > gmacs[(45000, 1)]
    assert (workdir / "update_strategy.png").stat().st_size > 1000
    # stopped by SIGTERM once its first cell is written, the same command runs only the rest,
    # and gives the uninterrupted study's numbers (the whole study was written only at its end)
    stopped = tmp_path / "stopped"
    again = [*(f"--workdir={stopped}" if a.startswith("--workdir=") else a for a in command)]
    child = subprocess.Popen(again, cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        for line in child.stdout:
            if line.startswith("[FLUID study] U=30000 E=1: "):
                child.send_signal(signal.SIGTERM)
                break
        child.communicate(timeout=120)
    finally:
        child.kill()
    kept = json.loads((stopped / "update_strategy.json").read_text())
    assert kept["complete"] is False and 1 <= len(kept["cells"]) < 4
    done = subprocess.run(again, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"cell(s) done before, kept from {stopped}/update_strategy.json" in done.stdout
    resumed = json.loads((stopped / "update_strategy.json").read_text())
    assert resumed["complete"] is True
    assert ([{k: v for k, v in c.items() if k != "seconds"} for c in resumed["cells"]] ==
            [{k: v for k, v in c.items() if k != "seconds"} for c in cells])


def test_pretrain_split_holds_only_the_pretraining_data():
    split = data.load_split("synthetic", "train", num_classes=20, samples_per_class=30,
                            image_size=16)
    config = fluid.StreamConfig(num_classes=8, length=100, min_pretrain_samples=6)
    stream, classes = fluid.make_stream(jax.random.key(0), split.class_table, split.class_sizes,
                                        config)
    pretraining = fluid.pretrain_split(split, classes)
    table = np.asarray(pretraining.class_table)
    assert table.shape[0] == 4 and pretraining.info.num_classes == 4
    assert pretraining.images is split.images
    np.testing.assert_array_equal(pretraining.class_sizes, (table >= 0).sum(1))
    assert not set(table[table >= 0]) & set(np.asarray(stream.sample_idx))
    for k in range(4):
        row = np.asarray(split.class_table)[classes.split_class[k]]
        assert set(table[k][table[k] >= 0]) <= set(row)
        assert pretraining.info.class_names[k] == split.info.class_names[classes.split_class[k]]


def test_omniglot_stream_has_alphabet_disjoint_pretrain_and_novel_classes(omniglot_train):
    names = omniglot_train.info.class_names
    mask = alphabet_pretrain_mask(names, 0.5)
    config = fluid.StreamConfig(num_classes=40, length=400, head_threshold=10,
                                min_pretrain_samples=5)
    stream, classes = fluid.make_stream(jax.random.key(0), omniglot_train.class_table,
                                        omniglot_train.class_sizes, config, pretrain_mask=mask)
    alphabet = np.array([n.split("/")[0] for n in names])
    pretrain_alphabets = set(alphabet[classes.split_class[:20]])
    novel_alphabets = set(alphabet[classes.split_class[20:]])
    assert pretrain_alphabets and novel_alphabets and not pretrain_alphabets & novel_alphabets
    assert classes.count.max() <= 20 and classes.count[:20].max() <= 15  # 20 drawings a class
    assert np.asarray(stream.is_head_class).any()


def test_pretraining_on_a_wider_set_keeps_the_stream_classes_head():
    split = data.load_split("synthetic", "train", num_classes=20, samples_per_class=30,
                            image_size=16)
    wide = fluid.StreamConfig(num_classes=6, length=60, min_pretrain_samples=6,
                              pretrain_classes=8)  # P = 3, + 5 pretraining-only classes
    stream, classes = fluid.make_stream(jax.random.key(0), split.class_table, split.class_sizes,
                                        wide)
    pretraining = fluid.pretrain_split(split, classes, extra=True)
    table = np.asarray(pretraining.class_table)
    assert table.shape[0] == pretraining.info.num_classes == 8
    assert pretraining.info.class_names[3:] == tuple(split.info.class_names[c]
                                                     for c in classes.extra_class)
    assert not set(table[table >= 0]) & set(np.asarray(stream.sample_idx))
    assert fluid.pretrain_split(split, classes).class_table.shape[0] == 3  # the default
    method = fluid.get_method("ncm", 6, (16, 16, 1), filters=8)
    init = method.init_params(jax.random.key(1), np.zeros((1, 16, 16, 1), np.float32))
    params = fluid.pretrain_model(method, init, split, classes, jax.random.key(2), steps=2)
    params = fluid.prepare_params(method, params, split, classes, jax.random.key(3))
    # the head keeps the stream's 3 pretrain classes; the class statistics are theirs only
    assert params["head"]["kernel"].shape == (8, 3) and params["head"]["bias"].shape == (3,)
    np.testing.assert_array_equal(params["known"].counts, (classes.pretrain_table >= 0).sum(1))


def test_a_real_datasets_options_reach_it_and_synthetic_sizes_are_refused(tmp_path,
                                                                         omniglot_dir):
    # The preset's synthetic size is left out for Omniglot; its own options go to its builder,
    # which checks them before preparing anything.
    config = fluid.experiment.preset(
        "small", dataset="omniglot", data_dir=str(tmp_path / "data"), manual_dir=omniglot_dir,
        dataset_options={**fluid.experiment.PRESETS["small"]["dataset_options"],
                         "resize": "bogus"})
    with pytest.raises(UserError, match="resize='bogus' for dataset 'omniglot'"):
        fluid.experiment.load(config)
    with command_module("fluid") as module:
        code, _, err = run_in_process(module, "fluid", [
            f"--workdir={tmp_path / 'w'}", "--preset=small", "--dataset=omniglot",
            f"--manual_dir={omniglot_dir}", "--dataset_option=num_classes=50"])
    assert_error((code, "", err), "--dataset_option=num_classes=50: num_classes sizes the "
                                  "synthetic set only; --dataset=omniglot has its own classes")
    with command_module("fluid") as module:
        code, _, err = run_in_process(module, "fluid", [
            f"--workdir={tmp_path / 'w'}", "--preset=small", "--dataset=omniglot",
            f"--manual_dir={omniglot_dir}", "--dataset_option=resize=bogus"])
    assert_error((code, "", err), "resize='bogus' for dataset 'omniglot'; valid: ")
    assert os.listdir(tmp_path) == []  # refused before the workdir is made


def test_the_streams_progress_line_says_it_in_words():
    summary = {"length": 1200, "classes": 40, "pretrain_classes": 10, "head_classes": 12,
               "largest_class": 150, "smallest_class": 1, "pretrain_samples": 400,
               "pretraining_only_classes": 3, "pretraining_only_samples": 90,
               "samples": {"pretrain_head": 300, "pretrain_tail": 20, "novel_head": 700,
                           "novel_tail": 180}}
    assert fluid.experiment.summary_line(summary) == (
        "1,200 samples of 40 classes (10 pretrain, 12 head; 1 to 150 samples a class); "
        "samples pretrain-head 300, pretrain-tail 20, novel-head 700, novel-tail 180; "
        "pretraining: 400 samples, +3 classes outside the stream")


def test_the_study_streams_the_experiments_stream_on_omniglot(omniglot_dir, data_dir, tmp_path,
                                                               monkeypatch):
    """The update-strategy study runs on the experiment's stream 0: on Omniglot, pretrain and
    novel classes of disjoint alphabets (the study once drew its stream without the mask)."""
    from cfsl_jax.fluid import experiment, study
    config = experiment.preset(
        "small", dataset="omniglot", data_dir=data_dir, manual_dir=omniglot_dir,
        methods=("finetune",), pretrain_steps=0, filters=8,
        stream=fluid.StreamConfig(num_classes=40, length=400, pretrain_fraction=0.5,
                                  head_threshold=10, min_pretrain_samples=5))
    streams = {}

    class Captured(Exception):
        pass

    def capture(where):
        def run_stream(method, params, stream, *args, **kwargs):
            streams[where] = stream
            raise Captured
        return run_stream

    monkeypatch.setattr(study, "run_stream", capture("study"))
    with pytest.raises(Captured):
        study.run_update_strategy(config, str(tmp_path / "study"), "finetune", [5000], [1])
    monkeypatch.setattr(experiment, "run_stream", capture("experiment"))
    split = experiment.load(config)
    with pytest.raises(Captured):
        experiment.run_methods(config, split, experiment.build_methods(config, split), 0)
    for got, want in zip(streams["study"], streams["experiment"]):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    alphabet = np.array([n.split("/")[0] for n in split.info.class_names])
    table = np.asarray(split.class_table)
    class_of = {int(i): c for c, row in enumerate(table) for i in row if i >= 0}
    stream = streams["study"]
    sample_class = np.array([class_of[int(i)] for i in np.asarray(stream.sample_idx)])
    pretrain = np.asarray(stream.is_pretrain_class)
    pretrain_alphabets = set(alphabet[sample_class[pretrain]])
    novel_alphabets = set(alphabet[sample_class[~pretrain]])
    assert pretrain_alphabets and novel_alphabets and not pretrain_alphabets & novel_alphabets


def test_a_run_shows_its_eta_and_a_stop_says_what_it_keeps_and_loses(tmp_path, monkeypatch,
                                                                     capsys):
    import dataclasses
    import signal

    from cfsl_jax.runtime import stops
    config = fluid.experiment.preset(
        "small", methods=("ncm", "imprinting", "exemplar_tuning"), num_streams=2,
        stream=dataclasses.replace(fluid.experiment.SMALL_STREAM, num_classes=6, length=90,
                                   head_threshold=15, min_pretrain_samples=5,
                                   pretrain_classes=6),
        pretrain_steps=3, filters=8,
        dataset_options={"num_classes": 20, "samples_per_class": 30, "image_size": 16})
    run_stream = fluid.experiment.run_stream
    calls = []

    def stopped_at_the_third_method_of_stream_1(method, *args, **kwargs):
        calls.append(method)
        if len(calls) == 6:
            raise stops.StopRequested(signal.SIGTERM)
        return run_stream(method, *args, **kwargs)

    monkeypatch.setattr(fluid.experiment, "run_stream", stopped_at_the_third_method_of_stream_1)
    workdir = str(tmp_path / "fluid")
    with pytest.raises(stops.StopRequested) as stop:
        fluid.experiment.run_experiment(config, workdir)
    path = os.path.join(workdir, "results.json")
    assert str(stop.value).startswith(
        f"interrupted by SIGTERM during test stream 1 of 2 (method 3 of 3, exemplar_tuning); "
        f"kept: 1 finished stream(s) in {path}; lost: the 2 method(s) already run on stream 1 "
        f"(ncm, imprinting; ")
    assert str(stop.value).endswith("of work), as a stream is saved whole: re-run the same "
                                    "command to resume at stream 1")
    assert stop.value.exit_status == 143
    assert len(json.loads(open(path).read())["streams"]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines()
             if line.startswith("[FLUID] ") and "method runs" in line]
    assert [line.split(" (")[0] for line in lines] == [
        f"[FLUID] {k}/6 method runs done" for k in range(1, 6)]
    assert lines[0].startswith("[FLUID] 1/6 method runs done (test stream 0: ncm in ")
    assert all(", ETA " in line and line.endswith("(the mean method run so far, pretraining "
                                                  "included)") for line in lines)  # the run's


def test_a_stream_the_split_cannot_give_is_refused_in_one_line(tmp_path):
    """A stream longer than its classes can give (--max_per_class), or pretrain classes that
    would keep fewer than --min_pretrain_samples out of it, is the user's setting: one
    ``error:`` line naming the numbers and exit status 2, not a traceback (it was a ValueError
    from ``make_stream`` inside the run, exit status 1)."""
    tiny = ["--preset=small", "--method=ncm", "--stream_classes=6", "--stream_length=90",
            "--head_threshold=15", "--pretrain_steps=1", "--filters=8", "--num_streams=1",
            "--dataset_option=num_classes=40", "--dataset_option=samples_per_class=30",
            "--dataset_option=image_size=16"]
    with command_module("fluid") as module:
        capped = run_in_process(module, "fluid", [*tiny, f"--workdir={tmp_path / 'a'}",
                                                  "--max_per_class=2"])
        kept = run_in_process(module, "fluid", [*tiny, f"--workdir={tmp_path / 'b'}",
                                                "--min_pretrain_samples=30"])
    assert_error(capped, "length=90 must be between the number of classes (6) and the samples "
                         "available to the stream (12)")
    assert_error(kept, "has 30 samples: too few for the stream with min_pretrain_samples=30")
    for workdir in ("a", "b"):  # nothing half-written
        assert not (tmp_path / workdir / "results.json").exists()


@pytest.mark.parametrize("stream_config", [
    # no pretrain class (P = 0): the pretraining set is the 3 pretraining-only classes
    dict(num_classes=4, length=40, pretrain_fraction=0.0, pretrain_classes=3),
    # P = 2 pretrain classes, every image of them in the stream (min_pretrain_samples=0,
    # 4 classes x 10 images = the stream's 40): the pretraining set is the 2 other classes
    dict(num_classes=4, length=40, pretrain_fraction=0.5, min_pretrain_samples=0,
         pretrain_classes=4)])
def test_pretraining_uses_the_pretraining_only_classes_when_the_stream_keeps_none(
        stream_config):
    """The pretraining set is the stream's pretrain classes' kept-out images AND the
    pretraining-only classes (docs/fidelity.md, pretraining data). When the first part is
    empty the backbone is still pretrained on the second (it stayed random, with "no
    pretraining data (no pretrain classes)" said, though results.json counts their images),
    and a pretrain class without a pretraining image is not "known" (no statistics)."""
    split = data.load_split("synthetic", "train", num_classes=12, samples_per_class=10,
                            image_size=16)
    config = fluid.StreamConfig(head_threshold=5, **stream_config)
    stream, classes = fluid.make_stream(jax.random.key(0), split.class_table, split.class_sizes,
                                        config)
    assert (classes.pretrain_table >= 0).sum() == 0 and (classes.extra_table >= 0).sum() > 0
    method = fluid.get_method("ncm", 4, (16, 16, 1), filters=8)
    init = method.init_params(jax.random.key(1), np.zeros((1, 16, 16, 1), np.float32))
    params = fluid.pretrain_model(method, init, split, classes, jax.random.key(2), steps=2)
    changed = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))),
                           params["embed"], init["embed"])
    assert any(jax.tree.leaves(changed))  # pretrained, not the random init
    p = config.num_pretrain
    assert params["head"]["kernel"].shape[-1] == p and params["head"]["bias"].shape == (p,)
    params = fluid.prepare_params(method, params, split, classes, jax.random.key(3))
    state = method.init(params, jax.random.key(4))
    assert not np.asarray(state.memory.known).any()  # no pretrain class has an image to know
    # EWC has no Fisher to anchor with: refused in one line (it failed with KeyError 'fisher')
    ewc = fluid.get_method("ewc", 4, (16, 16, 1), filters=8)
    with pytest.raises(UserError, match=rf"method ewc anchors .* this stream has none "
                                        rf"\({config.num_pretrain} pretrain classes, 0 of"):
        fluid.prepare_params(ewc, params, split, classes, jax.random.key(3))
    record = fluid.run_stream(method, params, stream, split, jax.random.key(5),
                              count_macs=False)
    assert record.prediction[0] == -1  # nothing known before the first sample


def test_an_unknown_split_is_refused_in_one_line(tmp_path):
    """--split names one of the dataset's class splits; another name was accepted by the flags
    and failed in the run with a ValueError traceback (exit status 1) after the workdir was
    made."""
    with command_module("fluid") as module:
        outcome = run_in_process(module, "fluid", ["--preset=small", "--split=tarin",
                                                   f"--workdir={tmp_path / 'w'}"])
    assert_error(outcome, "--split=tarin")
    assert "train" in outcome[2] and "val" in outcome[2] and "test" in outcome[2]
    assert os.listdir(tmp_path) == []  # refused before the workdir is made


@pytest.mark.parametrize("method, what", [
    ("exemplar_tuning", "NaN"),  # its NaN scores: metrics.auroc raised a ValueError traceback
    ("imprinting", "weights at the stream's end are not finite")])  # reported as a number
def test_a_method_whose_training_diverges_is_refused_in_one_line(tmp_path, method, what):
    """A learning rate that makes a method's training diverge: a number that cannot be trusted
    is refused -- in one ``error:`` line naming the method and the stream, exit status 2, no
    results.json. Exemplar tuning's scores turn NaN; weight imprinting's do not (its detector
    measures to the class means) while every prediction became class 0, and the run printed an
    accuracy."""
    with command_module("fluid") as module:
        outcome = run_in_process(module, "fluid", [
            "--preset=small", f"--method={method}", "--stream_classes=6",
            "--stream_length=90", "--head_threshold=15", "--min_pretrain_samples=5",
            "--pretrain_steps=1", "--filters=8", "--num_streams=1",
            "--dataset_option=num_classes=40", "--dataset_option=samples_per_class=30",
            "--dataset_option=image_size=16", f"--workdir={tmp_path / 'w'}",
            f"--method_option={method}:learning_rate=1e30"])
    assert_error(outcome, f"{method} on test stream 0: ")
    assert what in outcome[2]
    assert not (tmp_path / "w" / "results.json").exists()


def test_ewc_without_pretrain_classes_is_refused_before_anything_runs():
    """EWC measures its Fisher on the pretrain classes' kept-out images: with P = 0 it failed in
    the run (KeyError 'fisher'); the config names the setting instead."""
    stream = fluid.config.SMALL_STREAM
    with pytest.raises(UserError, match=r"method ewc needs pretrain classes .* "
                                        r"pretrain_fraction=0.0 gives none of the 40 stream"):
        fluid.config.preset("small", methods=("ncm", "ewc"),
                            stream=dataclasses.replace(stream, pretrain_fraction=0.0))
    assert fluid.config.preset("small", methods=("ncm",), stream=dataclasses.replace(
        stream, pretrain_fraction=0.0)).methods == ("ncm",)
