"""Sweeps: running a grid of (dataset x learner x task cell x seed) runs in worker processes,
each run in its own workdir (the grid, the layout and the run statuses:
``cfsl_jax.experiments.sweep_plan``).

    from cfsl_jax.experiments import sweep, sweep_plan
    from cfsl_jax.training.config import TrainConfig
    configs, skipped = sweep_plan.grid(TrainConfig(epochs=2), learners=("protonets", "init_tune"),
                                       cells=("B3", "C3"), seeds=(0, 1))
    outcomes = sweep.run_sweep(configs, "/tmp/sweep", workers=2)

Rules:

- Only runs that are not done are run (a partial run resumes from its
  checkpoints; a conflicting one is never run), in the plan's seed-major order.
  Workers share the persistent XLA compilation cache, at
  ``<sweep_dir>/xla_cache`` (this machine's default cache for a gs:// sweep dir) unless this
  process already configured one.
- Workers are separate processes (``multiprocessing`` "spawn": a process that
  imported jax is never forked). ``workers=None`` probes a fresh process for
  the backend: one worker per GPU (each sees only its own GPU through
  ``CUDA_VISIBLE_DEVICES``), one per host on TPU (one process owns the
  host's chips), one per CPU core on CPU; each worker keeps XLA's own
  threading.
  ``workers=0`` runs everything in this process (tests, notebooks,
  debugging), with this process's jax configuration.
- Each run is claimed before it is trained (its workdir's lock, ``locks``): a run that another
  sweep, shard or requeued task is training is not run (status ``busy``), never twice at once.
- A worker ends when the sweep's process dies (``orphans``: a SIGKILL, the OOM killer): its run
  checkpoints and stops; no orphan trains on.
- A run that raises is recorded as failed (its traceback goes to the log and
  to ``<workdir>/error.log``; a user error, such as a spec a split cannot
  supply, is one line); the sweep goes on with the others.
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
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Callable, Mapping, Sequence

import jax

from cfsl_jax import data
from cfsl_jax.runtime import backend, files, locks, orphans, progress, stops
from cfsl_jax.training import pack_eval, packing, train
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.experiments.sweep_plan import Outcome, Run, count, pack_groups, plan, summary


# jax options a worker copies from the process that starts the sweep.
INHERITED_JAX_OPTIONS: tuple[str, ...] = (
    "jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes", "jax_disable_most_optimizations",
    "jax_enable_x64", "jax_default_matmul_precision")


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


def worker_env(platform: str, slot: int, devices: int, workers: int) -> dict[str, str]:
    """Environment variables of worker ``slot`` of ``workers``: on GPU, the one GPU it may see
    (workers share the ``devices`` GPUs round-robin when there are more workers than GPUs) and,
    where several workers share a GPU, an equal share of its memory for each
    (``XLA_PYTHON_CLIENT_MEM_FRACTION``: 0.9 over the workers on that GPU; jax's default, 0.75
    for the first process, would leave the others none). Memory settings of the user's own
    (``XLA_PYTHON_CLIENT_MEM_FRACTION``, ``_PREALLOCATE``, ``_ALLOCATOR``) are kept."""
    if platform not in ("gpu", "cuda", "rocm"):
        return {}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(max(devices, 1))]
    env = {"CUDA_VISIBLE_DEVICES": ids[slot % len(ids)]}
    sharing = len(range(slot % len(ids), workers, len(ids)))
    if sharing > 1 and not any(f"XLA_PYTHON_CLIENT_{name}" in os.environ
                               for name in ("MEM_FRACTION", "PREALLOCATE", "ALLOCATOR")):
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{int(900 / sharing) / 1000:.3f}"
    return env


_stopping = False  # a worker that saw Ctrl-C starts no further run
_stop_status: int | None = None  # the exit status of the stop that interrupted a run here
_busy = threading.Event()  # set while a worker runs a run (``orphans``: a stop then waits)


@stops.aware
def _on_interrupt(signum, frame) -> None:
    """A worker's SIGINT: the first interrupts its run (which checkpoints); later ones and
    every queued run are ignored."""
    global _stopping
    if not _stopping:
        _stopping = True
        stops.handle(signum, frame)


def _init_worker(slots, platform: str, devices: int, workers: int, jax_options: dict,
                 parent: int | None = None) -> None:
    """Runs first in every worker process, before its jax backend starts."""
    stops.install(_on_interrupt)
    if parent is not None:
        orphans.end_with_parent(parent, lambda: _busy.is_set())
    os.environ.update(worker_env(platform, slots.get(), devices, workers))  # read at start
    for name, value in jax_options.items():
        jax.config.update(name, value)


def prepare_data(config_json: dict) -> str:
    """Load (preparing on first use) every split of a config's dataset; returns "" or the
    error. Run once per dataset before the runs, so that parallel runs never prepare the
    same TFDS dataset at the same time."""
    config = TrainConfig(**config_json)
    try:
        for split in data.SPLITS:
            data.load_split(config.dataset, split, data_dir=config.data_dir,
                            manual_dir=config.manual_dir, **config.dataset_options)
    except Exception as error:  # noqa: BLE001  (the runs report it again, each)
        return f"{type(error).__name__}: {error}"
    return ""


def execute(config_json: dict, workdir: str, tested=None) -> tuple[str, float, str]:
    """Run one config to the end (resuming it); returns (status, seconds, detail). ``tested``:
    its test record from its pack's test (``pack_eval.test_pack``).

    Never raises: a failure is returned (and written to ``<workdir>/error.log``)."""
    started = time.perf_counter()
    if _stopping:
        return "interrupted", 0.0, "not started"
    prefix = f"{config_json['learner']}/{config_json['task']}/seed{config_json['seed']}: "
    try:
        _busy.set()
        with progress.prefixed(prefix):
            out = train.train_and_evaluate(TrainConfig(**config_json), workdir, tested=tested)
    except locks.Busy as error:  # claimed by another sweep, shard or requeued task
        return "busy", time.perf_counter() - started, f"not run: {error}"
    except KeyboardInterrupt as error:
        _noted_stop(error)
        return "interrupted", time.perf_counter() - started, str(error) or "interrupted"
    except UserError as error:  # one line: the run cannot be done as configured
        return "failed", time.perf_counter() - started, f"error: {error}"
    except Exception:  # noqa: BLE001  (one failed run must not stop the sweep)
        detail = traceback.format_exc()
        files.write_atomic(files.join(workdir, "error.log"), detail)
        return "failed", time.perf_counter() - started, detail
    finally:
        _busy.clear()
    files.remove(files.join(workdir, "error.log"))
    return "finished", time.perf_counter() - started, f"test acc {out['test']['acc_mean']:.4f}"


def execute_pack(config_jsons: list[dict], workdirs: list[str],
                 options: packing.PackOptions = packing.PackOptions()
                 ) -> list[tuple[str, float, str]]:
    """``execute`` for each run of a pack (runs of one config but their seeds and learning
    rates: ``sweep_plan.pack_groups``), their
    meta-training first packed (``packing.meta_train_pack``), then their test
    (``pack_eval.test_pack``); a pack that fails leaves each run to train alone, where its
    error is reported. ``options``: how the pack meta-trains (``--pack=auto``'s shrinking, steps
    per call, pack axis)."""
    if len(workdirs) == 1:
        return [execute(config_jsons[0], workdirs[0])]
    started, tested = time.perf_counter(), {}
    configs = [TrainConfig(**c) for c in config_jsons]
    try:
        with progress.prefixed(f"pack of {len(workdirs)}: "):
            packing.meta_train_pack(configs[0], [c.seed for c in configs], workdirs,
                                    options.steps_per_dispatch, shrink=options.shrink,
                                    pack_axis=options.pack_axis,
                                    learning_rates=[c.learning_rate for c in configs])
            tested = pack_eval.test_pack(configs[0], configs, workdirs)
    except KeyboardInterrupt as error:
        _noted_stop(error)
        return [("interrupted", time.perf_counter() - started, str(error))] * len(workdirs)
    except Exception as error:  # noqa: BLE001  (each run alone then says what is wrong)
        last = (str(error).strip().splitlines() or [type(error).__name__])[-1]
        print(f"[sweep] the pack of {len(workdirs)} ({', '.join(workdirs)}) failed: "
              f"{type(error).__name__}: {last}; its runs go on one at a time", flush=True)
    return [execute(c, w, tested.get(w)) for c, w in zip(config_jsons, workdirs)]


def _noted_stop(error: BaseException) -> None:
    """Keep the exit status of the stop (128 + its signal) that interrupted a run."""
    global _stop_status
    _stop_status = getattr(error, "exit_status", None)


def worker_jax_options(sweep_dir: str) -> dict[str, Any]:
    """This process's compilation options, with a cache if it has none
    (``backend.cache_dir_in(sweep_dir)``: in a local sweep dir, this machine's for gs://)."""
    options = {name: jax.config.values[name] for name in INHERITED_JAX_OPTIONS
               if jax.config.values.get(name) is not None}
    if not options.get("jax_compilation_cache_dir"):
        options["jax_compilation_cache_dir"] = backend.cache_dir_in(sweep_dir)
    return options


def run_sweep(configs: Sequence[TrainConfig], sweep_dir: str, workers: int | None = None,
              jax_options: Mapping[str, Any] | None = None,
              log: Callable[[str], None] = print, pack: int = 1,
              pack_options: packing.PackOptions = packing.PackOptions()) -> list[Outcome]:
    """Run every run of ``configs`` that is not done; returns one Outcome per run (in the
    order of ``configs``).

    ``jax_options`` (``jax.config`` names -> values) are applied in every worker
    process after the ones inherited from this process (``INHERITED_JAX_OPTIONS``);
    with ``workers=0`` the runs use this process's configuration as it is. ``pack``: the runs
    that differ only in their seeds (``pack_runs.pack_key``) meta-train in packs of at most
    ``pack`` (``packs``);
    ``pack_options``: how a pack meta-trains (``execute_pack``).
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
            log(f"[sweep] conflict: {detail}")
        else:
            todo.append(run)
    conflicts = sum(o.status == "conflict" for o in outcomes.values())
    log(f"[sweep] {sweep_dir}: {count(len(planned), 'run')}: "
        f"{len(outcomes) - conflicts} done before (skipped), {conflicts} conflicting, "
        f"{len(todo)} to run")

    bar = progress.tracker("sweep", len(todo), "runs")

    def record(run: Run, result: tuple[str, float, str]) -> None:
        outcomes[run.workdir] = Outcome(run, *result)
        finished = sum(o.status in ("finished", "failed") for o in outcomes.values())
        last_line = result[2].strip().splitlines()[-1] if result[2].strip() else ""
        log(f"[sweep] {result[0]} {run.name} ({finished}/{len(todo)}) in {result[1]:.1f}s: "
            f"{last_line}")
        if result[0] != "interrupted":
            bar.update(finished, force=True)

    def stopped(exit_status: int | None = None) -> KeyboardInterrupt:
        """The sweep's stop; ``exit_status``: 128 + the stop signal's number (the command
        exits with it: 143 for SIGTERM), None for Ctrl-C's 130."""
        finished = sum(o.status in ("finished", "failed") for o in outcomes.values())
        stop = KeyboardInterrupt(
            f"sweep interrupted: {finished} of {len(todo)} runs finished, the runs in progress "
            f"checkpointed; re-run the same command to continue")
        if exit_status is not None:
            stop.exit_status = exit_status  # type: ignore[attr-defined]
        return stop

    groups = packs(todo, pack)
    if todo and workers == 0:
        for group in groups:
            for run, result in zip(group, execute_pack(*_pack_args(group), pack_options)):
                record(run, result)
                if result[0] == "interrupted":
                    raise stopped(_stop_status)
    elif todo:
        platform, devices = probe_backend()
        workers = default_workers(platform, devices) if workers is None else workers
        workers = min(workers, len(todo))
        context = multiprocessing.get_context("spawn")
        slots = context.Queue()
        for slot in range(workers):
            slots.put(slot)
        files.makedirs(sweep_dir)
        log(f"[sweep] {workers} worker process(es) on {platform}")
        pool = concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=context, initializer=_init_worker,
            initargs=(slots, platform, devices, workers,
                      {**worker_jax_options(sweep_dir), **(jax_options or {})}, os.getpid()))
        try:
            sources = {(c.dataset, c.data_dir, c.manual_dir, json.dumps(c.dataset_options,
                                                                        sort_keys=True)): c
                       for c in (run.config for run in todo) if c.dataset != "synthetic"}
            for config in sources.values():  # synthetic data is generated in memory by each run
                log(f"[sweep] loading (preparing on first use) {config.dataset} in a worker ...")
                error = pool.submit(prepare_data, config.to_json()).result()
                if error:
                    log(f"[sweep] preparing {config.dataset} failed: {error}")
            futures = {pool.submit(execute_pack, *_pack_args(group), pack_options): group
                       for group in groups}
            for future in concurrent.futures.as_completed(futures):
                group = futures[future]
                try:
                    results = future.result()
                except concurrent.futures.process.BrokenProcessPool as error:
                    results = [("failed", 0.0, f"a worker process died ({error}); run the "
                                               f"sweep again to continue")] * len(group)
                for run, result in zip(group, results):
                    record(run, result)
        except KeyboardInterrupt as error:
            _stop_workers(pool)
            raise stopped(getattr(error, "exit_status", None)) from None
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
    return [outcomes[run.workdir] for run, _, _ in planned]


def packs(runs: Sequence[Run], size: int) -> list[list[Run]]:
    """``runs`` grouped into packs of at most ``size`` runs whose configs differ only in their
    seeds and learning rates, with shared evaluation tasks (``sweep_plan.pack_groups``)."""
    return pack_groups(runs, size, lambda run: run.config)


def _pack_args(group: Sequence[Run]) -> tuple[list[dict], list[str]]:
    return [run.config.to_json() for run in group], [run.workdir for run in group]


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
