"""Sweeps on SLURM (cfsl_jax.experiments.slurm, launch.sweep --launcher=slurm) and in shards.

Without SLURM: the submission logic (states from ``squeue`` and the files, what is
resubmitted, the progress line) on real run directories, a run through submitit's debug
executor (in this process), two shards that complete a grid between them, and every bad
input refused in one line before anything is submitted (fake ``sbatch``/``sinfo`` on PATH).

Marked ``slurm``: a tiny sweep through ``--launcher=slurm`` on a real cluster
(``tests/slurm/start_cluster.sh``; ``.ci/run`` starts one): every run finishes with the local
launcher's numbers, the same command again submits nothing, and a job preempted mid-training
(``scancel --signal=USR2``) is requeued and resumes to the uninterrupted run's results.
Elsewhere these skip with the reason; with ``CFSL_REQUIRE_SLURM=1`` (CI) a missing cluster
fails them.
"""

import dataclasses
import getpass
import os
import re
import shutil
import subprocess
import sys
import time

import jax
import pytest

from cfsl_jax.training import results
from cfsl_jax.experiments import slurm, sweep, sweep_plan
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.fluid import experiment
from cfsl_jax.experiments.verify import verify
from conftest import TEST_PRECISION, compile_unoptimised
from test_cli import assert_error, run_cases

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = TrainConfig(
    learner="protonets", learner_options={"filters": 8}, dataset="synthetic",
    dataset_options={"num_classes": 60, "samples_per_class": 8},
    spec_overrides={"nc": 3, "kt": 2}, epochs=2, iters_per_epoch=30, meta_batch=2,
    val_tasks=4, test_tasks=4, eval_batch=4, keep_best=2, log_every=2)
TINY_FLAGS = ["--learners=protonets", "--learner_option=filters=8",
              "--dataset_option=num_classes=60", "--dataset_option=samples_per_class=8",
              "--nc=3", "--kt=2", "--epochs=2", "--iters_per_epoch=30", "--meta_batch=2",
              "--val_tasks=4", "--test_tasks=4", "--eval_batch=4", "--keep_best=2",
              "--log_every=2", "--report=false"]
COMPARED = ("acc_mean", "acc_std", "ce_mean", "ce_std")


# The runs made without a cluster (shards, submitit's debug executor, the states of real run
# folders) need finished runs, not long ones: 3 steps an epoch instead of TINY's 30.
SHORT = dataclasses.replace(TINY, iters_per_epoch=3)


def tiny_grid(cells=("B2", "C2"), seeds=(0, 1), base=TINY):
    return sweep_plan.grid(base, ["protonets"], cells, seeds)[0]


def finished(workdir):
    return results.read_json(os.path.join(workdir, "results.json"))


def assert_same_results(a, b):
    assert a["task_fingerprint"] == b["task_fingerprint"]
    assert {k: a["test"][k] for k in COMPARED} == {k: b["test"][k] for k in COMPARED}


@pytest.fixture(scope="module")
def optimised_programs():
    """The SLURM jobs and the local runs they are compared with number for number compile at
    XLA's default level: each runs 60 steps, which -O0's code runs about 3x slower than it
    compiles faster. (The 6-step runs without a cluster compile at the suite's -O0.)"""
    unoptimised = jax.config.values["jax_disable_most_optimizations"]
    compile_unoptimised(False)
    yield
    compile_unoptimised(unoptimised)


# -- without SLURM ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    """A 2-run grid (B2, seeds 0 and 1; SHORT runs) done by the local launcher as two shards,
    here."""
    sweep_dir = str(tmp_path_factory.mktemp("local_sweep"))
    configs = tiny_grid(cells=("B2",), base=SHORT)
    first = sweep.run_sweep(sweep_plan.shard(configs, 1, 2), sweep_dir, workers=0)
    after_first = len([1 for c in configs
                       if os.path.exists(os.path.join(sweep_plan.run_dir(sweep_dir, c),
                                                      "results.json"))])
    second = sweep.run_sweep(sweep_plan.shard(configs, 2, 2), sweep_dir, workers=0)
    return sweep_dir, configs, first, second, after_first


def test_two_shards_complete_the_grid_between_them(local_sweep):
    sweep_dir, configs, first, second, after_first = local_sweep
    assert after_first == 1
    names = [o.run.name for o in first] + [o.run.name for o in second]
    assert sorted(names) == sorted(sweep_plan.Run(c, "").name for c in configs)  # disjoint, complete
    assert {o.status for o in first + second} == {"finished"}
    assert [s for _, s, _ in sweep_plan.plan(configs, sweep_dir)] == ["done"] * 2


def test_shards_are_round_robin_over_the_plan_and_refuse_bad_values():
    configs = list(range(7))
    assert [sweep_plan.shard(configs, k, 3) for k in (1, 2, 3)] == [[0, 3, 6], [1, 4], [2, 5]]
    assert sweep_plan.parse_shard(" 2/3 ") == (2, 3)
    for text, message in (("3/2", "K must be 1 to N=2"), ("0/2", "K must be 1 to N=2"),
                          ("x", "not K/N"), ("1/0", "N must be >= 1"), ("1/2/3", "not K/N")):
        with pytest.raises(UserError, match=message):
            sweep_plan.parse_shard(text)


def test_sbatch_options_are_checked_and_passed_through():
    assert slurm.parse_option("constraint=a100") == ("constraint", "a100")
    assert slurm.parse_option("mail_type=END") == ("mail-type", "END")
    for text in ("constraint", "=a100", "constraint=", "Bad Key=1"):
        with pytest.raises(UserError, match="is not KEY=VALUE"):
            slurm.parse_option(text)
    with pytest.raises(UserError, match="sets --time itself; use --slurm_timeout_min"):
        slurm.SlurmOptions(options=(("time", "10"),)).check()
    with pytest.raises(UserError, match="--slurm_max_parallel=0: must be >= 1"):
        slurm.SlurmOptions(max_parallel=0).check()
    options = slurm.SlurmOptions(partition="gpu", max_parallel=4, timeout_min=30, gpus_per_job=1,
                                 mem_gb=16, setup=("module load cuda",),
                                 options=(("constraint", "a100"),))
    assert options.executor_parameters() == dict(
        name="cfsl", timeout_min=30, cpus_per_task=1, slurm_array_parallelism=4,
        stderr_to_stdout=True, gpus_per_node=1, mem_gb=16, slurm_partition="gpu",
        slurm_setup=["module load cuda"], slurm_additional_parameters={"constraint": "a100"})


def test_partition_is_checked_against_sinfo():
    def command(args):
        assert args[0] == "sinfo"
        return "debug*\ngpu\n"

    def which(tool):  # SLURM's commands installed (also on a machine without them)
        return f"/usr/bin/{tool}"
    slurm.check_cluster(slurm.SlurmOptions(partition="gpu"), which=which, command=command)
    with pytest.raises(UserError, match="--slurm_partition=a100: no such partition; sinfo "
                                        "lists debug, gpu"):
        slurm.check_cluster(slurm.SlurmOptions(partition="a100"), which=which, command=command)
    with pytest.raises(UserError, match="sbatch, squeue, scancel, sinfo, srun not found on PATH"):
        slurm.check_cluster(slurm.SlurmOptions(), which=lambda tool: None)


def _record(sweep_dir, jobs):
    results.write_json(os.path.join(sweep_dir, "slurm", "jobs.json"), jobs)


def test_states_come_from_squeue_and_the_files(local_sweep, tmp_path):
    done_dir = local_sweep[0]
    configs = tiny_grid(base=SHORT)  # B2 seed 0 (done in done_dir), C2 seed 0, B2 seed 1, C2 s. 1
    sweep_dir = str(tmp_path)
    shutil.copytree(sweep_plan.run_dir(done_dir, configs[0]), sweep_plan.run_dir(sweep_dir, configs[0]))
    runs = [sweep_plan.Run(c, sweep_plan.run_dir(sweep_dir, c)) for c in configs]
    works = slurm.sweep_work(configs, sweep_dir)
    key = [os.path.relpath(r.workdir, sweep_dir) for r in runs]
    assert [w.key for w in works] == key and [w.name for w in works] == [r.name for r in runs]
    _record(sweep_dir, {key[0]: "7_0", key[1]: "7_1", key[2]: "7_2"})
    queued = {"7_1": "RUNNING", "7_0": "COMPLETING", "9_0": "PENDING"}
    found = slurm.states(works, sweep_dir, queued)
    assert [(s.state, s.job) for s in found] == [("done", "7_0"), ("running", "7_1"),
                                                  ("failed", "7_2"), ("new", "")]
    assert [s.state for s in slurm.states(works, sweep_dir, {"7_1": "PENDING",
                                                            "7_2": "REQUEUED"})] == [
        "done", "queued", "queued", "new"]
    assert slurm.progress_line(found, 100.0, 1) == (
        "slurm: 1 done, 1 running, 0 queued, 1 failed of 4; ETA 1m40s")
    assert slurm.progress_line(found, 100.0, 0).endswith("ETA unknown")

    # What a re-run submits: the failed and the new run, never the running one.
    class Recorder:
        def map_array(self, fn, config_jsons, workdirs):
            self.workdirs = workdirs
            return [type("Job", (), {"job_id": f"8_{i}"})() for i in range(len(workdirs))]

    recorder, lines = Recorder(), []
    with open(slurm.log_path(sweep_dir, "7_2"), "w") as f:
        f.write("".join(f"line {i}\n" for i in range(20)) + "RuntimeError: boom\n")
    prepared = []
    submitted = slurm.submit(works, sweep_dir, slurm.SlurmOptions(), slurm.RunJob({}),
                             executor=recorder, queued=queued, prepare=prepared.append,
                             log=lines.append)
    assert recorder.workdirs == (runs[2].workdir, runs[3].workdir)
    assert prepared == [[works[2], works[3]]]
    assert submitted.jobs == {runs[2].name: "8_0", runs[3].name: "8_1"}
    assert slurm.read_jobs(sweep_dir) == {key[0]: "7_0", key[1]: "7_1", key[2]: "8_0",
                                          key[3]: "8_1"}
    assert lines[0].startswith(f"resubmitting {runs[2].name}: its job 7_2 ended without "
                               f"results; its log ends:") and lines[0].endswith("boom")
    assert "submitted 2 run(s) as job array 8 (1 new, 1 failed before); 1 already queued or " \
           "running, 1 done" in lines[-1]

    # Waiting: a failed run is shown with its log's last lines, then the loop ends.
    polls = iter([{"8_0": "RUNNING", "8_1": "PENDING", "7_1": "RUNNING"}, {}])
    lines.clear()
    final = slurm.wait(works, sweep_dir, interval=0, queue_fn=lambda: next(polls),
                       log=lines.append, sleep=lambda s: None)
    assert [s.state for s in final] == ["done", "failed", "failed", "failed"]
    assert lines[0] == "slurm: 1 done, 2 running, 1 queued, 0 failed of 4; ETA unknown"
    assert lines[1].startswith(f"failed: {runs[1].name} (job 7_1, log ")
    assert lines[-1] == "slurm: 1 done, 0 running, 0 queued, 3 failed of 4; ETA 0s"

    # A failing squeue while waiting is asked again, never read as an empty queue (which would
    # count the running runs failed); QUEUE_RETRIES failures in a row end the wait.
    def flaky(answers):
        def ask():
            answer = next(answers)
            if isinstance(answer, Exception):
                raise answer
            return answer
        return ask

    down = slurm.SlurmError("squeue (exit 1) failed: slurm_load_jobs error")
    lines.clear()
    final = slurm.wait(works, sweep_dir, interval=0, queue_fn=flaky(iter(
        [down, down, {"8_0": "RUNNING", "8_1": "PENDING"}, down, {}])), log=lines.append,
        sleep=lambda s: None)
    lines = [line for line in lines if line.startswith("slurm: ")]  # not the failed runs' logs
    assert [line.split(";")[0] for line in lines] == [
        "slurm: squeue (exit 1) failed: slurm_load_jobs error"] * 2 + [
        "slurm: 1 done, 1 running, 1 queued, 1 failed of 4"] + [
        "slurm: squeue (exit 1) failed: slurm_load_jobs error"] + [
        "slurm: 1 done, 0 running, 0 queued, 3 failed of 4"]
    assert lines[0].endswith("asking again in 0 s (1/6)") and lines[3].endswith("(1/6)")
    with pytest.raises(slurm.SlurmError, match="slurm_load_jobs error"):
        slurm.wait(works, sweep_dir, interval=0, queue_fn=flaky(iter([down] * 7)),
                   log=lines.append, sleep=lambda s: None)

    cancelled = []
    assert slurm.cancel(works, sweep_dir, queued={"8_0": "RUNNING", "8_1": "PENDING"},
                        command=cancelled.append, log=lines.append) == ["8_0", "8_1"]
    assert cancelled == [["scancel", "8_0", "8_1"]]


def test_a_run_through_submitits_debug_executor_equals_the_local_run(local_sweep, tmp_path):
    """The job a SLURM array element runs (slurm.RunJob), run by submitit in this process."""
    done_dir, configs, *_ = local_sweep
    sweep_dir = str(tmp_path)
    options = slurm.SlurmOptions()
    executor = slurm.make_executor(sweep_dir, options, cluster="debug")
    works = slurm.sweep_work(configs[:1], sweep_dir)
    submitted = slurm.submit(works, sweep_dir, options,
                             slurm.RunJob(sweep.worker_jax_options(sweep_dir)),
                             executor=executor, queued={})
    (job,) = submitted.jobs_objects
    assert job.result().startswith("test acc")
    assert_same_results(finished(sweep_plan.run_dir(sweep_dir, configs[0])),
                        finished(sweep_plan.run_dir(done_dir, configs[0])))
    again = slurm.submit(works, sweep_dir, options, slurm.RunJob({}), executor=executor,
                         queued={})
    assert again.jobs == {} and [s.state for s in again.before] == ["done"]


def test_a_pack_through_submitits_debug_executor_is_one_job_for_its_runs(local_sweep, tmp_path,
                                                                       monkeypatch):
    """With --pack, an array element runs a whole pack (slurm.PackJob): one job, every run of
    it finished with the local run's test tasks, and the same command submits nothing again."""
    done_dir, configs, *_ = local_sweep
    sweep_dir = str(tmp_path)
    options = slurm.SlurmOptions()
    executor = slurm.make_executor(sweep_dir, options, cluster="debug")
    from cfsl_jax.training import packing
    packed, pack_fn = [], packing._meta_train_pack
    monkeypatch.setattr(packing, "_meta_train_pack",
                        lambda learner, splits, group, *a: packed.append(len(group))
                        or pack_fn(learner, splits, group, *a))
    works = slurm.sweep_work(configs, sweep_dir, pack=2)
    assert len(works) == 1 and works[0].name.startswith("pack of 2: ")
    submitted = slurm.submit(works, sweep_dir, options,
                             slurm.PackJob(sweep.worker_jax_options(sweep_dir)),
                             executor=executor, queued={}, prepare=slurm.prepare_datasets)
    (job,) = submitted.jobs_objects
    assert job.result() == "2 runs finished"
    assert packed == [2]  # one program for both runs, not each alone
    for config in configs:
        ours = finished(sweep_plan.run_dir(sweep_dir, config))
        theirs = finished(sweep_plan.run_dir(done_dir, config))
        assert ours["task_fingerprint"] == theirs["task_fingerprint"]
    again = slurm.submit(works, sweep_dir, options, slurm.PackJob({}), executor=executor,
                         queued={})
    assert again.jobs == {} and [s.state for s in again.before] == ["done"]


def _fake_slurm_bin(tmp_path):
    """sbatch/squeue/scancel/srun that record a call and fail, and an sinfo that lists debug."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sbatch", "squeue", "scancel", "srun"):
        (bin_dir / tool).write_text(f"#!/bin/sh\ntouch {tmp_path}/called_{tool}\nexit 1\n")
    (bin_dir / "sinfo").write_text("#!/bin/sh\necho 'debug*'\n")
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    return bin_dir


def test_bad_input_is_one_line_before_anything_is_submitted(tmp_path):
    bin_dir = _fake_slurm_bin(tmp_path)
    blocked = tmp_path / "blocked"
    (blocked / "submitit").mkdir(parents=True)
    (blocked / "submitit" / "__init__.py").write_text("raise ImportError('not installed')\n")
    workdir = str(tmp_path / "sweep")
    base = [f"--workdir={workdir}", "--cells=B2", "--seeds=0", *TINY_FLAGS]
    slurm_flags = [*base, "--launcher=slurm"]
    path = f"{bin_dir}:{os.environ['PATH']}"
    cases = [
        ([*slurm_flags, "--slurm_partition=gpu"],
         "--slurm_partition=gpu: no such partition; sinfo lists debug"),
        ([*base, "--shard=3/2"], "--shard=3/2: K must be 1 to N=2"),
        ([*base, "--shard=x"], "--shard=x: not K/N"),
        ([*slurm_flags, "--shard=1/2"], "--shard=1/2 is for --launcher=local"),
        ([*slurm_flags, "--slurm_max_parallel=0"], "--slurm_max_parallel=0"),
        ([*slurm_flags, "--slurm_option=constraint"], "--slurm_option='constraint' is not "
                                                      "KEY=VALUE"),
        ([*slurm_flags, "--slurm_option=array=0-3"], "the launcher sets --array itself"),
        ([*base, "--slurm_partition=debug"], "--slurm_partition: only with --launcher=slurm"),
        ([*slurm_flags[1:], "--workdir=gs://bucket/sweep"],
         "--workdir=gs://bucket/sweep: --launcher=slurm needs a shared POSIX folder"),
    ]
    outcomes = run_cases("sweep", [argv for argv, _ in cases], env={"PATH": path})
    for outcome, (_, expected) in zip(outcomes, cases):
        assert_error(outcome, expected)
    (no_sbatch,) = run_cases("sweep", [slurm_flags], env={"PATH": os.path.dirname(sys.executable)})
    assert_error(no_sbatch, "--launcher=slurm: sbatch, squeue, scancel, sinfo, srun not found "
                            "on PATH")
    (no_submitit,) = run_cases("sweep", [slurm_flags], env={
        "PATH": path, "PYTHONPATH": f"{blocked}:{os.environ.get('PYTHONPATH', '')}"})
    assert_error(no_submitit, "--launcher=slurm needs submitit: pip install 'cfsl_jax[slurm]'")
    assert not os.path.exists(workdir)
    assert not list(tmp_path.glob("called_*"))
    # a local sweep of the folder runs: its runs would be busy for the jobs (library-level:
    # tests/test_integrity_exclusion.py)
    from test_integrity import holder
    os.makedirs(workdir)
    local = holder(os.path.join(workdir, ".sweep.lock"))
    try:
        (beside,) = run_cases("sweep", [slurm_flags], env={"PATH": path})
    finally:
        local.kill()
        local.wait()
    assert_error(beside, f"the SLURM submission from {workdir} cannot run while sweep "
                         f"{workdir} runs: it is in use by host ")
    assert not list(tmp_path.glob("called_*"))  # nothing asked of SLURM, not even squeue
    assert not os.path.exists(os.path.join(workdir, "slurm"))  # nor a folder for its jobs
    # SLURM itself refuses: squeue fails (its controller down), then sbatch (a bad account)
    (down,) = run_cases("sweep", [slurm_flags], env={"PATH": path})
    assert_error(down, f"squeue -h -r -u {getpass.getuser()} -o %i|%T (exit 1) failed: no "
                       f"output (is SLURM up? sinfo, squeue)")
    (bin_dir / "squeue").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission "
                                    "failed: Invalid account' >&2\nexit 1\n")
    (refused,) = run_cases("sweep", [slurm_flags], env={"PATH": path})
    assert_error(refused, "sbatch of 1 run(s) (nothing was submitted) failed: sbatch: error: "
                          "Batch job submission failed: Invalid account")
    # no job file left, no jobs.json, no lock: not even the folder, which it created
    assert not os.path.exists(os.path.join(workdir, "slurm"))


def test_a_fluid_submission_while_a_local_fluid_run_writes_the_workdir_is_refused(tmp_path):
    from test_integrity import holder
    bin_dir, workdir = _fake_slurm_bin(tmp_path), tmp_path / "fluid"
    workdir.mkdir()
    local = holder(str(workdir / ".lock"))  # launch.fluid's workdir lock (locks.workdir)
    try:
        (beside,) = run_cases("fluid", [[f"--workdir={workdir}", "--preset=small",
                                         "--method=ncm", "--launcher=slurm"]],
                              env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    finally:
        local.kill()
        local.wait()
    assert_error(beside, f"the SLURM submission from {workdir} cannot run while workdir "
                         f"{workdir} runs: it is in use by host ")
    assert not list(tmp_path.glob("called_*"))
    assert not os.path.exists(workdir / "slurm")  # refused before it wrote anything


# -- on a real SLURM cluster --------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    """A SLURM cluster this user can submit to, or a skip (a failure with CFSL_REQUIRE_SLURM=1)."""
    reason = ""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        reason = "SLURM's commands are not installed (apt-get install slurm-wlm munge)"
    else:
        result = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
        states = result.stdout.split()
        if result.returncode or not {"idle", "mixed", "allocated"} & set(states):
            reason = (f"no SLURM node is up (sinfo: {result.stderr.strip() or states}); start "
                      f"one with tests/slurm/start_cluster.sh")
    if reason:
        if os.environ.get("CFSL_REQUIRE_SLURM", "") not in ("", "0"):
            pytest.fail(f"CFSL_REQUIRE_SLURM is set but {reason}")
        pytest.skip(reason)


def command(module, workdir, *flags):
    """``python -m module --workdir --launcher=slurm flags``, compiling as this process does:
    at its precision, into its compilation cache (the flag's default is the user's cache), so
    that the jobs load the programs the local runs compiled instead of compiling them again."""
    cache = jax.config.values["jax_compilation_cache_dir"]
    unoptimised = jax.config.values["jax_disable_most_optimizations"]
    env = {**os.environ, "JAX_DISABLE_MOST_OPTIMIZATIONS": "1" if unoptimised else "0",
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "CFSL_PROGRESS": "1"}
    return subprocess.run([sys.executable, "-m", module, f"--workdir={workdir}",
                           "--launcher=slurm", f"--precision={TEST_PRECISION}",
                           f"--compilation_cache_dir={cache}", *flags], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def sweep_command(sweep_dir, *flags):
    return command("launch.sweep", sweep_dir, *TINY_FLAGS, *flags)


@pytest.mark.slurm
def test_a_slurm_sweep_equals_the_local_one_with_a_job_preempted_and_a_rerun_submits_nothing(
        cluster, optimised_programs, tmp_path_factory, tmp_path):
    """Two runs as one array; run 0's job gets SIGUSR2 (as 90 s before a time limit) as soon as
    it trains: it checkpoints the step reached, is requeued and resumes. Both runs equal the
    local launcher's, the preempted one verifies (MATCH), and the same command submits
    nothing."""
    done_dir = str(tmp_path_factory.mktemp("local_runs"))
    configs = tiny_grid(cells=("B2",))  # TINY's 60 steps: long enough to preempt a job
    assert {o.status for o in sweep.run_sweep(configs, done_dir, workers=0)} == {"finished"}
    sweep_dir = str(tmp_path / "sweep")
    flags = ["--cells=B2", "--seeds=0,1", "--slurm_partition=debug", "--slurm_max_parallel=2"]
    submitted = sweep_command(sweep_dir, *flags, "--nowait")
    assert submitted.returncode == 0, submitted.stdout[-3000:] + submitted.stderr[-3000:]
    assert "slurm: submitted 2 run(s) as job array" in submitted.stdout
    key = os.path.relpath(sweep_plan.run_dir(sweep_dir, configs[0]), sweep_dir)
    job = slurm.read_jobs(sweep_dir)[key]
    log = slurm.log_path(sweep_dir, job)
    deadline = time.monotonic() + 300
    while "[train] 1/60 steps" not in (open(log).read() if os.path.exists(log) else ""):
        assert time.monotonic() < deadline, f"the job did not start training: {log}"
        time.sleep(0.2)
    subprocess.run(["scancel", "--signal=USR2", job], check=True)

    waited = sweep_command(sweep_dir, *flags)
    assert waited.returncode == 0, waited.stdout[-3000:] + waited.stderr[-3000:]
    assert "slurm: submitted nothing" in waited.stdout  # queued or running: not resubmitted
    assert "slurm: 2 done, 0 running, 0 queued, 0 failed of 2; ETA 0s" in waited.stdout
    text = open(log).read()
    assert "Caught signal SIGUSR2" in text and f"Requeued job {job}" in text
    reached = re.search(r"interrupted at step (\d+) of 60; checkpointed at step (\d+)", text)
    assert reached and 0 < int(reached.group(1)) == int(reached.group(2)) < 60, text[-3000:]
    for config in configs:
        assert_same_results(finished(sweep_plan.run_dir(sweep_dir, config)),
                            finished(sweep_plan.run_dir(done_dir, config)))
    assert verify(sweep_plan.run_dir(sweep_dir, configs[0])) == []  # launch.verify's MATCH

    jobs = slurm.read_jobs(sweep_dir)
    again = sweep_command(sweep_dir, *flags, "--nowait")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "slurm: submitted nothing: 2 done, 0 running, 0 queued, 0 conflicting of 2" in \
        again.stdout
    assert slurm.read_jobs(sweep_dir) == jobs


@pytest.mark.slurm
def test_fluid_streams_as_slurm_jobs_equal_the_local_run(cluster, tmp_path):
    compile_unoptimised(True)  # short streams: -O0 is faster
    workdir = str(tmp_path / "fluid")
    flags = ["--preset=small", "--method=ncm", "--num_streams=2", "--stream_classes=6",
             "--stream_length=90", "--head_threshold=15", "--min_pretrain_samples=5",
             "--pretrain_steps=3", "--filters=8", "--dataset_option=num_classes=20",
             "--dataset_option=samples_per_class=30", "--dataset_option=image_size=16"]
    done = command("launch.fluid", workdir, *flags)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "slurm: submitted 2 run(s) as job array" in done.stdout and "ncm" in done.stdout
    stored = results.read_json(os.path.join(workdir, "results.json"))
    assert stored["complete"] and sorted(os.listdir(os.path.join(workdir, "streams"))) == [
        "0.json", "1.json"]
    saved = stored["config"]
    config = experiment.FluidConfig(**{
        **saved, "methods": tuple(saved["methods"]),
        "stream": experiment.StreamConfig(**saved["stream"])})
    local = experiment.run_experiment(config, str(tmp_path / "local"))
    for ours, theirs in zip(stored["streams"], local["streams"]):
        assert ours["stream"] == theirs["stream"]
        for name in ("metrics", "macs", "train_steps"):
            assert ours["methods"]["ncm"][name] == theirs["methods"]["ncm"][name]
    again = command("launch.fluid", workdir, *flags, "--nowait")
    assert "slurm: submitted nothing: 2 done" in again.stdout, again.stderr[-3000:]
