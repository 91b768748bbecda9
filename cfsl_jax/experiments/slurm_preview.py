"""What ``--dry_run --launcher=slurm`` shows: the items a submission would send and its sbatch
script, with nothing submitted and nothing created.

    print(slurm_preview.preview(works, "/shared/sweep", options))

The script is the one submitit would write for the job array (``submitit``'s
``SlurmExecutor`` with the launcher's parameters: ``SlurmOptions.executor_parameters``), its
``--array`` sized to the items that are new or failed; the states come from ``squeue`` and the
files, as ``slurm.submit`` reads them.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from cfsl_jax.experiments import slurm


def sbatch_script(workdir: str, options: slurm.SlurmOptions, count: int) -> str:
    """The sbatch script of a job array of ``count`` items submitted from ``workdir``."""
    from submitit.slurm import slurm as submitit_slurm  # the script submitit would write

    executor = slurm.make_executor(workdir, options)._executor  # creates no folder
    parameters = {**executor.parameters, "map_count": count}
    return submitit_slurm._make_sbatch_string(  # pylint: disable=protected-access
        command=executor._submitit_command_str, folder=executor.folder, **parameters)


def preview(works: Sequence[slurm.Work], workdir: str, options: slurm.SlurmOptions,
            queued: Mapping[str, str] | None = None, list_items: bool = True) -> str:
    """The lines ``--dry_run`` prints: each item's state (``list_items``), what would be
    submitted, the script. ``queued``: ``slurm.queue()``'s answer (default: asked now; without
    an answer the states come from the files)."""
    lines = []
    if queued is None:
        try:
            queued = slurm.queue()
        except slurm.SlurmError as error:  # a dry run goes on without the queue
            lines.append(f"({error}; states from the files only)")
            queued = {}
    before = slurm.states(works, workdir, queued)
    todo = [item for item in before if item.state in ("new", "failed")]
    found = slurm.counts(before)
    lines += [f"{item.state:8s} {item.work.name}" + (f" (job {item.job})" if item.job else "")
              for item in before if list_items]
    summary = ", ".join(f"{n} {state}" for state, n in found.items() if n)
    if not todo:
        lines.append(f"slurm --dry_run: would submit nothing ({summary} of {len(works)})")
        return "\n".join(lines)
    lines.append(f"slurm --dry_run: would submit {len(todo)} of {len(works)} as one job array "
                 f"({summary}); nothing submitted, nothing created")
    lines.append(f"sbatch script (submitit writes it under {slurm.slurm_dir(workdir)}):")
    lines.append(sbatch_script(workdir, options, len(todo)).rstrip())
    return "\n".join(lines)
