"""FLUID end to end: the CLI on a tiny synthetic stream, pretraining data, Omniglot alphabets."""

import json
import os
import subprocess
import sys

import jax
import numpy as np

from cfsl_jax import data, fluid
from cfsl_jax.fluid.experiment import alphabet_pretrain_mask

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cli_writes_results_table_and_plot(tmp_path):
    workdir = tmp_path / "fluid"
    command = [sys.executable, "-m", "launch.fluid", f"--workdir={workdir}",
               "--method=ncm,exemplar_tuning", "--stream_classes=6", "--stream_length=90",
               "--head_threshold=15", "--min_pretrain_samples=5", "--update_every=30",
               "--pretrain_steps=3", "--filters=8",
               "--dataset_option=num_classes=20", "--dataset_option=samples_per_class=30",
               "--dataset_option=image_size=16",
               "--method_option=exemplar_tuning:learning_rate=0.002"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "exemplar_tuning" in done.stdout and "auroc" in done.stdout
    results = json.loads((workdir / "results.json").read_text())
    assert results["stream"]["length"] == 90 and results["stream"]["classes"] == 6
    assert results["config"]["method_options"] == {"exemplar_tuning": {"learning_rate": 0.002}}
    for name in ("ncm", "exemplar_tuning"):
        result = results["methods"][name]
        assert 0.0 <= result["metrics"]["accuracy"] <= 1.0
        assert result["macs"]["total"] == (result["macs"]["inference"] + result["macs"]["updates"]
                                           + result["macs"]["training"])
    assert results["methods"]["ncm"]["train_steps"] == 0
    assert results["methods"]["exemplar_tuning"]["train_steps"] == 1 + 2  # after 30 and 60
    assert (workdir / "rolling_accuracy.png").stat().st_size > 1000
    assert "ncm" in (workdir / "results.txt").read_text()


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
