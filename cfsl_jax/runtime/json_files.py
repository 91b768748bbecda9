"""JSON files of a run or an experiment: written atomically by the first host, read with a
one-line error for a truncated or corrupt file (every workdir's results, configs, histories).

    write_json(files.join(workdir, "results.json"), payload)
    stored = read_json(files.join(workdir, "results.json"), default={})
"""

from __future__ import annotations

import json
from typing import Any

import jax

from cfsl_jax.runtime import checksums, files
from cfsl_jax.runtime.errors import UserError


def is_primary() -> bool:
    """Whether this process writes files (the first host of a multi-host run)."""
    return jax.process_index() == 0


def write_json(path: str, payload: Any, sealed: bool = False) -> None:
    """Write JSON atomically (``files.write_atomic``: a temporary file renamed), so a kill never
    leaves half a file, on a local disk or on gs://; a run's config.json, val_history.json and
    results.json with their SHA-256 (``checksums``: checked by ``read_json``); ``sealed``: the
    file holds its own SHA-256 (``checksums.seal_json``: checked by ``checksums.read_sealed``).

    Only the primary process writes (every host of a multi-host run computes the same).
    """
    if not is_primary():
        return
    checksums.write_text(path, checksums.seal_json(payload) if sealed else text(payload))


def text(payload: Any) -> str:
    """The text ``write_json`` writes for ``payload`` (unsealed)."""
    return json.dumps(payload, indent=2, sort_keys=True) + "\n"


def read_json(path: str, default: Any = None) -> Any:
    """The JSON in ``path`` (``default`` when it does not exist and one is given); a file that is
    not valid JSON (truncated, corrupt), or that fails its recorded checksum
    (``checksums.Corrupt``), is a UserError naming it and what to do."""
    if not files.exists(path):
        if default is not None:
            return default
        raise FileNotFoundError(f"{path} does not exist")
    try:
        return json.loads(checksums.read_checked(path))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UserError(f"{path} is not valid JSON (truncated or corrupt: {error}); delete it to "
                        f"let the command write it again, or give another folder") from None
