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
(``new_class.json``, sealed: ``checksums.read_sealed`` refuses one changed since), so each
stream of a run (a SLURM job per stream too) uses the same thresholds. SLURM jobs started at
once may each choose them (on validation runs that can differ in the last bits on another
GPU, and so in the threshold, a score): a job that finds a choice another stored meanwhile
uses that one, not its own; ``experiment`` refuses streams counted with different
thresholds. A run of the validation streams themselves (``--streams=validation``) is
counted with thresholds chosen on them.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

import numpy as np

from cfsl_jax.runtime import checksums, files, json_files, progress
from cfsl_jax.runtime.errors import UserError

NEW = -2  # the "new class" prediction (-1 is "no class seen yet")
RULE = ("max pooled K+1-way accuracy on the validation streams; ties: largest threshold")
ADVICE = ("delete it and run the same command again: the thresholds are chosen again on the "
          "validation streams")


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
    if (stored := _stored(path, ours, select)) is not None:
        return {**chosen, **stored}
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
    if (stored := _stored(path, ours, select)) is not None:  # another job chose first: its
        progress.say(f"[FLUID] {path}: stored by another job meanwhile; using its thresholds")
        return {**chosen, **stored}  # choice, as the streams it counted
    json_files.write_json(path, {"config": ours, "thresholds": {n: chosen[n] for n in select}},
                          sealed=True)
    return chosen


def _stored(path: str, config: dict, names: list[str]) -> dict[str, dict] | None:
    """{name: threshold entry} stored in ``path`` for ``config`` (None if none for all
    ``names``); ``checksums.Corrupt`` for a file changed since it was written."""
    stored = checksums.read_sealed(path, ADVICE) if files.exists(path) else {}
    thresholds = stored.get("thresholds")
    if stored.get("config") != config or not isinstance(thresholds, dict) or not set(
            names) <= set(thresholds):
        return None
    return {name: thresholds[name] for name in names}


def check_agree(counted: dict | None, used: dict, source: str, path: str) -> None:
    """UserError when a stream (``source`` names it) was counted with thresholds ``used`` other
    than the streams before it (``counted``; None: there are none): a table never mixes them
    (SLURM jobs that each chose theirs, module doc). ``path``: the run's ``new_class.json``."""
    if counted is None or used == counted:
        return
    selected = {name: entry for name, entry in counted.items() if entry.get("rule") != "given"}
    stored = checksums.read_sealed(path, ADVICE) if files.exists(path) else {}
    thresholds = stored.get("thresholds") if isinstance(stored.get("thresholds"), dict) else {}
    if source.endswith(".json") and selected == {n: thresholds.get(n) for n in selected}:
        advice = f"delete it and run the same command again: it is run again with {path}'s"
    else:
        workdir = files.dirname(path)
        advice = (f"to count every stream with one choice, delete {path}, "
                  f"{files.join(workdir, 'streams')} and {files.join(workdir, 'results.json')} "
                  f"and run the same command again")

    def brief(chosen):
        return ", ".join(f"{name} {entry.get('threshold')!r}" for name, entry in
                         sorted(chosen.items())) or "none"
    raise UserError(f"{source} was counted with other 'new class' thresholds ({brief(used)}) "
                    f"than the streams before it ({brief(counted)}): jobs that chose them at "
                    f"once, on validation runs that differ in the last bits; {advice}")
