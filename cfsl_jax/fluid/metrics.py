"""FLUID metrics of one stream (numpy, on the host, after the stream ran).

Every sample counts, first appearances included (a novel class's first sample
is always wrong: its label is not among the known or seen classes), as in the
authors' ``OnlineMetricTracker`` (metrics.py): overall accuracy over all
samples, per-class accuracy = correct / images of the class in the sequence.
With a ``new_class_threshold`` the predictions are the paper's K+1-way ones
(``new_class``): a novel class's first sample is correct when predicted
"new", and a "new" prediction for any other sample is wrong.

- ``accuracy``: fraction of samples predicted correctly.
- ``mean_per_class_accuracy``: the mean over the stream's classes of each
  class's accuracy (tail classes weigh as much as head classes).
- cross-sections ``pretrain_head``, ``pretrain_tail``, ``novel_head``,
  ``novel_tail``: the mean per-class accuracy over the classes of that group
  (each class weighs the same, as in ``mean_per_class_accuracy``; None if the
  stream has none). The paper's Table 2 names the groups but not the
  weighting; its Table 3 cross-sections are per-class means: weighted by the
  groups' class counts of sequence 5 (the authors' ``imgs_per_class5.npy``:
  357 / 108 / 393 / 142 classes) they give the printed mean per-class accuracy
  of the ResNet18 rows (c)-(e), (g)-(l) within 0.03-0.52 points (LwF, f: 2.07),
  while weighted by their sample counts they miss the printed overall accuracy
  (which pooled-sample cross-sections would reproduce) by 1.3-14.8 points. The
  authors' tracker saves per-class accuracies (``per_class_acc``), not groups.
- ``rolling_accuracy(correct, window)``: accuracy over the last ``window``
  samples at each t (over all samples so far while t < window); the results
  keep ``curve_points`` evenly spaced points of it.
- ``auroc``: area under the ROC curve of unseen-class detection: the first
  appearances of *novel* classes are the positives (the pretrain classes are
  known from the start, so their first appearances are not new: negatives,
  like every other sample; the paper's 750 positives against ~89k
  negatives), computed
  from ranks (Mann-Whitney U, ties counted 1/2): ``(sum of positive ranks -
  P(P+1)/2) / (P N)``. It equals the fraction of (positive, negative) pairs
  where the positive scores higher, plus half the ties. None if either set is
  empty.
- ``best_f1``: Table 10's F1 of unseen-class detection "at the best possible
  threshold": the positives as for ``auroc``, a sample flagged when its
  unseen-class score is >= t, the largest F1 = 2TP / (2TP + FP + FN) over every
  t (each distinct score). The threshold is chosen on the stream it scores, as
  the paper's, so it is an upper bound, not a deployable detector. None without
  positives.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cfsl_jax.fluid import new_class
from cfsl_jax.runtime.options import positive_int

CROSS_SECTIONS = ("pretrain_head", "pretrain_tail", "novel_head", "novel_tail")


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of ``values``; tied values share the mean of their ranks."""
    values = np.asarray(values, np.float64)
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], values.size]  # tie groups [start, end) in sorted order
    group_rank = (starts + 1 + ends) / 2.0  # mean of ranks start+1 .. end
    ranks = np.empty(values.size, np.float64)
    ranks[order] = np.repeat(group_rank, ends - starts)
    return ranks


def auroc(scores, positives) -> float | None:
    """Rank-based AUROC of ``scores`` [n] for the boolean ``positives`` [n] (module doc)."""
    scores = np.asarray(scores, np.float64)
    positives = np.asarray(positives, bool)
    if scores.shape != positives.shape or scores.ndim != 1:
        raise ValueError(f"scores {scores.shape} and positives {positives.shape} must be "
                         f"matching 1-D arrays")
    if np.isnan(scores).any():
        raise ValueError("scores contain NaN")
    num_pos, num_neg = int(positives.sum()), int((~positives).sum())
    if num_pos == 0 or num_neg == 0:
        return None
    ranks = average_ranks(scores)
    return float((ranks[positives].sum() - num_pos * (num_pos + 1) / 2) / (num_pos * num_neg))


def best_f1(scores, positives) -> float | None:
    """The largest F1 of ``scores >= t`` against the boolean ``positives`` over every
    threshold t (module doc); None without positives."""
    scores = np.asarray(scores, np.float64)
    positives = np.asarray(positives, bool)
    if scores.shape != positives.shape or scores.ndim != 1:
        raise ValueError(f"scores {scores.shape} and positives {positives.shape} must be "
                         f"matching 1-D arrays")
    num_pos = int(positives.sum())
    if num_pos == 0:
        return None
    order = np.argsort(-scores, kind="stable")
    sorted_scores, hits = scores[order], positives[order]
    last_of_tie = np.r_[sorted_scores[1:] != sorted_scores[:-1], True]  # t = each score
    true_pos = np.cumsum(hits)[last_of_tie]
    flagged = (np.flatnonzero(last_of_tie) + 1).astype(np.float64)
    return float(np.max(2 * true_pos / (flagged + num_pos)))


def rolling_accuracy(correct, window: int) -> np.ndarray:
    """float64 [L]: mean of ``correct`` over the last ``window`` samples up to each t."""
    positive_int("window", window)
    correct = np.asarray(correct, np.float64)
    cumulative = np.r_[0.0, np.cumsum(correct)]
    t = np.arange(1, correct.size + 1)
    first = np.maximum(t - window, 0)
    return (cumulative[t] - cumulative[first]) / (t - first)


def novel_first_appearances(stream) -> np.ndarray:
    """bool [L]: the AUROC positives, first samples of the novel classes."""
    return np.asarray(stream.first_appearance) & ~np.asarray(stream.is_pretrain_class)


def correctness(prediction, unseen_score, stream, new_class_threshold: float | None = None
                ) -> tuple[np.ndarray, dict[str, Any] | None]:
    """(bool [L] correct, the K+1-way counts or None): the class predictions against the
    labels, or (``new_class_threshold``) the K+1-way predictions against ``new_class.targets``."""
    label = np.asarray(stream.label)
    prediction = np.asarray(prediction)
    if prediction.shape != label.shape:
        raise ValueError(f"prediction {prediction.shape} does not match the stream {label.shape}")
    if new_class_threshold is None:
        return prediction == label, None
    prediction = new_class.apply(prediction, unseen_score, new_class_threshold)
    target = new_class.targets(stream)
    return prediction == target, {"threshold": float(new_class_threshold),
                                  **new_class.summary(prediction, target)}


def stream_metrics(prediction, unseen_score, stream, window: int | None = None,
                   curve_points: int = 20, new_class_threshold: float | None = None
                   ) -> dict[str, Any]:
    """All metrics of one stream as plain numbers; ``window`` defaults to max(10, L // 20);
    ``new_class_threshold``: counted as the paper's K+1-way output (module doc)."""
    label = np.asarray(stream.label)
    correct, counts = correctness(prediction, unseen_score, stream, new_class_threshold)
    length = label.size
    window = max(10, length // 20) if window is None else window
    pretrain = np.asarray(stream.is_pretrain_class)
    head = np.asarray(stream.is_head_class)
    classes, first = np.unique(label, return_index=True)
    per_class = np.array([correct[label == k].mean() for k in classes])

    sections = {}
    for name in CROSS_SECTIONS:
        group, size = name.split("_")
        members = (pretrain[first] == (group == "pretrain")) & (head[first] == (size == "head"))
        sections[name] = float(per_class[members].mean()) if members.any() else None

    rolling = rolling_accuracy(correct, window)
    points = np.unique(np.linspace(0, length - 1, min(curve_points, length)).round().astype(int))
    return {
        **({"new_class": counts} if counts is not None else {}),
        "accuracy": float(correct.mean()),
        "mean_per_class_accuracy": float(np.mean(per_class)),
        **sections,
        "auroc": auroc(unseen_score, novel_first_appearances(stream)),
        "best_f1": best_f1(unseen_score, novel_first_appearances(stream)),
        "rolling_window": window,
        "rolling_accuracy": {"t": (points + 1).tolist(), "accuracy": rolling[points].tolist()},
    }
