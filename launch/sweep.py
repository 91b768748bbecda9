"""Run a grid of (dataset x learner x cell x seed), each run in its own workdir, then report.

    python -m launch.sweep --workdir=/tmp/sweep --dry_run          # what would run
    python -m launch.sweep --workdir=/tmp/sweep --learners=protonets,init_tune \\
        --cells=B3,C3 --seeds=0,1 --epochs=2 --iters_per_epoch=50 --test_tasks=100
    python -m launch.sweep --workdir=/tmp/omniglot --dataset=omniglot \\
        --manual_dir=FOLDER_WITH_ZIPS --epochs=20 --iters_per_epoch=500

By default: every registered learner that builds x the paper's 11 cells x seeds
0,1,2, on --dataset. --workdir is the sweep directory: each run lives in
WORKDIR/<dataset>/<learner>/<cell>/seed<k>/. Re-running the same command skips
finished runs and resumes interrupted ones, so a sweep killed at any point
continues where it stopped. The per-run budget and options are the flags of
launch.train (--budget=paper for the paper's schedule in one word, or --epochs,
--iters_per_epoch, --meta_batch, --val_tasks,
--test_tasks, --nc, ...), the same for every run; --learner_option=NAME=VALUE
goes to every learner, --learner_option=LEARNER:NAME=VALUE to one. At the end
the report (launch.report) is written to WORKDIR/report and Table 1 printed.

--dry_run loads the datasets and marks "impossible" the runs whose spec a split
cannot supply, with the reason; with --launcher=slurm it also prints the sbatch
script it would submit (nothing is submitted or created). Ctrl-C stops the sweep at once (each run in
progress checkpoints; no queued run starts); the same command continues it.
A line per finished run gives runs done/total and the ETA. WORKDIR may be
gs://BUCKET/PATH (gcsfs installed) with the local launcher and --shard; --launcher=slurm
needs a shared POSIX folder.

--shard=K/N runs only shard K of N of the runs (machines sharing WORKDIR, one
shard each; launch.report reads them all). --launcher=slurm submits the runs
that are not done as one SLURM job array (logs and job ids in WORKDIR/slurm),
waits printing progress every 10 s, then reports; the same command again
submits nothing queued or running and resubmits failed runs; --nowait returns
after submitting; --cancel cancels the sweep's jobs:

    python -m launch.sweep --workdir=/shared/sweep --budget=paper --launcher=slurm \\
        --slurm_partition=gpu --slurm_gpus_per_job=1 --slurm_timeout_min=240
"""

from __future__ import annotations

if __name__ == "__main__":  # the command: its first line before the imports below (JAX)
    from .starting import main
    raise SystemExit(main("sweep", __package__))


import re

from absl import flags

from cfsl_jax.training import as_published
from cfsl_jax.training.pack_runs import PackOptions
from cfsl_jax.learners import LEARNERS, options_class, parse_learner_options
from cfsl_jax.runtime import files, locks
from cfsl_jax.runtime.options import names as option_names
from cfsl_jax.protocol.spec import PAPER_GRID

# The library (JAX) is imported once the flags are parsed (``import_library``).
from . import cli, cluster, starting
from .checks import check_data_flags, check_output_dir
from .flag_types import define_list
from . import train as train_cli  # noqa: F401  (defines the per-run flags; --workdir)

define_list("learners", [], f"Learners (default: all of {','.join(LEARNERS)} that build).",
            module=__name__)
define_list("cells", list(PAPER_GRID), "Task cells: paper cells (B3, D8, ...) or "
            "TYPE+NSS; any case.", module=__name__)
# --seeds is launch.train's flag (the seeds of a pack; imported with it): here the grid's seeds.
_DEFAULT_SEEDS = ["0", "1", "2"]


def seeds() -> list[str]:
    """--seeds as typed, or the default 0,1,2."""
    return FLAGS.seeds or _DEFAULT_SEEDS


define_list("datasets", [], "Datasets (default: --dataset).", module=__name__)
flags.DEFINE_integer("workers", None, "Worker processes (default: one per GPU, one on TPU, one "
                     "per CPU core; 0: run in this process).", lower_bound=0)
flags.DEFINE_bool("dry_run", False, "List the runs and their status (with --launcher=slurm: "
                  "also the sbatch script it would submit); run nothing.")
flags.DEFINE_string("pack", "1", "Meta-train the runs that differ only in their seed in packs "
                    "of at most this many, one program each; auto: all the seeds of a group "
                    "(README, \"Packing runs\").")
flags.DEFINE_bool("report", True, "Write the report into WORKDIR/report at the end.")

FLAGS = flags.FLAGS
_SINGULAR = {"learner": "learners", "task": "cells", "seed": "seeds"}


def import_library() -> None:
    """The modules a sweep runs (JAX, orbax, TFDS, matplotlib), imported once absl has parsed
    its flags, inside ``starting.importing`` (as ``train_cli.import_library``)."""
    with starting.importing("sweep"):
        from cfsl_jax.experiments import (report, slurm, slurm_preview, sweep,  # noqa: F401
                                          sweep_plan)


def pack_size() -> int:
    """--pack as a number of runs: an integer >= 1, or auto (the number of --seeds: every
    group's runs; each pack's memory is checked when it compiles, ``packing.check_pack_fits``)."""
    if FLAGS.pack == "auto":
        return len(seeds())
    try:
        size = int(FLAGS.pack)
    except ValueError:
        size = 0
    if size < 1:
        raise cli.UserError(f"--pack={FLAGS.pack}: give an integer >= 1 or auto")
    return size


def sweep_learner_options(pairs: list[str], learners) -> tuple[dict, dict[str, dict]]:
    """--learner_option strings -> (options of every learner, {learner: its own options}):
    ``NAME=VALUE`` goes to every learner (typed as the first of ``learners`` that takes it),
    ``LEARNER:NAME=VALUE`` to one; UserError for a name no learner concerned takes."""
    common, per_learner = [], {}
    for pair in pairs:
        head, sep, rest = pair.partition(":")
        if sep and "=" not in head:
            if head not in LEARNERS:
                raise cli.UserError(f"--learner_option={pair} names unknown learner {head!r}; "
                                    f"valid: {', '.join(LEARNERS)}")
            per_learner.setdefault(head, []).append(rest)
        else:
            common.append(pair)
    typed = {learner: parse_learner_options(learner, own, f"--learner_option for {learner}")
             for learner, own in per_learner.items()}
    values = {}
    for pair in common:
        name = pair.partition("=")[0].strip()
        takers = [learner for learner in learners if name in option_names(options_class(learner))]
        if not takers:
            valid = sorted({n for learner in learners for n in option_names(options_class(learner))})
            raise cli.UserError(f"--learner_option {name}: no learner of the sweep takes it; "
                                f"valid: {', '.join(valid)}")
        values.update(parse_learner_options(takers[0], [pair], f"--learner_option for {takers[0]}"))
    return values, typed


def check_lists() -> None:
    """Each list flag's items, named by the flag as typed (a bad cell is ``--cells``')."""
    from cfsl_jax.data import DATASETS
    from cfsl_jax.protocol.spec import TaskSpec
    for cell in FLAGS.cells:
        try:
            TaskSpec.parse(cell.strip().upper())
        except ValueError as error:
            raise cli.UserError(f"--cells={','.join(FLAGS.cells)}: {error}") from None
    bad = [seed for seed in seeds() if not seed.lstrip("-").isdigit()]
    if bad:
        raise cli.UserError(f"--seeds={','.join(seeds())}: {bad} not integers")
    for flag, valid in (("learners", LEARNERS), ("datasets", DATASETS)):
        unknown = [name for name in FLAGS[flag].value if name not in valid]
        if unknown:
            raise cli.UserError(f"--{flag}={','.join(FLAGS[flag].value)}: unknown "
                                f"{', '.join(unknown)}; "
                                f"valid: {', '.join(valid)}")


def check():
    """(the run configs of this shard, the learners skipped with their reasons, the shard, the
    SLURM options or None), every flag checked; nothing is created or submitted."""
    from cfsl_jax.experiments import sweep_plan
    for singular, plural in _SINGULAR.items():
        if FLAGS[singular].present:
            raise cli.UserError(f"--{singular} is one run's flag; a sweep takes --{plural}")
    if FLAGS.learning_rates:
        raise cli.UserError(f"--learning_rates={','.join(FLAGS.learning_rates)}: launch.train's "
                            f"(a pack of runs at several rates); a sweep runs at one "
                            f"--learning_rate")
    train_cli.require_workdir()
    cluster.check_workdir()
    check_data_flags()
    check_output_dir("workdir", FLAGS.workdir)
    check_lists()
    learners = FLAGS.learners or LEARNERS
    common, per_learner = sweep_learner_options(FLAGS.learner_option, learners)
    base = train_cli.config_from_flags(learner_options=common, per_learner=False)
    for learner in learners:  # --as_published's options, per learner
        preset = as_published.learner_options(FLAGS.as_published, learner)
        preset = {k: v for k, v in preset.items() if k not in common}
        if preset:
            per_learner[learner] = {**preset, **per_learner.get(learner, {})}
    cells = [cell.strip().upper() for cell in FLAGS.cells]
    with cli.user_input(), train_cli.flag_words():  # a cell's spec mistake names its flag
        configs, skipped = sweep_plan.grid(
            base, learners=FLAGS.learners or None, cells=cells,
            seeds=[int(seed) for seed in seeds()], datasets=FLAGS.datasets or None,
            learner_options=per_learner)
    shard = cluster.shard_from_flags()
    slurm_options = cluster.options_from_flags()
    if slurm_options is not None and FLAGS.workers is not None:
        raise cli.UserError("--workers is for --launcher=local (a SLURM job runs one run)")
    pack = pack_size()
    train_cli.check_pack_flags(configs, pack > 1, "applies to packs (--pack=N with N >= 2, or "
                               "auto with two or more --seeds); this sweep trains each run alone")
    if shard:
        configs = sweep_plan.shard(configs, *shard, pack=pack)
    return configs, skipped, shard, slurm_options


def main(argv) -> None:
    from cfsl_jax.experiments import slurm, sweep, sweep_plan
    del argv
    configs, skipped, shard, slurm_options = check()
    for name, reason in skipped.items():
        print(f"skipping learner {name}: it does not build ({reason})")
    if FLAGS.pack == "auto":
        print(f"--pack=auto: packs of up to {pack_size()} runs (every seed of a group; a pack "
              f"that does not fit the device's memory shrinks to the largest that does)")
    if FLAGS.dry_run:
        planned = sweep_plan.plan(configs, FLAGS.workdir, check=True)
        for run, state, detail in planned:
            print(f"{state:10s} {run.name:40s} {run.workdir}" + (f"  ({detail})" if detail else ""))
        counts = sweep_plan.summary([sweep_plan.Outcome(run, state, 0.0, "") for run, state, _ in planned])
        print(f"{sweep_plan.count(len(planned), 'run')}: {counts}")
        for group in sweep.packs([run for run, state, _ in planned
                                  if state not in ("done", "conflict", "impossible")],
                                 pack_size()) if pack_size() > 1 else []:
            print(f"pack of {len(group)}: " + " ".join(run.workdir for run in group))
        if slurm_options is not None:
            cluster.dry_run(slurm.sweep_work(configs, FLAGS.workdir, pack=pack_size()),
                            FLAGS.workdir, slurm_options, list_items=False)
        return
    if slurm_options is not None:
        cluster.run_on_slurm(
            slurm.sweep_work(configs, FLAGS.workdir, pack=pack_size()), FLAGS.workdir,
            slurm_options, slurm_job(sweep.worker_jax_options(FLAGS.workdir)),
            "python -m launch.sweep",
            report=lambda final: _report(), prepare=slurm.prepare_datasets,
            excluded=lambda: local_sweep_locks(FLAGS.workdir))
        cli.write_flagfile(FLAGS.workdir)
        return
    try:
        with sweep_locked(FLAGS.workdir, shard):
            outcomes = sweep.run_sweep(configs, FLAGS.workdir, workers=FLAGS.workers,
                                       pack=pack_size(), pack_options=pack_options())
    except KeyboardInterrupt:
        cli.write_flagfile(FLAGS.workdir)
        raise
    if not any(o.status == "conflict" for o in outcomes):  # not another sweep's folder
        cli.write_flagfile(FLAGS.workdir)
    print(f"[sweep] {FLAGS.workdir}" + (f" shard {FLAGS.shard}" if shard else "")
          + f": {sweep_plan.summary(outcomes)}")
    if any(o.status in ("skipped", "finished") for o in outcomes):
        _report()
    bad = [o for o in outcomes if o.status in ("failed", "conflict", "busy")]
    if bad:
        raise SystemExit(f"{len(bad)} run(s) did not finish: "
                         + ", ".join(f"{o.run.name} ({o.status})" for o in bad))


def pack_options() -> PackOptions:
    """How this sweep's packs meta-train: --steps_per_dispatch, --pack=auto's shrinking,
    --pack_axis."""
    return PackOptions(FLAGS.steps_per_dispatch, FLAGS.pack == "auto", FLAGS.pack_axis)


def slurm_job(jax_options):
    """What each array task of this sweep runs: a whole pack (``--pack``; shrinking to the job's
    device with ``--pack=auto``), or one run."""
    from cfsl_jax.experiments import slurm
    if pack_size() > 1:
        return slurm.PackJob(jax_options, pack_options())
    return slurm.RunJob(jax_options)


def sweep_lock(sweep_dir: str, shard: tuple[int, int] | None) -> tuple[str, str]:
    """(lock file, what it locks) of a sweep (shard K/N): one command at a time runs it."""
    suffix = f"-shard-{shard[0]}-of-{shard[1]}" if shard else ""
    return (locks.path_in(sweep_dir, f".sweep{suffix}.lock"),
            f"sweep {sweep_dir}" + (f" shard {shard[0]}/{shard[1]}" if shard else ""))


_SHARD_LOCK = re.compile(r"\.sweep-shard-(\d+)-of-(\d+)\.lock")


def shard_locks(sweep_dir: str) -> list[tuple[str, str]]:
    """(lock file, what it locks) of each shard of ``sweep_dir`` that has one."""
    return [sweep_lock(sweep_dir, (int(m[1]), int(m[2])))
            for m in map(_SHARD_LOCK.fullmatch, files.listdir(sweep_dir)) if m]


def local_sweep_locks(sweep_dir: str) -> list[tuple[str, str]]:
    """The locks of a local sweep of ``sweep_dir`` (whole or a shard): a SLURM submission into
    it is refused while one is held (its jobs would find the runs the sweep trains busy)."""
    return [sweep_lock(sweep_dir, None), *shard_locks(sweep_dir)]


def sweep_locked(sweep_dir: str, shard: tuple[int, int] | None):
    """The sweep's (shard's) lock, held (``locks.held``): the same shard twice is refused, a
    whole sweep and any shard of it exclude each other (``Busy`` naming the holder), shards
    run beside each other (their purpose; each run is claimed by its own workdir's lock)."""
    def excluded() -> list[tuple[str, str]]:
        return [sweep_lock(sweep_dir, None)] if shard else shard_locks(sweep_dir)
    return locks.held(*sweep_lock(sweep_dir, shard), excluded=excluded)


def _report() -> None:
    """Write the report of every finished run in --workdir (all shards) and print Table 1."""
    if not FLAGS.report:
        return
    from cfsl_jax.experiments import report
    try:
        paths = report.write_report(FLAGS.workdir)
        accuracy = report.aggregate(report.load_results(FLAGS.workdir), "acc")
    except ValueError as error:  # e.g. a cell whose runs differ in more than their seed
        raise cli.UserError(f"the runs are done, but no report was written: {error}; "
                            f"or give --report=false") from None
    for dataset, path in paths["markdown"].items():
        print(f"\nTest accuracy (%) on {dataset}, mean ± std across seeds:\n")
        print(report.markdown(report.table(accuracy, dataset, "acc")))
        print(f"\nfull report: {path}")


def run() -> None:
    cli.run(main, interrupted="sweep interrupted: re-run the same command to continue",
            check=check, library=import_library)
