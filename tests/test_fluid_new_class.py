"""The paper's "new class" output: K+1-way counting, the threshold rule, chosen on validation."""

import dataclasses
import json

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

from cfsl_jax import data, fluid
from cfsl_jax.fluid import experiment, new_class
from cfsl_jax.fluid.new_class import NEW
from cfsl_jax.fluid.sequences import Stream


def tiny_stream():
    """5 samples; class 0 is a pretrain class, 1 and 2 are novel; every class is a tail one."""
    label = np.array([0, 2, 2, 1, 2], np.int32)
    return Stream(jnp.arange(5, dtype=jnp.int32), jnp.asarray(label), jnp.asarray(label == 0),
                  jnp.zeros(5, bool), jnp.asarray([True, True, False, True, False]))


def test_a_first_seen_novel_sample_is_correct_when_predicted_new():
    stream = tiny_stream()
    np.testing.assert_array_equal(new_class.targets(stream), [0, NEW, 2, NEW, 2])
    prediction = np.array([0, 0, 2, 0, 2], np.int32)  # index 1 and 3: first samples of 1 and 2
    scores = np.array([0.1, 0.9, 0.2, 0.95, 0.6])
    off = fluid.stream_metrics(prediction, scores, stream)
    assert off["accuracy"] == 0.6 and "new_class" not in off  # 0, 2, 4 right
    never = fluid.stream_metrics(prediction, scores, stream, new_class_threshold=np.inf)
    assert {k: v for k, v in never.items() if k != "new_class"} == off  # never "new": as off
    on = fluid.stream_metrics(prediction, scores, stream, new_class_threshold=0.5)
    # new for 1, 3 (right: first samples of novel classes) and 4 (wrong: class 2 is seen)
    assert on["accuracy"] == 0.8
    assert on["new_class"] == {"threshold": 0.5, "predicted_new": 3, "new_targets": 2,
                               "new_detected": 2, "false_new": 1}
    # per class (the paper's cross-sections): class 1 1/1, class 2 2/3 (pooled: 3/4)
    assert on["pretrain_tail"] == 1.0 and on["novel_tail"] == pytest.approx((1 + 2 / 3) / 2)
    assert on["mean_per_class_accuracy"] == pytest.approx((1 + 1 + 2 / 3) / 3)
    # a pretrain class is known from pretraining: "new" at its first sample is wrong
    first_pretrain = fluid.stream_metrics(prediction, [0.7, 0, 0, 0, 0], stream,
                                          new_class_threshold=0.5)
    assert first_pretrain["accuracy"] == 0.4 and first_pretrain["pretrain_tail"] == 0.0


def test_threshold_rule_on_small_numbers():
    # sorted by score: 0.9 (new target), 0.8 (new target), 0.3 (kept wrong), 0.2, 0.1 (kept right)
    prediction = np.array([0, 0, 1, 1, 0])
    scores = np.array([0.9, 0.1, 0.8, 0.2, 0.3])
    target = np.array([NEW, 0, NEW, 1, 1])
    # "new" above 0.3 or above 0.2 both get 4 of 5 right: the tie goes to the larger threshold
    assert new_class.select_threshold([prediction], [scores], [target]) == (0.3, 0.8)
    # two validation streams are pooled: the second one makes "never new" the best
    second = (np.zeros(4, int), np.array([0.95, 0.9, 0.85, 0.5]), np.zeros(4, int))
    threshold, accuracy = new_class.select_threshold(
        [prediction, second[0]], [scores, second[1]], [target, second[2]])
    assert (threshold, accuracy) == (0.95, 6 / 9)  # the largest score: nothing is new


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(-1, 1), st.integers(-1, 1)),
                min_size=1, max_size=20))
def test_threshold_rule_equals_brute_force(rows):
    score = np.array([r[0] for r in rows], np.float64) / 4  # ties are common
    target = np.array([NEW if r[1] < 0 else r[1] for r in rows])
    prediction = np.array([r[2] for r in rows])
    threshold, accuracy = new_class.select_threshold([prediction], [score], [target])
    candidates = sorted(set(score) | {-np.inf}, reverse=True)
    correct = [np.sum(new_class.apply(prediction, score, t) == target) for t in candidates]
    best = int(np.argmax(correct))  # the largest threshold of the best
    assert threshold == candidates[best] and accuracy == correct[best] / len(rows)


TINY = dict(methods=("ncm",), stream=fluid.StreamConfig(
    num_classes=6, length=90, pretrain_fraction=0.25, head_threshold=15, min_pretrain_samples=5,
    pretrain_classes=6), num_streams=1, validation_streams=1, pretrain_steps=3, filters=8,
    dataset_options={"num_classes": 20, "samples_per_class": 30, "image_size": 16})


def test_the_threshold_is_chosen_on_validation_streams_and_used_on_the_test_stream(
        tmp_path, monkeypatch):
    runs, original = {}, experiment.run_methods  # what each real stream run returned

    def recorded(config, split, built, index):
        runs[config.streams] = original(config, split, built, index)
        return runs[config.streams]

    monkeypatch.setattr(experiment, "run_methods", recorded)
    config = experiment.FluidConfig(**TINY, method_options={"ncm": {"new_class": True}})
    results = experiment.run_experiment(config, str(tmp_path / "on"))
    chosen = results["new_class"]["ncm"]
    stored = json.loads((tmp_path / "on" / "new_class.json").read_text())["thresholds"]["ncm"]
    assert chosen == stored and chosen["validation_streams"] == 1
    (v_stream, _, v_run), (t_stream, _, t_run) = runs["validation"], runs["test"]
    assert not np.array_equal(np.asarray(v_stream.sample_idx), np.asarray(t_stream.sample_idx))
    # the rule on validation stream 0 (not on the test stream) ...
    v_record, t_record = v_run["ncm"][0], t_run["ncm"][0]
    assert (chosen["threshold"], chosen["validation_accuracy"]) == new_class.select_threshold(
        [v_record.prediction], [v_record.unseen_score], [new_class.targets(v_stream)])
    assert -np.inf < chosen["threshold"] < np.max(v_record.unseen_score)  # some are "new"
    # ... counts the test stream K+1-way
    metrics = results["streams"][0]["methods"]["ncm"]["metrics"]
    expected = fluid.stream_metrics(t_record.prediction, t_record.unseen_score, t_stream,
                                    new_class_threshold=chosen["threshold"])
    assert metrics["accuracy"] == expected["accuracy"]
    assert metrics["new_class"] == expected["new_class"]
    assert metrics["new_class"]["new_targets"] == 4  # its 4 novel classes' first samples
    # the validation threshold flags samples of the test stream (3 pretraining steps: which
    # ones is noise)
    flagged = int(np.sum(t_record.unseen_score > chosen["threshold"]))
    assert metrics["new_class"]["predicted_new"] == flagged >= 1
    # the paper's sequences: the validation stream's novel classes are not the test stream's
    v_classes, t_classes = runs["validation"][1], runs["test"][1]
    assert not (set(v_classes.split_class[~v_classes.is_pretrain])
                & set(t_classes.split_class[~t_classes.is_pretrain]))


def test_off_runs_nothing_and_a_given_threshold_is_used_as_given(tmp_path):
    def run(names, index):
        raise AssertionError("no validation stream should run")

    path = str(tmp_path / "new_class.json")
    options = {"ncm": {"new_class": True, "new_class_threshold": 0.25}, "finetune": {}}
    assert new_class.thresholds(options, path, {}, 2, run) == {
        "ncm": {"threshold": 0.25, "rule": "given"}}
    assert new_class.thresholds({"ncm": {"new_class": False}}, path, {}, 2, run) == {}
    assert not (tmp_path / "new_class.json").exists()
