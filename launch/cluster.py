"""The launcher flags of launch.sweep and launch.fluid: --launcher, --shard and the --slurm_*
flags (cfsl_jax.experiments.slurm), and the SLURM side of a command: submit, wait, --nowait, --cancel."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from absl import flags

from cfsl_jax.runtime import files
from cfsl_jax.runtime.errors import UserError

if TYPE_CHECKING:  # imported where used: these flags are defined, and checked, without JAX
    from cfsl_jax.experiments import slurm

flags.DEFINE_enum("launcher", "local", ["local", "slurm"], "local: worker processes on this "
                  "machine; slurm: one SLURM job array of the runs not done (pip install "
                  "'cfsl_jax[slurm]').")
flags.DEFINE_string("shard", None, "K/N: run only shard K of N of the runs (local launcher; "
                    "machines sharing the workdir, one shard each).")
flags.DEFINE_bool("nowait", False, "slurm: return after submitting (print the job ids).")
flags.DEFINE_bool("cancel", False, "slurm: cancel this sweep's queued and running jobs.")
flags.DEFINE_string("slurm_partition", None, "slurm: partition (default: the cluster's).")
flags.DEFINE_integer("slurm_max_parallel", 256, "slurm: jobs of the array running at once.",
                     lower_bound=1)
flags.DEFINE_integer("slurm_timeout_min", 240, "slurm: time limit of one job in minutes; a run "
                     "longer than that is checkpointed and requeued.", lower_bound=1)
flags.DEFINE_integer("slurm_max_timeouts", 10, "slurm: requeues of a run after its time "
                     "limit (preemptions are not counted).", lower_bound=0)
flags.DEFINE_integer("slurm_cpus_per_job", 1, "slurm: CPUs of one job.", lower_bound=1)
flags.DEFINE_integer("slurm_gpus_per_job", 0, "slurm: GPUs of one job.", lower_bound=0)
flags.DEFINE_float("slurm_mem_gb", None, "slurm: memory of one job in GB (default: the "
                   "partition's).")
flags.DEFINE_string("slurm_account", None, "slurm: account to charge.")
flags.DEFINE_string("slurm_qos", None, "slurm: quality of service.")
flags.DEFINE_multi_string("slurm_setup", [], "slurm: a shell line run before each job "
                          "(repeatable), e.g. --slurm_setup='module load cuda'.")
flags.DEFINE_multi_string("slurm_option", [], "slurm: any other sbatch option KEY=VALUE "
                          "(repeatable), e.g. --slurm_option=constraint=a100.")

FLAGS = flags.FLAGS
_SLURM_ONLY = ("nowait", "cancel", "slurm_partition", "slurm_max_parallel", "slurm_timeout_min",
               "slurm_max_timeouts", "slurm_cpus_per_job", "slurm_gpus_per_job", "slurm_mem_gb",
               "slurm_account", "slurm_qos", "slurm_setup", "slurm_option")


def shard_from_flags() -> tuple[int, int] | None:
    """(K, N) of --shard, or None; UserError for a malformed value or with --launcher=slurm."""
    if FLAGS.shard is None:
        return None
    from cfsl_jax.experiments import sweep_plan
    shard = sweep_plan.parse_shard(FLAGS.shard)
    if FLAGS.launcher != "local":
        raise UserError(f"--shard={FLAGS.shard} is for --launcher=local (machines without "
                        f"a scheduler); --launcher=slurm submits every run as one array")
    return shard


def check_workdir() -> None:
    """--launcher=slurm refuses a URL --workdir (first: no package makes it work)."""
    if FLAGS.launcher == "slurm" and files.is_url(FLAGS.workdir):
        raise UserError(f"--workdir={FLAGS.workdir}: --launcher=slurm needs a shared POSIX "
                        f"folder (submitit's job files and logs); a gs:// workdir runs with "
                        f"--launcher=local (and --shard=K/N)")


def options_from_flags() -> slurm.SlurmOptions | None:
    """The --slurm_* flags (None with --launcher=local, which refuses them), validated against
    the cluster before anything is submitted."""
    if FLAGS.launcher != "slurm":
        given = [f"--{name}" for name in _SLURM_ONLY if FLAGS[name].present]
        if given:
            raise UserError(f"{', '.join(given)}: only with --launcher=slurm")
        return None
    from cfsl_jax.experiments import slurm
    options = slurm.SlurmOptions(
        partition=FLAGS.slurm_partition, max_parallel=FLAGS.slurm_max_parallel,
        timeout_min=FLAGS.slurm_timeout_min, max_timeouts=FLAGS.slurm_max_timeouts,
        cpus_per_job=FLAGS.slurm_cpus_per_job, gpus_per_job=FLAGS.slurm_gpus_per_job,
        mem_gb=FLAGS.slurm_mem_gb, account=FLAGS.slurm_account, qos=FLAGS.slurm_qos,
        setup=tuple(FLAGS.slurm_setup),
        options=tuple(slurm.parse_option(text) for text in FLAGS.slurm_option))
    slurm.check_cluster(options)
    return options


def dry_run(works: Sequence[slurm.Work], workdir: str, options: slurm.SlurmOptions,
            list_items: bool = True) -> None:
    """--dry_run --launcher=slurm: print each item's state (``list_items``) and the sbatch
    script a submission would send (nothing submitted, nothing created)."""
    from cfsl_jax.experiments import slurm_preview
    print(slurm_preview.preview(works, workdir, options, list_items=list_items))


def run_on_slurm(works: Sequence[slurm.Work], workdir: str, options: slurm.SlurmOptions,
                 job, command: str, report: Callable[[list], None],
                 prepare: Callable[[list], None] | None = None, excluded=tuple) -> None:
    """Submit (or --cancel) ``works`` as ``job``s, then wait printing progress and call
    ``report`` with the final states -- unless --nowait; exits non-zero when one failed.
    ``command`` names the command in messages; ``excluded``: the locks of local commands
    that refuse the submission while held (``slurm.submitting``)."""
    from cfsl_jax.experiments import slurm
    if FLAGS.cancel:
        slurm.cancel(works, workdir)
        return
    submitted = slurm.submit(works, workdir, options, job, prepare=prepare, excluded=excluded)
    if submitted.jobs:
        print("jobs: " + ", ".join(f"{name}={job_id}" for name, job_id in submitted.jobs.items()))
    if FLAGS.nowait:
        print(f"not waiting (--nowait): watch with the same command, which submits nothing "
              f"that is queued or running; cancel with {command} ... --cancel")
        return
    try:
        final = slurm.wait(works, workdir)
    except slurm.SlurmError as error:  # squeue failed while watching: the jobs are not touched
        raise slurm.SlurmError(f"{error}; its jobs may still be queued or running: re-run the "
                               "same command to watch them") from None
    except KeyboardInterrupt:
        raise KeyboardInterrupt(
            "stopped waiting; the SLURM jobs keep running: re-run the same command to watch "
            "them (it submits nothing that is queued or running), add --cancel to cancel "
            "them") from None
    report(final)
    failed = [item for item in final if item.state in ("failed", "conflict")]
    if failed:
        raise SystemExit(f"{len(failed)} run(s) did not finish: "
                         + ", ".join(f"{item.work.name} ({item.state})" for item in failed)
                         + "; re-run the same command to resubmit the failed ones")
