"""A FLUID stream run in a process of its own (a SLURM array job) stores its results in a file.

    path = stream_files.stream_file(workdir, 3)            # workdir/streams/3.json
    stored = stream_files.read_stream_file(config, workdir, 3)  # None: not run alone yet

The file is sealed (``checksums.read_sealed``: its own SHA-256, checked on every read), as
jobs of one workdir write such files at once; one of another configuration is refused.
"""

from __future__ import annotations

import json

from cfsl_jax.fluid import config as fluid_config
from cfsl_jax.fluid.config import FluidConfig
from cfsl_jax.runtime import checksums, files
from cfsl_jax.runtime.errors import UserError


def stream_file(workdir: str, index: int) -> str:
    """Where stream ``index`` run alone (``run_stream_alone``) stores its results."""
    return files.join(workdir, "streams", f"{index}.json")


def read_stream_file(config: FluidConfig, workdir: str, index: int) -> dict | None:
    """Stream ``index``'s stored results (None if not run alone; sealed: ``checksums.Corrupt``
    for a file changed since it was written); UserError for another config's."""
    path = stream_file(workdir, index)
    if not files.exists(path):
        return None
    stored = checksums.read_sealed(path, f"delete it and run the same command again: stream "
                                         f"{index} is run again")
    if not {"config", "dataset", "stream", "methods"} <= set(stored):
        raise checksums.Corrupt(f"{path} lacks a stream's results (damaged): delete it and run "
                                f"the same command again: stream {index} is run again", path)
    ours = json.loads(json.dumps(config.to_json()))
    if {**fluid_config.comparable(stored["config"]), "num_streams": 0} != {**ours,
                                                                         "num_streams": 0}:
        raise UserError(f"{path} holds a stream of a different configuration: use a new "
                        f"--workdir (or delete it) to run this one")
    return stored
