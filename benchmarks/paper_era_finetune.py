"""A finished fine-tuner run re-tested under the paper-era options, beside Table 1.

    python -m benchmarks.paper_era_finetune --workdirs=W1,W2 --test_tasks=300 \
        --variants=carried,restart,restart+rows

Each workdir is a finished run of a fine-tuner (Init+Tune, Pretrain+Tune, EWC-Init,
EWC-Pretrain: a reference grid run, say). It is tested again from its own checkpoints (the
top-k ensemble, as its results.json) on the first ``--test_tasks`` of its own test tasks
(task keys are ``jax.random.split(key, n)``, so they are the first tasks of its row), or of
``--task``'s (a fine-tuner pretrained for C3 tested on A3's tasks: the same head), once per
variant of its learner options (``paper_era.VARIANTS``, ``paper_era.retest``):

- ``carried``: the run's own options (the spec: fast weights carried across support sets);
- ``restart``: ``restart_each_support_set=True`` (the paper-era re-copy, fidelity 4(b));
- ``rows``: ``per_step_bn_rows=True`` (the authors' per-step batch-norm rows);
- ``restart+rows``: both (what ``--as_published`` gives Pretrain+Tune).

Prints, per run and variant: accuracy with its 95 % CI, accuracy per class group (per
support set on C cells), the paired difference to the first variant, Table 1's cell and the
closed-form prediction of ``paper_era``; then one JSON line per row.
"""

from __future__ import annotations

import json

from absl import flags

from launch import cli

_WORKDIRS = flags.DEFINE_list("workdirs", None, "Finished fine-tuner runs.", required=True)
_TEST_TASKS = flags.DEFINE_integer("test_tasks", 300, "The first N of each run's test tasks.")
_TASK = flags.DEFINE_string("task", None, "Test on this cell's test tasks instead of the run's "
                            "own (the learner's parameters must have the same shapes there).")
_VARIANTS = flags.DEFINE_list("variants", ["carried", "restart", "restart+rows"],
                              "Option variants (module doc); the first is the paired baseline.")


def check() -> None:
    from cfsl_jax.experiments import paper_era
    unknown = [v for v in _VARIANTS.value if v not in paper_era.VARIANTS]
    if unknown:
        raise cli.UserError(f"--variants={','.join(_VARIANTS.value)}: unknown {unknown}; one "
                            f"of {sorted(paper_era.VARIANTS)}")
    if _TEST_TASKS.value < 1:
        raise cli.UserError(f"--test_tasks={_TEST_TASKS.value}: must be >= 1")
    from cfsl_jax.training import runs
    for workdir in _WORKDIRS.value:
        runs.load_config(workdir)  # a run's folder: else one line naming it


def main(argv) -> None:
    del argv
    check()
    import numpy as np

    from cfsl_jax.experiments import paper_era, paper_results
    from cfsl_jax.protocol.metrics import summarize

    lines = []
    print("| run | learner | cell | variant | accuracy (%) | per class group (%) | "
          "paired vs first (points) | Table 1 (%) | closed form (%) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for workdir in _WORKDIRS.value:
        rows = [paper_era.retest(workdir, variant, _TEST_TASKS.value, _TASK.value)
                for variant in _VARIANTS.value]
        for row in rows:
            table1 = paper_results.TABLE1["values"]["omniglot"][row["learner"]].get(row["cell"])
            diff = summarize(np.asarray(row["per_task"]) - np.asarray(rows[0]["per_task"]))
            closed = paper_era.predicted(row["learner"], row["cell"])
            row.update(paired_vs_first=100 * diff["mean"], paired_ci95=100 * diff["ci95"],
                       table1=table1 and table1["mean"], closed_form=closed,
                       workdir=workdir, tasks=len(row["per_task"]))
            print(f"| {workdir} | {row['learner']} | {row['cell']} | {row['variant']} | "
                  f"{100 * row['acc_mean']:.2f} ± {100 * row['acc_ci95']:.2f} | "
                  f"{', '.join(f'{100 * a:.1f}' for a in row['group_acc'])} | "
                  f"{row['paired_vs_first']:+.2f} ± {row['paired_ci95']:.2f} | "
                  f"{paper_results.printed(table1) if table1 else '-'} | "
                  f"{'-' if closed is None else f'{closed:.2f}'} |")
            lines.append({k: v for k, v in row.items() if k != "per_task"})
    for line in lines:
        print(json.dumps(line))


if __name__ == "__main__":
    cli.run(main, check=check)
