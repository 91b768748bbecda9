"""FLUID metrics: rank AUROC against brute force, rolling accuracy, cross-sections, detectors."""

import itertools

import hypothesis.strategies as st
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

from cfsl_jax import fluid
from cfsl_jax.protocol import metrics
from cfsl_jax.fluid import classifiers
from cfsl_jax.fluid.metrics import average_ranks


def pairwise_auroc(scores, positives):
    """Brute force: P(score of a positive > score of a negative) + P(tie) / 2."""
    pos = [s for s, p in zip(scores, positives) if p]
    neg = [s for s, p in zip(scores, positives) if not p]
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3), st.booleans()), min_size=2, max_size=25))
def test_auroc_equals_brute_force_pairwise(pairs):
    scores = np.array([s for s, _ in pairs], np.float64) / 2  # small integers: many ties
    positives = np.array([p for _, p in pairs])
    if positives.all() or not positives.any():
        assert fluid.auroc(scores, positives) is None
    else:
        assert fluid.auroc(scores, positives) == pytest.approx(pairwise_auroc(scores, positives),
                                                             abs=1e-12)


def test_auroc_known_values_and_infinite_scores():
    positives = np.array([True, True, False, False, False])
    assert fluid.auroc([5, 4, 3, 2, 1], positives) == 1.0
    assert fluid.auroc([1, 2, 3, 4, 5], positives) == 0.0
    assert fluid.auroc([1, 1, 1, 1, 1], positives) == 0.5
    assert fluid.auroc([np.inf, 0.2, 0.3, 0.1, 0.2], positives) == pytest.approx(4.5 / 6)
    np.testing.assert_array_equal(average_ranks([3.0, 1.0, 3.0, 2.0]), [3.5, 1.0, 3.5, 2.0])
    with pytest.raises(ValueError, match="NaN"):
        fluid.auroc([np.nan, 1.0], [True, False])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3), st.booleans()), min_size=1, max_size=25))
def test_best_f1_equals_brute_force_over_thresholds(pairs):
    """Table 10's F1 at the best threshold: flag score >= t, every t among the scores."""
    scores = np.array([s for s, _ in pairs], np.float64)
    positives = np.array([p for _, p in pairs])
    if not positives.any():
        assert fluid.metrics.best_f1(scores, positives) is None
        return
    def f1(t):
        flagged = scores >= t
        tp = int((flagged & positives).sum())
        return 2 * tp / (flagged.sum() + positives.sum())
    assert fluid.metrics.best_f1(scores, positives) == pytest.approx(
        max(f1(t) for t in scores), abs=1e-12)


def test_best_f1_known_values():
    positives = np.array([True, True, False, False, False])
    assert fluid.metrics.best_f1([5, 4, 3, 2, 1], positives) == 1.0
    # t=5: TP 1 of 1 flagged -> 2/3; t=1: TP 2 of 5 flagged -> 4/7; the others lower
    assert fluid.metrics.best_f1([5, 1, 3, 4, 2], positives) == pytest.approx(2 / 3)
    assert fluid.metrics.best_f1([1, 1, 1, 1, 1], positives) == pytest.approx(4 / 7)


def test_rolling_accuracy_known_values():
    correct = np.array([1, 0, 1, 1, 0, 0], bool)
    np.testing.assert_allclose(fluid.rolling_accuracy(correct, 3),
                               [1, 1 / 2, 2 / 3, 2 / 3, 2 / 3, 1 / 3])
    np.testing.assert_allclose(fluid.rolling_accuracy(correct, 100), np.cumsum(correct) /
                               np.arange(1, 7))
    with pytest.raises(ValueError, match="window must be a positive integer, got 0"):
        fluid.rolling_accuracy(correct, 0)


def test_stream_metrics_known_values():
    label = np.array([0, 1, 0, 2, 0, 1, 2, 0])
    prediction = np.array([-1, 0, 0, 0, 0, 1, 2, 1])  # correct at 2, 4, 5, 6
    pretrain = label == 0
    head = label != 2
    first = np.zeros(8, bool)
    first[[0, 1, 3]] = True
    stream = fluid.Stream(jnp.arange(8), jnp.asarray(label), jnp.asarray(pretrain),
                          jnp.asarray(head), jnp.asarray(first))
    score = np.array([9, 8, 0, 1, 2, 1, 0, 0], np.float32)  # first appearances: 9, 8, 1
    result = fluid.stream_metrics(prediction, score, stream, window=4)
    assert result["accuracy"] == pytest.approx(4 / 8)
    assert result["mean_per_class_accuracy"] == pytest.approx((2 / 4 + 1 / 2 + 1 / 2) / 3)
    assert result["pretrain_head"] == pytest.approx(2 / 4)  # class 0
    assert result["novel_head"] == pytest.approx(1 / 2)  # class 1
    assert result["novel_tail"] == pytest.approx(1 / 2)  # class 2
    assert result["pretrain_tail"] is None
    # Positives: the novel classes' first samples only (t=1: 8, t=3: 1). The pretrain
    # class's first sample (t=0, score 9) is a negative: 8 beats 5 of the 6 negatives
    # and loses to it; 1 beats three 0s, ties a 1, loses to the 2 and the 9.
    assert result["auroc"] == pytest.approx((5 + 3.5) / 12)
    assert result["rolling_accuracy"]["t"][-1] == 8
    assert result["rolling_accuracy"]["accuracy"][-1] == pytest.approx(3 / 4)  # samples 4..7


def test_cross_sections_are_per_class_means_within_each_group():
    """The paper's Table 3 cross-sections weigh each class of a group the same: two
    pretrain-head classes, 900 samples all right and 60 all wrong, give 0.5, not the
    pooled 900 / 960 = 0.9375; one novel-tail class of 3 samples, 2 right: 2/3."""
    label = np.r_[np.zeros(900, int), np.ones(60, int), np.full(3, 2)]
    prediction = np.r_[np.zeros(900, int), np.full(60, 5), [2, 2, 0]]
    first = np.zeros(label.size, bool)
    first[[0, 900, 960]] = True
    stream = fluid.Stream(jnp.arange(label.size), jnp.asarray(label), jnp.asarray(label < 2),
                          jnp.asarray(label < 2), jnp.asarray(first))
    result = fluid.stream_metrics(prediction, np.zeros(label.size, np.float32), stream)
    assert result["pretrain_head"] == pytest.approx(0.5)
    assert result["novel_tail"] == pytest.approx(2 / 3)
    assert result["pretrain_tail"] is None and result["novel_head"] is None
    assert result["accuracy"] == pytest.approx(902 / 963)  # overall still pools the samples
    assert result["mean_per_class_accuracy"] == pytest.approx((1 + 0 + 2 / 3) / 3)


def test_detector_scores_known_values():
    reps = jnp.array([[1.0, 0.0], [0.0, 2.0], [-1.0, 0.0]])
    seen = jnp.array([True, True, False])
    feature = classifiers.normalise(jnp.array([3.0, 0.0]))
    assert float(classifiers.mdt_score(feature, reps, seen, "cosine")) == pytest.approx(0.0, abs=1e-6)
    other = classifiers.normalise(jnp.array([-1.0, 0.0]))  # nearest seen is at distance sqrt 2
    assert float(classifiers.mdt_score(other, reps, seen, "cosine")) == pytest.approx(np.sqrt(2),
                                                                                 abs=1e-6)
    assert float(classifiers.mdt_score(other, reps, jnp.zeros(3, bool), "cosine")) == np.inf
    # Raw (NCM's Euclidean): [0, 1] is 1 from [0, 2] and sqrt 2 from [1, 0].
    assert float(classifiers.mdt_score(jnp.array([0.0, 1.0]), reps, seen, "euclidean")) == \
        pytest.approx(1.0)
    # Dot (Exemplar Tuning, linear layers): minus the largest similarity to a seen class:
    # [3, 1] . [1, 0] = 3, . [0, 2] = 2; the unseen [-1, 0] (similarity -3) is ignored.
    assert float(classifiers.mdt_score(jnp.array([3.0, 1.0]), reps, seen, "dot")) == -3.0
    assert float(classifiers.mdt_score(jnp.array([-3.0, 0.5]), reps, seen, "dot")) == -1.0
    assert float(classifiers.mdt_score(other, reps, jnp.zeros(3, bool), "dot")) == np.inf
    # NCM logits: minus squared distances.
    np.testing.assert_allclose(metrics.neg_sq_euclidean(jnp.array([[0.0, 1.0]]), reps),
                               [[-2.0, -1.0, -2.0]], atol=1e-6)
    logits = jnp.array([np.log(3.0), 0.0, 50.0])  # the unseen class's 50 is ignored
    assert float(classifiers.max_softmax_score(logits, seen)) == pytest.approx(1 - 3 / 4)
    assert float(classifiers.max_softmax_score(logits, jnp.zeros(3, bool))) == 1.0
    assert int(classifiers.decide(logits, seen)) == 0
    assert int(classifiers.decide(logits, jnp.zeros(3, bool))) == -1
