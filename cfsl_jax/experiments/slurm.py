"""Sweeps and FLUID streams on SLURM: what is not done, as one job array (submitit).

    from cfsl_jax.experiments import slurm, sweep
    options = slurm.SlurmOptions(partition="gpu", gpus_per_job=1, timeout_min=240)
    slurm.check_cluster(options)                   # submitit, sbatch on PATH, the partition
    works = slurm.sweep_work(configs, "/shared/sweep")     # or slurm.fluid_work(config, dir)
    slurm.submit(works, "/shared/sweep", options, slurm.RunJob(jax_options))
    final = slurm.wait(works, "/shared/sweep")     # progress lines until none is queued

Rules:

- A ``Work`` item is one array element: a sweep's run (``RunJob``: exactly what
  a worker of the local pool runs, ``sweep.execute``, with the same jax options
  and compilation cache) or a FLUID stream (``StreamJob``); ``cfsl_jax.experiments.slurm_jobs``
  says how a job handles preemption and time limits.
- ``<workdir>/slurm/`` holds submitit's job files, one log per job
  (``<job id>_0_log.out``, stdout and stderr) and ``jobs.json``: the latest
  job id of every item submitted.
- An item is **done** (its files say so), **queued** or **running** (its job is
  in ``squeue``), **failed** (its job left the queue without its results) or
  **new** (never submitted). States come from ``squeue`` and the files, never
  from ``sacct``, which clusters without accounting lack.
- ``submit`` submits the items that are new or failed, never one that is queued
  or running: the same command twice submits nothing the second time. Two at the
  same moment would both find an item new: a submission (and ``cancel``) holds
  ``<workdir>/slurm/.submit.lock``, and a second one meanwhile is refused
  (``locks.Busy``, naming the first) before it submits anything.
- Up to ``max_timeouts`` requeues after a time limit (preemptions are not counted).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import shutil
import time
from typing import Callable, Mapping, NamedTuple, Sequence

from cfsl_jax.runtime import locks, progress
from cfsl_jax.training import results
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.experiments.slurm_cluster import (  # noqa: F401 (slurm.SlurmOptions, ...)
    OWNED_OPTIONS, QUEUED, SlurmError, SlurmOptions, _command, _failed, check_cluster,
    parse_option, queue)
from cfsl_jax.experiments.slurm_jobs import (PackJob, RunJob, StreamJob, _Job,  # noqa: F401
                                              handle_sigterm)
from cfsl_jax.experiments.sweep_plan import Run, pack_groups, run_dir, status

SLURM_DIR = "slurm"
JOBS_FILE = "jobs.json"
SUBMIT_LOCK = ".submit.lock"  # in SLURM_DIR, held while submitting or cancelling
QUEUE_RETRIES = 6  # squeue failures in a row that ``wait`` rides out (a minute at 10 s)
RUN_STATES: tuple[str, ...] = ("done", "running", "queued", "failed", "new", "conflict")


# -- work items and their records ----------------------------------------------------------------

class Work(NamedTuple):
    """One element of a job array: a sweep's run, or a FLUID stream."""

    name: str
    key: str  # its key in jobs.json (a path relative to the workdir)
    args: tuple  # the job's arguments
    status: Callable[[], str]  # from its files: "done", "conflict", or anything else (to do)


def sweep_work(configs: Sequence[TrainConfig], sweep_dir: str, pack: int = 1) -> list[Work]:
    """The runs of a sweep, as ``RunJob(...)(config_json, workdir)`` jobs; ``pack`` > 1: as
    ``PackJob(...)(config_jsons, workdirs)`` jobs, one per pack (``sweep_plan.pack_groups`` of
    all ``configs``, done runs included, so a pack is the same pack at every submission)."""
    if pack == 1:
        out = []
        for config in configs:
            run = Run(config, run_dir(sweep_dir, config))
            out.append(Work(run.name, os.path.relpath(run.workdir, sweep_dir),
                            (config.to_json(), run.workdir), functools.partial(_run_status, run)))
        return out
    out = []
    for group in pack_groups(configs, pack):
        runs = [Run(config, run_dir(sweep_dir, config)) for config in group]
        out.append(Work(f"pack of {len(runs)}: " + ", ".join(run.name for run in runs),
                        "+".join(os.path.relpath(run.workdir, sweep_dir) for run in runs),
                        ([run.config.to_json() for run in runs], [run.workdir for run in runs]),
                        functools.partial(_pack_status, runs)))
    return out


def _run_status(run: Run) -> str:
    return status(run)[0]


def _pack_status(runs: Sequence[Run]) -> str:
    """"done" when every run of the pack is; "conflict" when one is; else "todo"."""
    found = [status(run)[0] for run in runs]
    if "conflict" in found:
        return "conflict"
    return "done" if all(state == "done" for state in found) else "todo"


def fluid_work(config, workdir: str) -> list[Work]:
    """The streams of a FLUID experiment, as ``StreamJob(...)(config, workdir, index)`` jobs."""
    return [Work(f"stream {index}", f"streams/{index}", (config, workdir, index),
                 functools.partial(_stream_status, config, workdir, index))
            for index in range(config.num_streams)]


def _stream_status(config, workdir: str, index: int) -> str:
    from cfsl_jax.fluid import experiment
    stored = results.read_json(os.path.join(workdir, "results.json"), default={}) or {}
    if len(stored.get("streams", [])) > index:
        return "done"
    return "done" if os.path.exists(experiment.stream_file(workdir, index)) else "todo"


def slurm_dir(workdir: str) -> str:
    return os.path.join(workdir, SLURM_DIR)


def read_jobs(workdir: str) -> dict[str, str]:
    """``{work key: job id}`` of everything submitted from ``workdir``."""
    return results.read_json(os.path.join(slurm_dir(workdir), JOBS_FILE), default={}) or {}


def log_path(workdir: str, job_id: str) -> str:
    """The log (stdout and stderr) of a job: ``<workdir>/slurm/<job id>_0_log.out``."""
    return os.path.join(slurm_dir(workdir), f"{job_id}_0_log.out")


def log_tail(path: str, lines: int = 12) -> str:
    """The last ``lines`` lines of a log ("" if there is none)."""
    if not os.path.isfile(path):
        return ""
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:]).rstrip()


class WorkState(NamedTuple):
    work: Work
    state: str  # one of RUN_STATES
    job: str  # its latest job id ("" if none)


def states(works: Sequence[Work], workdir: str, queued: Mapping[str, str]) -> list[WorkState]:
    """Each item's state, from ``queued`` (``queue()``, read before the files: a job that ends
    in between has written its results already) and its files."""
    jobs = read_jobs(workdir)
    out = []
    for work in works:
        job = jobs.get(work.key, "")
        found = work.status()
        if found in ("done", "conflict"):
            state = found
        elif job in queued:
            state = "queued" if queued[job] in QUEUED else "running"
        else:
            state = "failed" if job else "new"
        out.append(WorkState(work, state, job))
    return out


def counts(work_states: Sequence[WorkState]) -> dict[str, int]:
    found = {name: 0 for name in RUN_STATES}
    for item in work_states:
        found[item.state] += 1
    return found


def progress_line(work_states: Sequence[WorkState], elapsed: float, finished_since: int) -> str:
    """``"slurm: 3 done, 2 running, 1 queued, 0 failed of 8; ETA 4m10s"``; the ETA divides the
    runs left by the rate at which runs finished while waiting."""
    found = counts(work_states)
    left = found["running"] + found["queued"]
    eta = (progress.duration(elapsed / finished_since * left) if finished_since and left
           else "unknown" if left else "0s")
    return (f"slurm: {found['done']} done, {found['running']} running, {found['queued']} "
            f"queued, {found['failed']} failed of {len(work_states)}; ETA {eta}")


# -- submitting, waiting, cancelling -------------------------------------------------------------

def make_executor(workdir: str, options: SlurmOptions, cluster: str = "slurm"):
    """A submitit executor writing under ``<workdir>/slurm`` (``cluster="debug"``: in this
    process, for tests)."""
    import submitit
    executor = submitit.AutoExecutor(folder=slurm_dir(workdir), cluster=cluster,
                                     slurm_max_num_timeout=options.max_timeouts)
    executor.update_parameters(**options.executor_parameters())
    return executor


class Submitted(NamedTuple):
    before: list[WorkState]  # every item's state before submitting
    jobs: dict[str, str]  # name -> job id of the items submitted now
    jobs_objects: list  # submitit jobs submitted now (debug executors run them on .result())


def submit(works: Sequence[Work], workdir: str, options: SlurmOptions, job: _Job,
           executor=None, queued: Mapping[str, str] | None = None,
           prepare: Callable[[list[Work]], None] | None = None,
           log: Callable[[str], None] = print, excluded=tuple) -> Submitted:
    """Submit the items that are new or failed as one job array of ``job`` (``prepare`` runs
    first, with them); returns what it did. Holds the submission lock (``submitting``)."""
    with submitting(workdir, excluded):
        return _submit(works, workdir, options, job, executor, queued, prepare, log)


@contextlib.contextmanager
def submitting(workdir: str, excluded=tuple):
    """``workdir``'s submission lock, held (``locks.held``): a second submission or
    ``cancel`` meanwhile is refused (``locks.Busy``), never queues an item twice; so is this
    one while a lock of ``excluded()`` is held (a local sweep of the same folder). One that is
    refused or fails leaves behind no folder it created (while the folder is empty)."""
    folder = slurm_dir(workdir)
    created = [path for path in (folder, workdir) if not os.path.isdir(path)]  # inner first
    os.makedirs(folder, exist_ok=True)
    try:
        with locks.held(locks.path_in(folder, SUBMIT_LOCK), f"the SLURM submission from "
                        f"{workdir}", excluded=excluded) as me:
            yield me
    except BaseException:
        for path in created:
            with contextlib.suppress(OSError):  # only an empty folder
                os.rmdir(path)
        raise


def _submit(works, workdir, options, job, executor, queued, prepare, log) -> Submitted:
    before = states(works, workdir, queue() if queued is None else queued)
    todo = [item for item in before if item.state in ("new", "failed")]
    for item in before:
        if item.state == "failed":
            tail = log_tail(log_path(workdir, item.job), 5)
            log(f"resubmitting {item.work.name}: its job {item.job} ended without results"
                + (f"; its log ends:\n{_indent(tail)}" if tail else ""))
        elif item.state == "conflict":
            log(f"conflict: {item.work.name} holds a run with another config; use another "
                f"workdir")
    found = counts(before)
    if not todo:
        log(f"slurm: submitted nothing: {found['done']} done, {found['running']} running, "
            f"{found['queued']} queued, {found['conflict']} conflicting of {len(works)}")
        return Submitted(before, {}, [])
    if prepare is not None:
        prepare([item.work for item in todo])
    executor = executor or make_executor(workdir, options)
    said, before_files = io.StringIO(), set(os.listdir(slurm_dir(workdir)))
    try:  # submitit prints a failed sbatch's stderr: into the one error line instead
        with contextlib.redirect_stderr(said):
            jobs = executor.map_array(job, *zip(*[item.work.args for item in todo]))
    except Exception as error:  # submitit's FailedJobError, FailedSubmissionError
        if not type(error).__module__.startswith("submitit"):
            raise
        for name in set(os.listdir(slurm_dir(workdir))) - before_files:  # its job files
            path = os.path.join(slurm_dir(workdir), name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        raise _failed(f"sbatch of {len(todo)} run(s) (nothing was submitted)",
                      said.getvalue() or str(error)) from None
    recorded = read_jobs(workdir)
    recorded.update({item.work.key: j.job_id for item, j in zip(todo, jobs)})
    results.write_json(os.path.join(slurm_dir(workdir), JOBS_FILE), recorded)
    ids = [j.job_id for j in jobs]
    array = ids[0].split("_")[0] if len(set(i.split("_")[0] for i in ids)) == 1 else ", ".join(ids)
    log(f"slurm: submitted {len(todo)} run(s) as job array {array} ({found['new']} new, "
        f"{found['failed']} failed before); {found['running'] + found['queued']} already queued "
        f"or running, {found['done']} done; logs in {slurm_dir(workdir)}")
    return Submitted(before, {item.work.name: j.job_id for item, j in zip(todo, jobs)},
                     list(jobs))


def prepare_datasets(works: Sequence[Work], log: Callable[[str], None] = print) -> None:
    """Load (preparing on first use) each dataset on disk of the sweep runs ``works`` here,
    once, so that jobs never prepare the same TFDS dataset at the same time (synthetic data is
    made by each run)."""
    from cfsl_jax.experiments import sweep
    configs = [TrainConfig(**config) for work in works  # a run: one config; a pack: a list
               for config in (work.args[0] if isinstance(work.args[0], list) else [work.args[0]])]
    sources = {(c.dataset, c.data_dir, c.manual_dir, repr(sorted(c.dataset_options.items()))): c
               for c in configs if c.dataset != "synthetic"}
    for config in sources.values():
        log(f"loading (preparing on first use) {config.dataset} ...")
        error = sweep.prepare_data(config.to_json())
        if error:
            raise UserError(f"--dataset={config.dataset}: {error}")


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())


def wait(works: Sequence[Work], workdir: str, interval: float = 10.0,
         queue_fn: Callable[[], Mapping[str, str]] = queue, log: Callable[[str], None] = print,
         clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep) -> list[WorkState]:
    """Poll until nothing is queued or running, printing a progress line each ``interval``
    seconds and a failed item's name with its last log lines; returns the states. A failing
    ``squeue`` (a controller restarting) is asked again, up to ``QUEUE_RETRIES`` times in a
    row: never read as an empty queue, which would count every running item failed."""
    started = clock()
    done_before = None
    reported: set[str] = set()
    misses = 0
    while True:
        try:
            queued = queue_fn()
        except SlurmError as error:
            misses += 1
            if misses > QUEUE_RETRIES:
                raise
            log(f"slurm: {error}; asking again in {interval:.0f} s ({misses}/{QUEUE_RETRIES})")
            sleep(interval)
            continue
        misses = 0
        current = states(works, workdir, queued)
        done = counts(current)["done"]
        done_before = done if done_before is None else done_before
        for item in current:
            if item.state == "failed" and item.work.name not in reported:
                reported.add(item.work.name)
                tail = log_tail(log_path(workdir, item.job))
                log(f"failed: {item.work.name} (job {item.job}, log "
                    f"{log_path(workdir, item.job)})" + (f":\n{_indent(tail)}" if tail else ""))
        log(progress_line(current, clock() - started, done - done_before))
        found = counts(current)
        if not found["running"] and not found["queued"]:
            return current
        sleep(interval)


def cancel(works: Sequence[Work], workdir: str, queued: Mapping[str, str] | None = None,
           command: Callable[[Sequence[str]], str] = _command,
           log: Callable[[str], None] = print) -> list[str]:
    """``scancel`` the jobs of ``works`` that are queued or running; returns their ids."""
    with submitting(workdir):  # not while a submission is recording its jobs
        current = states(works, workdir, queue() if queued is None else queued)
        ids = [item.job for item in current if item.state in ("queued", "running")]
        if ids:
            command(["scancel", *ids])
    log(f"slurm: cancelled {len(ids)} job(s)" + (f": {' '.join(ids)}" if ids else "")
        + "; the same command without --cancel submits them again (runs resume)")
    return ids
