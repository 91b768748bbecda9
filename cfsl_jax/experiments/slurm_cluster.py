"""The SLURM cluster as the launcher sees it: the sbatch settings of a sweep's jobs
(``SlurmOptions``), the checks made before anything is submitted (``check_cluster``), and its
commands (``squeue`` through ``queue``; a failing one is a ``SlurmError``, one line).
``cfsl_jax.experiments.slurm`` submits and watches the work with them.
"""

from __future__ import annotations

import dataclasses
import getpass
import re
import shutil
import subprocess
from typing import Any, Callable, Sequence

from cfsl_jax.runtime.errors import UserError

QUEUED = ("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SPECIAL_EXIT")
# sbatch options the launcher sets itself (a dedicated flag, or submitit's own).
OWNED_OPTIONS: dict[str, str] = {
    "partition": "--slurm_partition", "time": "--slurm_timeout_min",
    "cpus-per-task": "--slurm_cpus_per_job", "gpus-per-node": "--slurm_gpus_per_job",
    "mem": "--slurm_mem_gb", "account": "--slurm_account", "qos": "--slurm_qos",
    "array": "--slurm_max_parallel", "job-name": "", "output": "", "error": "", "signal": "",
    "open-mode": "", "wckey": ""}


@dataclasses.dataclass(frozen=True)
class SlurmOptions:
    """The sbatch settings of every job of a sweep."""

    partition: str | None = None  # None: the cluster's default partition
    max_parallel: int = 256  # jobs of the array running at once (--array=0-N%P)
    timeout_min: int = 240
    max_timeouts: int = 10  # requeues after reaching timeout_min
    cpus_per_job: int = 1
    gpus_per_job: int = 0
    mem_gb: float | None = None
    account: str | None = None
    qos: str | None = None
    setup: tuple[str, ...] = ()  # shell lines run before each job
    options: tuple[tuple[str, str], ...] = ()  # other sbatch options (key without dashes, value)
    job_name: str = "cfsl"

    def check(self) -> None:
        for name in ("max_parallel", "timeout_min", "cpus_per_job"):
            if getattr(self, name) < 1:
                raise UserError(f"--slurm_{name}={getattr(self, name)}: must be >= 1")
        for name in ("max_timeouts", "gpus_per_job"):
            if getattr(self, name) < 0:
                raise UserError(f"--slurm_{name}={getattr(self, name)}: must be >= 0")
        if self.mem_gb is not None and not self.mem_gb > 0:
            raise UserError(f"--slurm_mem_gb={self.mem_gb}: must be > 0")
        for key, _ in self.options:
            owner = OWNED_OPTIONS.get(key)
            if owner is not None:
                raise UserError(f"--slurm_option={key}=...: the launcher sets --{key} itself"
                                + (f"; use {owner}" if owner else ""))

    def executor_parameters(self) -> dict[str, Any]:
        """``submitit.AutoExecutor.update_parameters`` keyword arguments."""
        parameters: dict[str, Any] = dict(
            name=self.job_name, timeout_min=self.timeout_min, cpus_per_task=self.cpus_per_job,
            slurm_array_parallelism=self.max_parallel, stderr_to_stdout=True)
        if self.gpus_per_job:
            parameters["gpus_per_node"] = self.gpus_per_job
        if self.mem_gb is not None:
            parameters["mem_gb"] = self.mem_gb
        for name in ("partition", "account", "qos"):
            if getattr(self, name) is not None:
                parameters[f"slurm_{name}"] = getattr(self, name)
        if self.setup:
            parameters["slurm_setup"] = list(self.setup)
        if self.options:
            parameters["slurm_additional_parameters"] = dict(self.options)
        return parameters


def parse_option(text: str) -> tuple[str, str]:
    """``"constraint=a100"`` -> ``("constraint", "a100")``: an sbatch option without its dashes
    (``_`` and ``-`` alike) and its value; UserError for anything else."""
    key, sep, value = text.partition("=")
    key = key.strip().lstrip("-").replace("_", "-")
    if not sep or not re.fullmatch(r"[a-z][a-z0-9-]*", key) or not value.strip():
        raise UserError(f"--slurm_option={text!r} is not KEY=VALUE with an sbatch option as KEY "
                        f"(e.g. --slurm_option=constraint=a100)")
    return key, value.strip()


class SlurmError(UserError):
    """A SLURM command failed (its controller down, a submission refused): one line naming the
    command and what it said, as a user error -- the cluster's state, not a bug."""


def _failed(what: str, said: str, hint: str = "") -> SlurmError:
    """``what`` failed, saying ``said`` (its lines joined into one)."""
    said = "; ".join(line.strip() for line in said.strip().splitlines() if line.strip())
    return SlurmError(f"{what} failed: {said or 'no output'}{hint}")


def _command(args: Sequence[str]) -> str:
    """The stdout of a SLURM command; SlurmError with what it said if it fails."""
    result = subprocess.run(list(args), capture_output=True, text=True)
    if result.returncode != 0:
        raise _failed(f"{' '.join(args)} (exit {result.returncode})",
                      result.stderr or result.stdout, " (is SLURM up? sinfo, squeue)")
    return result.stdout


def check_cluster(options: SlurmOptions, which: Callable[[str], str | None] = shutil.which,
                  command: Callable[[Sequence[str]], str] = _command) -> None:
    """UserError, before anything is submitted, when submitit or SLURM's commands are missing or
    the partition is not one ``sinfo`` lists."""
    options.check()
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise UserError("--launcher=slurm needs submitit: pip install 'cfsl_jax[slurm]'") from None
    missing = [tool for tool in ("sbatch", "squeue", "scancel", "sinfo", "srun")
               if which(tool) is None]
    if missing:
        raise UserError(f"--launcher=slurm: {', '.join(missing)} not found on PATH (run it on a "
                        f"machine that submits SLURM jobs, e.g. a login node)")
    if options.partition is not None:
        partitions = sorted({line.strip().rstrip("*")
                             for line in command(["sinfo", "-h", "-o", "%P"]).split()})
        if options.partition not in partitions:
            raise UserError(f"--slurm_partition={options.partition}: no such partition; sinfo "
                            f"lists {', '.join(partitions) or 'none'}")


def queue(command: Callable[[Sequence[str]], str] = _command) -> dict[str, str]:
    """``{job id: state}`` of this user's jobs in ``squeue``, one entry per array element
    (``"123_4": "RUNNING"``)."""
    out = command(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i|%T"])
    jobs = {}
    for line in out.splitlines():
        job, sep, state = line.strip().partition("|")
        if sep:
            jobs[job] = state
    return jobs
