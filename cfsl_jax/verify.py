"""Check that a run's evaluation tasks (and test metrics) can be reproduced: MATCH or what differs."""

from __future__ import annotations

import os

from cfsl_jax import progress, results, train
from cfsl_jax.errors import UserError
from cfsl_jax.evaluate import task_fingerprint

CHECKED_METRICS = ("acc_mean", "acc_std", "ce_mean", "ce_std")


def verify(workdir: str, metrics: bool = True) -> list[str]:
    """Differences between ``workdir/results.json`` and a recomputation (empty list: MATCH).

    Recomputes the test tasks' fingerprint from (split, spec, seed) and, when
    ``metrics`` and the run has finished, the test metrics from its
    checkpoints (equal bit for bit on the same backend).
    """
    config = train.load_config(workdir)
    path = os.path.join(workdir, "results.json")
    if not os.path.isfile(path):
        raise UserError(f"--workdir={workdir} holds no finished run (no results.json): finish "
                        f"it first (re-run its launch.train command)")
    recorded = results.read_json(path)
    learner, splits = train.build(config)
    differences = []
    sizes = results.split_sizes(splits)
    if sizes != recorded["splits"]:
        differences.append(f"split sizes: recorded {recorded['splits']}, now {sizes}")
    with progress.stage(f"[verify] sampling the {config.test_tasks} test tasks"):
        fingerprint = task_fingerprint(splits["test"], learner.spec, config.test_tasks,
                                       config.task_seed)
    if fingerprint != recorded["task_fingerprint"]:
        differences.append(f"task_fingerprint: recorded {recorded['task_fingerprint']}, "
                           f"now {fingerprint}")
    if metrics and not differences:
        params = train.restore_params(config, learner, splits, workdir, ensemble=True)
        from cfsl_jax.evaluate import evaluate
        report = evaluate(learner, params, splits["test"], num_tasks=config.test_tasks,
                          seed=config.task_seed, batch_size=config.eval_batch,
                          ensemble=train.selects_epochs(config, learner), cost_metrics=False)
        for name in CHECKED_METRICS:
            if report[name] != recorded["test"][name]:
                differences.append(f"{name}: recorded {recorded['test'][name]!r}, "
                                   f"now {report[name]!r}")
    return differences
