"""Sweeps: a grid of (dataset x learner x task cell x seed) runs, each in its own workdir.

    from cfsl_jax import sweep
    from cfsl_jax.train import TrainConfig
    configs, skipped = sweep.grid(TrainConfig(epochs=2), learners=("protonets", "init_tune"),
                                  cells=("B3", "C3"), seeds=(0, 1))
    outcomes = sweep.run_sweep(configs, "/tmp/sweep", workers=2)

Rules:

- Layout: ``<sweep_dir>/<dataset>/<learner>/<cell>/seed<k>/``, a plain
  ``train.train_and_evaluate`` workdir; ``/`` in a dataset name becomes ``-``
  (``omniglot/small`` -> ``omniglot-small``). Every other field of the runs'
  ``TrainConfig`` (the budget, spec overrides, options) is the sweep's.
- A run is **done** when its ``results.json`` exists (``train_and_evaluate``
  writes it last, atomically), **partial** when its workdir holds a
  ``config.json`` but no results (``train_and_evaluate`` resumes it from its
  checkpoints), **new** otherwise, and a **conflict** when its ``config.json``
  differs from the sweep's config (another budget, say): it is never run, the
  sweep asks for another sweep directory. A sweep killed at any point therefore
  continues where it stopped when run again, and runs only what is missing.
- Order: seed-major (every run of seed 0, then seed 1, ...), so a program is
  compiled once, by seed 0's run, and the other seeds load it from the
  persistent XLA compilation cache, which workers use at ``<sweep_dir>/xla_cache``
  unless this process already configured one (then they share it).
- Workers are separate processes (``multiprocessing`` "spawn": a process that
  imported jax is never forked). ``workers=None`` probes a fresh process for
  the backend: one worker per GPU (each sees only its own GPU through
  ``CUDA_VISIBLE_DEVICES``), one per host on TPU (one process owns the
  host's chips), one per CPU core on CPU. (Single-threaded XLA per CPU worker,
  ``--xla_cpu_multi_thread_eigen=false``, was measured and not adopted: no
  gain with 2 workers on 2 cores, and it would split the compilation cache.)
  ``workers=0`` runs everything in this process (tests, notebooks,
  debugging), with this process's jax configuration.
- A run that raises is recorded as failed (its traceback goes to the log and
  to ``<workdir>/error.log``; a user error, such as a spec a split cannot
  supply, is one line); the sweep goes on with the others. A learner that
  cannot be built (not implemented yet, a bad option) is skipped by ``grid``
  with its reason, before anything runs. ``plan(..., check=True)`` (what
  ``--dry_run`` lists) marks **impossible** the runs whose spec a split they
  sample tasks from cannot supply, with the reason.
- Ctrl-C stops a sweep at once: no queued run starts, every worker
  checkpoints its run and exits, and ``KeyboardInterrupt`` says how to
  continue (run the same command again).
- Progress: a line per finished run with runs done/total and the ETA; the
  runs' own training lines come from the workers.
- Datasets that live on disk (TFDS) are loaded once by a worker before the
  runs start, so that parallel runs never prepare the same dataset at once.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import jax

from cfsl_jax import data, progress, train
from cfsl_jax.errors import UserError
from cfsl_jax.learners import LEARNERS, get_learner
from cfsl_jax.spec import PAPER_GRID

STATUSES: tuple[str, ...] = ("done", "partial", "new", "conflict", "impossible")
# jax options a worker copies from the process that starts the sweep.
INHERITED_JAX_OPTIONS: tuple[str, ...] = (
    "jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes", "jax_disable_most_optimizations",
    "jax_enable_x64", "jax_default_matmul_precision")


class Run(NamedTuple):
    """One run of a sweep: its full config and its workdir."""

    config: train.TrainConfig
    workdir: str

    @property
    def name(self) -> str:
        return (f"{self.config.dataset}/{self.config.learner}/{self.config.task}/"
                f"seed{self.config.seed}")


class Outcome(NamedTuple):
    """What running (or not running) one run did."""

    run: Run
    status: str  # "skipped" (done before), "finished", "failed", "conflict", "interrupted"
    seconds: float
    detail: str  # test accuracy, the error, or the reason


def safe_name(name: str) -> str:
    """A name usable as one path component (``/`` and odd characters become ``-``)."""
    return re.sub(r"[^A-Za-z0-9_.=-]", "-", str(name).replace("/", "-"))


def run_dir(sweep_dir: str, config: train.TrainConfig) -> str:
    """``<sweep_dir>/<dataset>/<learner>/<cell>/seed<k>`` for a run's config."""
    return os.path.join(sweep_dir, safe_name(config.dataset), safe_name(config.learner),
                        safe_name(config.task), f"seed{config.seed}")


def check_learners(learners: Iterable[str], cell: str, base: train.TrainConfig,
                   learner_options: Mapping[str, dict] | None = None
                   ) -> tuple[list[str], dict[str, str]]:
    """Learners that build for ``cell`` (with the base spec overrides and their options), and
    ``{name: reason}`` for those that do not."""
    spec = dataclasses.replace(base, task=cell).spec
    usable, skipped = [], {}
    for name in learners:
        options = {**base.learner_options, **(learner_options or {}).get(name, {})}
        try:
            get_learner(name, spec, **options)
        except Exception as error:  # noqa: BLE001  (any build failure means: skip it)
            skipped[name] = f"{type(error).__name__}: {error}"
        else:
            usable.append(name)
    return usable, skipped


def grid(base: train.TrainConfig, learners: Sequence[str] | None = None,
         cells: Sequence[str] = PAPER_GRID, seeds: Sequence[int] = (0, 1, 2),
         datasets: Sequence[str] | None = None, learner_options: Mapping[str, dict] | None = None
         ) -> tuple[list[train.TrainConfig], dict[str, str]]:
    """The sweep's run configs (seed-major) and the learners skipped, with their reasons.

    ``base`` is a ``TrainConfig`` giving everything but (dataset, learner, task,
    seed); ``learners=None`` means every registered learner that builds;
    ``datasets=None`` means ``[base.dataset]``; ``learner_options`` maps a learner
    to options added to ``base.learner_options`` for it alone.
    """
    names = list(LEARNERS if learners is None else learners)
    unknown = [name for name in names if name not in LEARNERS]
    if unknown:
        raise ValueError(f"unknown learner(s) {unknown}; valid: {LEARNERS}")
    for name in learner_options or {}:
        if name not in LEARNERS:
            raise ValueError(f"learner_options names unknown learner {name!r}; valid: {LEARNERS}")
    if not cells or not seeds or not names:
        raise ValueError(f"a sweep needs at least one learner, cell and seed, got learners="
                         f"{names}, cells={list(cells)}, seeds={list(seeds)}")
    for what, values in (("learners", names), ("cells", cells), ("seeds", seeds),
                         ("datasets", datasets or [])):
        if len(set(values)) != len(values):
            raise ValueError(f"{what} lists a value twice: {list(values)}")
    configs = []
    for cell in cells:  # validates every cell (with the overrides) up front
        dataclasses.replace(base, task=cell).check()
    usable, skipped = check_learners(names, cells[0], base, learner_options)
    for seed in seeds:
        for dataset in datasets or [base.dataset]:
            for learner in usable:
                options = {**base.learner_options, **(learner_options or {}).get(learner, {})}
                for cell in cells:
                    configs.append(dataclasses.replace(
                        base, dataset=dataset, learner=learner, learner_options=options,
                        task=cell, seed=int(seed)))
    return configs, skipped


def status(run: Run) -> tuple[str, str]:
    """(one of STATUSES, a detail) for a run's workdir."""
    config_path = os.path.join(run.workdir, "config.json")
    if not os.path.exists(config_path):
        return "new", ""
    with open(config_path) as f:
        differs = train.config_differences(json.load(f), run.config)
    if differs:
        return "conflict", (f"{run.workdir} holds a run with a different config (fields "
                            f"{differs}); use another sweep directory")
    if os.path.exists(os.path.join(run.workdir, "results.json")):
        return "done", ""
    return "partial", ""


def plan(configs: Iterable[train.TrainConfig], sweep_dir: str, check: bool = False
         ) -> list[tuple[Run, str, str]]:
    """Every run with its status and detail (what ``--dry_run`` lists); with ``check``, a run
    that is not done and whose spec a split it samples from cannot supply is "impossible"
    (this loads every dataset of the sweep)."""
    runs = [Run(config, run_dir(sweep_dir, config)) for config in configs]
    workdirs = [run.workdir for run in runs]
    if len(set(workdirs)) != len(workdirs):
        raise ValueError("two runs of the sweep share a workdir (a cell or seed listed twice?)")
    planned = [(run, *status(run)) for run in runs]
    if check:
        splits: dict[str, dict[str, data.Split]] = {}
        for i, (run, state, _) in enumerate(planned):
            reason = "" if state in ("done", "conflict") else impossible(run.config, splits)
            if reason:
                planned[i] = (run, "impossible", reason)
    return planned


def impossible(config: train.TrainConfig, cache: dict) -> str:
    """Why ``config``'s spec cannot be sampled from a split it touches ("" if it can);
    ``cache`` keeps the loaded splits of each dataset between calls."""
    key = json.dumps([config.dataset, config.data_dir, config.manual_dir,
                      config.dataset_options], sort_keys=True)
    if key not in cache:
        cache[key] = train.load_splits(config)
    training = get_learner(config.learner, config.spec, **config.learner_options).training
    try:
        train.check_feasible(config, cache[key],
                             train.splits_touched(training, config.pretrain_data))
    except UserError as error:
        return str(error)
    return ""


# ---- execution ---------------------------------------------------------------------------


def probe_backend() -> tuple[str, int]:
    """(platform, local device count) of jax in a fresh process, so that this one never
    initialises (and never grabs the memory of) an accelerator."""
    code = "import jax; print(jax.default_backend(), jax.local_device_count())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"probing the jax backend failed:\n{result.stderr[-2000:]}")
    platform, count = result.stdout.split()[-2:]
    return platform, int(count)


def default_workers(platform: str, devices: int) -> int:
    """One worker per CPU core this process may use, per GPU, or one on TPU."""
    if platform == "cpu":
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
    if platform in ("gpu", "cuda", "rocm"):
        return devices
    return 1  # TPU: one process owns the host's chips


def worker_env(platform: str, slot: int, workers: int) -> dict[str, str]:
    """Environment variables of worker ``slot``: on GPU, the one GPU it may see."""
    if platform in ("gpu", "cuda", "rocm"):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = visible.split(",") if visible else [str(i) for i in range(workers)]
        return {"CUDA_VISIBLE_DEVICES": ids[slot % len(ids)]}
    return {}


_stopping = False  # a worker that saw Ctrl-C starts no further run


def _on_interrupt(signum, frame) -> None:
    """A worker's SIGINT: the first interrupts its run (which checkpoints); later ones and
    every queued run are ignored."""
    global _stopping
    if not _stopping:
        _stopping = True
        raise KeyboardInterrupt


def _init_worker(slots, platform: str, workers: int, jax_options: dict) -> None:
    """Runs first in every worker process, before its jax backend starts."""
    signal.signal(signal.SIGINT, _on_interrupt)
    os.environ.update(worker_env(platform, slots.get(), workers))  # read at backend start
    for name, value in jax_options.items():
        jax.config.update(name, value)


def prepare_data(config_json: dict) -> str:
    """Load (preparing on first use) every split of a config's dataset; returns "" or the
    error. Run once per dataset before the runs, so that parallel runs never prepare the
    same TFDS dataset at the same time."""
    config = train.TrainConfig(**config_json)
    try:
        for split in data.SPLITS:
            data.load_split(config.dataset, split, data_dir=config.data_dir,
                            manual_dir=config.manual_dir, **config.dataset_options)
    except Exception as error:  # noqa: BLE001  (the runs report it again, each)
        return f"{type(error).__name__}: {error}"
    return ""


def execute(config_json: dict, workdir: str) -> tuple[str, float, str]:
    """Run one config to the end (resuming it); returns (status, seconds, detail).

    Never raises: a failure is returned (and written to ``<workdir>/error.log``)."""
    started = time.perf_counter()
    if _stopping:
        return "interrupted", 0.0, "not started"
    progress.PREFIX = (f"{config_json['learner']}/{config_json['task']}/seed"
                       f"{config_json['seed']}: ")
    try:
        out = train.train_and_evaluate(train.TrainConfig(**config_json), workdir)
    except KeyboardInterrupt as error:
        return "interrupted", time.perf_counter() - started, str(error) or "interrupted"
    except UserError as error:  # one line: the run cannot be done as configured
        return "failed", time.perf_counter() - started, f"error: {error}"
    except Exception:  # noqa: BLE001  (one failed run must not stop the sweep)
        detail = traceback.format_exc()
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "error.log"), "w") as f:
            f.write(detail)
        return "failed", time.perf_counter() - started, detail
    finally:
        progress.PREFIX = ""
    error_log = os.path.join(workdir, "error.log")
    if os.path.exists(error_log):
        os.remove(error_log)
    return "finished", time.perf_counter() - started, f"test acc {out['test']['acc_mean']:.4f}"


def _jax_options(sweep_dir: str) -> dict[str, Any]:
    """This process's compilation options, with a cache in the sweep dir if it has none."""
    options = {name: jax.config.values[name] for name in INHERITED_JAX_OPTIONS
               if jax.config.values.get(name) is not None}
    if not options.get("jax_compilation_cache_dir"):
        options["jax_compilation_cache_dir"] = os.path.abspath(os.path.join(sweep_dir,
                                                                            "xla_cache"))
    return options


def run_sweep(configs: Sequence[train.TrainConfig], sweep_dir: str, workers: int | None = None,
              jax_options: Mapping[str, Any] | None = None,
              log: Callable[[str], None] = print) -> list[Outcome]:
    """Run every run of ``configs`` that is not done; returns one Outcome per run (in the
    order of ``configs``).

    ``jax_options`` (``jax.config`` names -> values) are applied in every worker
    process after the ones inherited from this process (``INHERITED_JAX_OPTIONS``);
    with ``workers=0`` the runs use this process's configuration as it is.
    """
    if workers is not None and workers < 0:
        raise ValueError(f"workers must be >= 0 (0: in this process), got {workers}")
    planned = plan(configs, sweep_dir)
    outcomes: dict[str, Outcome] = {}
    todo = []
    for run, state, detail in planned:
        if state == "done":
            outcomes[run.workdir] = Outcome(run, "skipped", 0.0, "done before")
        elif state == "conflict":
            outcomes[run.workdir] = Outcome(run, "conflict", 0.0, detail)
            log(f"conflict: {detail}")
        else:
            todo.append(run)
    log(f"sweep {sweep_dir}: {len(planned)} runs, {len(planned) - len(todo)} done or "
        f"conflicting, {len(todo)} to run")

    bar = progress.tracker("sweep", len(todo), "runs")

    def record(run: Run, result: tuple[str, float, str]) -> None:
        outcomes[run.workdir] = Outcome(run, *result)
        finished = sum(o.status in ("finished", "failed") for o in outcomes.values())
        last_line = result[2].strip().splitlines()[-1] if result[2].strip() else ""
        log(f"[{finished}/{len(todo)}] {result[0]} {run.name} in {result[1]:.1f}s: {last_line}")
        if result[0] != "interrupted":
            bar.update(finished, force=True)

    def stopped() -> KeyboardInterrupt:
        finished = sum(o.status in ("finished", "failed") for o in outcomes.values())
        return KeyboardInterrupt(
            f"sweep interrupted: {finished} of {len(todo)} runs finished, the runs in progress "
            f"checkpointed; re-run the same command to continue")

    if todo and workers == 0:
        for run in todo:
            result = execute(run.config.to_json(), run.workdir)
            record(run, result)
            if result[0] == "interrupted":
                raise stopped()
    elif todo:
        platform, devices = probe_backend()
        workers = default_workers(platform, devices) if workers is None else workers
        workers = min(workers, len(todo))
        context = multiprocessing.get_context("spawn")
        slots = context.Queue()
        for slot in range(workers):
            slots.put(slot)
        os.makedirs(sweep_dir, exist_ok=True)
        log(f"{workers} worker process(es) on {platform}")
        pool = concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=context, initializer=_init_worker,
            initargs=(slots, platform, workers,
                      {**_jax_options(sweep_dir), **(jax_options or {})}))
        try:
            sources = {(c.dataset, c.data_dir, c.manual_dir, json.dumps(c.dataset_options,
                                                                        sort_keys=True)): c
                       for c in (run.config for run in todo) if c.dataset != "synthetic"}
            for config in sources.values():  # synthetic data is generated in memory by each run
                log(f"loading (preparing on first use) {config.dataset} in a worker ...")
                error = pool.submit(prepare_data, config.to_json()).result()
                if error:
                    log(f"preparing {config.dataset} failed: {error}")
            futures = {pool.submit(execute, run.config.to_json(), run.workdir): run
                       for run in todo}
            for future in concurrent.futures.as_completed(futures):
                try:
                    result = future.result()
                except concurrent.futures.process.BrokenProcessPool as error:
                    result = ("failed", 0.0, f"a worker process died ({error}); run the "
                                             f"sweep again to continue")
                record(futures[future], result)
        except KeyboardInterrupt:
            _stop_workers(pool)
            raise stopped() from None
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
    return [outcomes[run.workdir] for run, _, _ in planned]


def _stop_workers(pool: concurrent.futures.ProcessPoolExecutor, grace: float = 60.0) -> None:
    """Cancel every queued run, let each worker checkpoint its run (SIGINT) and exit; a worker
    still alive after ``grace`` seconds is terminated (a resumable state all the same)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        try:
            os.kill(process.pid, signal.SIGINT)
        except (OSError, TypeError):
            pass
    deadline = time.monotonic() + grace
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.terminate()
            process.join(5)


def summary(outcomes: Sequence[Outcome]) -> str:
    """One line with the count of each outcome status."""
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
    return ", ".join(f"{count} {name}" for name, count in sorted(counts.items()))
