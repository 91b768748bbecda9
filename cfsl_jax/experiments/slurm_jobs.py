"""What a SLURM job of ``cfsl_jax.experiments.slurm`` runs: one sweep run (``RunJob``), one pack
of a sweep's runs (``PackJob``) or one FLUID stream (``StreamJob``), with the launching
process's jax options and the stop signals handled.

- SIGUSR2 (SLURM's warning 90 s before the time limit, ``scancel --signal=USR2``):
  submitit's handler requeues the job and raises ``SystemExit``; the training loop
  checkpoints the step reached on it (``cfsl_jax.training.loop``).
- SIGTERM (preemption, ``scancel``, ``scontrol requeue``): the run stops as on Ctrl-C,
  checkpointing the step reached (``cfsl_jax.runtime.stops``).
- A FLUID stream is the unit of work: a stopped stream runs again from its start.
"""

from __future__ import annotations

from typing import Any, Mapping

def handle_sigterm() -> None:
    """In a job: SIGTERM (SLURM's preemption, ``scancel``, ``scontrol requeue``) stops the run
    as Ctrl-C does (``stops``: it checkpoints the step reached), where submitit only logs it;
    submitit's SIGUSR2 handler (checkpoint, requeue, ``SystemExit``) stays, and the SIGTERM
    its own requeue brings is then ignored."""
    import signal

    from cfsl_jax.runtime import stops
    usr2 = signal.getsignal(signal.SIGUSR2)
    stopping = []

    def on_usr2(signum, frame):
        stopping.append(signum)
        if callable(usr2):
            usr2(signum, frame)

    def on_term(signum, frame):
        if not stopping:
            stopping.append(signum)
            stops.handle(signum, frame)

    signal.signal(signal.SIGUSR2, on_usr2)
    signal.signal(signal.SIGTERM, on_term)


class _Job:
    """A job's callable: applies the launching process's jax options and the stop signals
    first. Checkpointable (submitit's ``checkpoint``): on preemption or timeout the job is
    requeued with the same arguments and resumes from what its work stored."""

    def __init__(self, jax_options: Mapping[str, Any]):
        self.jax_options = dict(jax_options)

    def _start(self) -> None:
        import jax
        for name, value in self.jax_options.items():
            jax.config.update(name, value)
        handle_sigterm()

    def checkpoint(self, *args: Any, **kwargs: Any):
        import submitit
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


class RunJob(_Job):
    """One run of a sweep: ``sweep.execute``, as a worker of the local pool runs it."""

    def __call__(self, config_json: dict, workdir: str) -> str:
        from cfsl_jax.experiments import sweep
        self._start()
        state, seconds, detail = sweep.execute(config_json, workdir)
        print(f"{state} in {seconds:.1f}s: {detail}", flush=True)
        if state == "interrupted":
            raise SystemExit(f"interrupted: {detail}")
        if state != "finished":
            raise RuntimeError(f"the run {workdir} failed: {detail.strip().splitlines()[-1]}")
        return detail


class PackJob(_Job):
    """A pack of a sweep's runs (``--pack``): ``sweep.execute_pack``, as a worker of the local
    pool runs it; the job fails unless every run of the pack finishes. ``options``
    (``packing.PackOptions``): how the pack meta-trains, as in a local sweep (with
    ``--pack=auto`` a pack too large for the job's device trains as packs of the largest size
    that fits)."""

    def __init__(self, jax_options: Mapping[str, Any], options: Any = None):
        super().__init__(jax_options)
        self.options = options  # a packing.PackOptions; None: its defaults

    def __call__(self, config_jsons: list[dict], workdirs: list[str]) -> str:
        from cfsl_jax.experiments import sweep
        self._start()
        from cfsl_jax.training.packing import PackOptions
        outcomes = sweep.execute_pack(config_jsons, workdirs, self.options or PackOptions())
        for workdir, (state, seconds, detail) in zip(workdirs, outcomes):
            print(f"{workdir}: {state} in {seconds:.1f}s: {detail}", flush=True)
        if any(state == "interrupted" for state, _, _ in outcomes):
            raise SystemExit(f"interrupted: {outcomes[0][2]}")
        failed = [(w, detail) for w, (state, _, detail) in zip(workdirs, outcomes)
                  if state != "finished"]
        if failed:
            raise RuntimeError("; ".join(f"the run {w} failed: {d.strip().splitlines()[-1]}"
                                         for w, d in failed))
        return f"{len(workdirs)} runs finished"


class StreamJob(_Job):
    """One FLUID stream (``experiment.run_stream_alone``); a preempted stream starts again."""

    def __call__(self, config, workdir: str, index: int) -> str:
        from cfsl_jax.fluid import experiment
        self._start()
        experiment.run_stream_alone(config, workdir, index)
        return f"stream {index} stored in {experiment.stream_file(workdir, index)}"


