"""The paper's "new class" output: f predicts one of the K known classes or "new".

FLUID's model maps a sample to ``{1 .. K+1}``: one of the K classes known so
far, or a new class (Wallingford et al., Section 3), and is scored
``1{f(x_t) = y_t}``. With a method's ``new_class`` option its prediction is
``NEW`` when its unseen-class score (``Method.detector``: MDT, or the
softmax maximum) is above a threshold ``t``, else its class prediction.
Predicting "new" changes nothing a method learns (the label is revealed and
absorbed either way), so ``apply`` turns the recorded predictions and scores
of a stream into the K+1-way predictions after the stream.

Counting (``targets``): the first sample of a *novel* class has the target
``NEW``; every other sample's target is its label -- the pretrain classes are
known from pretraining, so their first samples are not new (the same
positives as the unseen-class AUROC: the paper's 750 per sequence; the
targets are the stream's, also for a method run with ``known_classes=False``).
A ``NEW`` prediction for any other sample is wrong. Overall, mean-per-class and
cross-section accuracies count against these targets
(``metrics.stream_metrics``), so a novel class's first sample is correct when
predicted new (without the option it is always wrong).

Threshold rule (``select_threshold``): chosen on validation streams, never on
the test streams: the ``t`` that maximises the number of correct K+1-way
predictions pooled over the validation streams' samples, over every cut
between two distinct scores; ties go to the largest ``t`` (the fewest "new"
predictions). ``t`` = the largest score means "never new". ``thresholds``
runs the validation streams once per workdir and stores the choice
(``new_class.json``), so each stream of a run (a SLURM job per stream too)
uses the same thresholds. A run of the validation streams themselves
(``--streams=validation``) is counted with thresholds chosen on them.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

import numpy as np

from cfsl_jax.runtime import progress
from cfsl_jax.runtime import json_files

NEW = -2  # the "new class" prediction (-1 is "no class seen yet")
RULE = ("max pooled K+1-way accuracy on the validation streams; ties: largest threshold")


def targets(stream) -> np.ndarray:
    """int32 [L]: ``NEW`` for the first sample of each novel class, else the label."""
    novel_first = np.asarray(stream.first_appearance) & ~np.asarray(stream.is_pretrain_class)
    return np.where(novel_first, NEW, np.asarray(stream.label)).astype(np.int32)


def apply(prediction, unseen_score, threshold: float) -> np.ndarray:
    """int32 [L]: ``NEW`` where the unseen score is above ``threshold``, else ``prediction``."""
    prediction = np.asarray(prediction)
    score = np.asarray(unseen_score, np.float64)
    if prediction.shape != score.shape:
        raise ValueError(f"prediction {prediction.shape} and scores {score.shape} differ")
    return np.where(score > threshold, NEW, prediction).astype(np.int32)


def select_threshold(predictions: Sequence, scores: Sequence, target_lists: Sequence
                     ) -> tuple[float, float]:
    """(threshold, pooled K+1-way accuracy at it) over the validation streams (module doc).

    Arguments: per stream, the class predictions [L_i], unseen scores [L_i] and
    ``targets`` [L_i].
    """
    if not predictions or not (len(predictions) == len(scores) == len(target_lists)):
        raise ValueError("select_threshold needs the same number (>= 1) of predictions, "
                         "scores and targets")
    prediction = np.concatenate([np.asarray(p) for p in predictions])
    score = np.concatenate([np.asarray(s, np.float64) for s in scores])
    target = np.concatenate([np.asarray(t) for t in target_lists])
    if np.isnan(score).any():
        raise ValueError("unseen scores contain NaN")
    order = np.argsort(-score, kind="stable")
    score, right_if_new = score[order], (target == NEW)[order]
    right_if_kept = (prediction == target)[order]
    # cut j: the j highest scores are predicted new; valid where score[j-1] > score[j]
    new_right = np.r_[0, np.cumsum(right_if_new)]
    kept_right = right_if_kept.sum() - np.r_[0, np.cumsum(right_if_kept)]
    valid = np.r_[True, score[:-1] > score[1:], True]
    correct = np.where(valid, new_right + kept_right, -1)
    j = int(np.argmax(correct))  # the first maximum: the fewest "new" predictions
    threshold = float(score[j]) if j < score.size else -np.inf
    return threshold, float(correct[j] / score.size)


def summary(prediction, target) -> dict[str, int]:
    """Counts of one stream's K+1-way predictions (for results.json)."""
    prediction, target = np.asarray(prediction), np.asarray(target)
    is_new, new_target = prediction == NEW, target == NEW
    return {"predicted_new": int(is_new.sum()), "new_targets": int(new_target.sum()),
            "new_detected": int((is_new & new_target).sum()),
            "false_new": int((is_new & ~new_target).sum())}


def thresholds(options: dict[str, dict], path: str, config: dict, streams: int,
               run: Callable[[list[str], int], tuple[Any, dict]]) -> dict[str, dict]:
    """{method: {"threshold", "rule", ...}} of the methods whose ``options`` ask for
    ``new_class``: ``new_class_threshold`` if given, else ``select_threshold`` on the
    validation streams ``0 .. streams-1``; ``run(names, i)`` runs those methods on validation
    stream ``i`` and returns ``(stream, {name: StreamRecord})``. The selection is stored in
    ``path`` with ``config`` and read back by a run of the same config (any ``num_streams``)."""
    wanted = [name for name, own in options.items() if own.get("new_class")]
    chosen = {name: {"threshold": options[name]["new_class_threshold"], "rule": "given"}
              for name in wanted if options[name].get("new_class_threshold") is not None}
    select = [name for name in wanted if name not in chosen]
    if not select:
        return chosen
    ours = {**json.loads(json.dumps(config)), "num_streams": 0}
    stored = json_files.read_json(path, default={})
    if stored.get("config") == ours and set(select) <= set(stored.get("thresholds", {})):
        return {**chosen, **{name: stored["thresholds"][name] for name in select}}
    runs = [run(select, index) for index in range(streams)]
    for name in select:
        threshold, accuracy = select_threshold(
            [records[name].prediction for _, records in runs],
            [records[name].unseen_score for _, records in runs],
            [targets(stream) for stream, _ in runs])
        chosen[name] = {"threshold": threshold, "rule": RULE, "validation_streams": streams,
                        "validation_accuracy": accuracy}
        progress.say(f"[FLUID] {name}: 'new class' threshold {threshold:.6g} (K+1-way "
                     f"accuracy {accuracy:.4f} on {streams} validation stream(s))")
    json_files.write_json(path, {"config": ours, "thresholds": {n: chosen[n] for n in select}})
    return chosen
