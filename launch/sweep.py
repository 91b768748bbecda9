"""Run a grid of (dataset x learner x cell x seed), each run in its own workdir, then report.

    python -m launch.sweep --workdir=/tmp/sweep --dry_run          # what would run
    python -m launch.sweep --workdir=/tmp/sweep --learners=protonets,init_tune \\
        --cells=B3,C3 --seeds=0,1 --epochs=2 --iters_per_epoch=50 --eval_tasks=100
    python -m launch.sweep --workdir=/tmp/omniglot --dataset=omniglot \\
        --manual_dir=../shared/data/omniglot --epochs=20 --iters_per_epoch=500

By default: every registered learner that builds x the paper's 11 cells x seeds
0,1,2, on --dataset. --workdir is the sweep directory: each run lives in
WORKDIR/<dataset>/<learner>/<cell>/seed<k>/. Re-running the same command skips
finished runs and resumes interrupted ones, so a sweep killed at any point
continues where it stopped. The per-run budget and options are the flags of
launch.train (--budget=paper for the paper's schedule in one word, or --epochs,
--iters_per_epoch, --meta_batch, --val_tasks,
--eval_tasks, --nc, ...), the same for every run; --learner_option=NAME=VALUE
goes to every learner, --learner_option=LEARNER:NAME=VALUE to one. At the end
the report (launch.report) is written to WORKDIR/report and Table 1 printed.

--dry_run loads the datasets and marks "impossible" the runs whose spec a split
cannot supply, with the reason. Ctrl-C stops the sweep at once (each run in
progress checkpoints; no queued run starts); the same command continues it.
A line per finished run gives runs done/total and the ETA.
"""

from __future__ import annotations

import dataclasses

from absl import flags

from cfsl_jax import as_published, report, sweep
from cfsl_jax.learners import LEARNERS
from cfsl_jax.spec import PAPER_GRID

from . import cli
from . import train as train_cli  # noqa: F401  (defines the per-run flags; --workdir)
from .options import check_learner_options, flag_names, learner_option_names

flags.DEFINE_list("learners", [], f"Learners (default: all of {','.join(LEARNERS)} that build).")
flags.DEFINE_list("cells", list(PAPER_GRID), "Task cells: paper cells (B3, D8, ...) or "
                  "TYPE+NSS; any case.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds.")
flags.DEFINE_list("datasets", [], "Datasets (default: --dataset).")
flags.DEFINE_integer("workers", None, "Worker processes (default: one per GPU, one on TPU, one "
                     "per CPU core; 0: run in this process).")
flags.DEFINE_bool("dry_run", False, "List the runs and their status; run nothing.")
flags.DEFINE_bool("report", True, "Write the report into WORKDIR/report at the end.")

FLAGS = flags.FLAGS
_SINGULAR = {"learner": "learners", "task": "cells", "seed": "seeds"}


def split_learner_options(options: dict) -> tuple[dict, dict[str, dict]]:
    """{"filters": 8, "init_tune:inner_steps": 1} -> ({"filters": 8}, {"init_tune":
    {"inner_steps": 1}})."""
    common, per_learner = {}, {}
    for key, value in options.items():
        learner, sep, name = key.partition(":")
        if not sep:
            common[key] = value
        elif learner not in LEARNERS or not name:
            raise cli.UserError(f"--learner_option={key}=... names unknown learner "
                                f"{learner!r}; valid: {', '.join(LEARNERS)}")
        else:
            per_learner.setdefault(learner, {})[name] = value
    return common, per_learner


def check_options(learners, cell_spec, common: dict, per_learner: dict[str, dict]) -> None:
    """UserError for an option no chosen learner takes (common) or its learner does not."""
    for learner, options in per_learner.items():
        check_learner_options(learner, cell_spec, options)
    for name in common:
        if not any(name in learner_option_names(learner, cell_spec) for learner in learners):
            valid = sorted({n for learner in learners
                            for n in learner_option_names(learner, cell_spec)})
            raise cli.UserError(f"--learner_option {name}: no learner of the sweep takes it; "
                                f"valid: {', '.join(valid)}")


def main(argv) -> None:
    del argv
    for singular, plural in _SINGULAR.items():
        if FLAGS[singular].present:
            raise cli.UserError(f"--{singular} is one run's flag; a sweep takes --{plural}")
    try:
        base = train_cli._config_from_flags(per_learner=False)
        base.check()
        common, per_learner = split_learner_options(base.learner_options)
        for learner in FLAGS.learners or LEARNERS:  # --as_published's options, per learner
            preset = as_published.learner_options(FLAGS.as_published, learner)
            preset = {k: v for k, v in preset.items() if k not in common}
            if preset:
                per_learner[learner] = {**preset, **per_learner.get(learner, {})}
        base = dataclasses.replace(base, learner_options=common)
        cells = [cell.strip().upper() for cell in FLAGS.cells]
        check_options(FLAGS.learners or LEARNERS, dataclasses.replace(base, task=cells[0]).spec
                      if cells else base.spec, common, per_learner)
        configs, skipped = sweep.grid(
            base, learners=FLAGS.learners or None, cells=cells,
            seeds=[int(seed) for seed in FLAGS.seeds], datasets=FLAGS.datasets or None,
            learner_options=per_learner)
    except ValueError as error:
        raise cli.UserError(flag_names(str(error))) from None
    for name, reason in skipped.items():
        print(f"skipping learner {name}: it does not build ({reason})")
    if FLAGS.dry_run:
        planned = sweep.plan(configs, FLAGS.workdir, check=True)
        for run, state, detail in planned:
            print(f"{state:10s} {run.name:40s} {run.workdir}" + (f"  ({detail})" if detail else ""))
        counts = sweep.summary([sweep.Outcome(run, state, 0.0, "") for run, state, _ in planned])
        print(f"{len(planned)} runs: {counts}")
        return
    outcomes = sweep.run_sweep(configs, FLAGS.workdir, workers=FLAGS.workers)
    print(f"sweep {FLAGS.workdir}: {sweep.summary(outcomes)}")
    if FLAGS.report and any(o.status in ("skipped", "finished") for o in outcomes):
        paths = report.write_report(FLAGS.workdir)
        accuracy = report.aggregate(report.load_results(FLAGS.workdir), "acc")
        for dataset, path in paths["markdown"].items():
            print(f"\nTest accuracy (%) on {dataset}, mean ± std across seeds:\n")
            print(report.markdown(report.table(accuracy, dataset, "acc")))
            print(f"\nfull report: {path}")
    bad = [o for o in outcomes if o.status in ("failed", "conflict")]
    if bad:
        raise SystemExit(f"{len(bad)} run(s) did not finish: "
                         + ", ".join(f"{o.run.name} ({o.status})" for o in bad))


def run() -> None:
    cli.run(main, interrupted="sweep interrupted: re-run the same command to continue")


if __name__ == "__main__":
    run()
