"""Recompute a run's task fingerprint (and test metrics) and say MATCH or what differs.

    python -m launch.verify --workdir=/tmp/pn
    python -m launch.verify --workdir=/tmp/fluid_small [--streams=all]   # a FLUID workdir

A FLUID workdir (``launch.fluid``'s) is re-checked by ``experiments.verify_fluid``: its
checksums and seals, the summary and every stream's statistics, and --streams (stream 0 by
default) re-run from the recorded config and seed, every number compared exactly.

Exit status: 0 MATCH, 1 DIFFERS (or UNSEALED: a FLUID file without its seal), 2 a mistake
(no such run). Progress lines show
the test tasks done and the ETA. A run records its --data_dir and --manual_dir as
absolute paths, so it verifies from any folder; --data_dir / --manual_dir replace
them (a run recorded with relative paths, verified from another folder).
"""

from __future__ import annotations

if __name__ == "__main__":  # the command: its first line before the imports below (JAX)
    from .starting import main
    raise SystemExit(main("verify", __package__))

import sys

from absl import flags

from cfsl_jax.runtime import files
from cfsl_jax.runtime.errors import UserError

# The library (JAX) is imported once the flags are parsed (``starting.importing``).
from . import cli, starting
from .checks import check_data_flags, check_input_file
from .options import define_backend_flags

_WORKDIR = flags.DEFINE_string("workdir", None, "A finished run's directory (local or gs://).")
_METRICS = flags.DEFINE_bool("metrics", True, "Also recompute the test metrics.")
_COSTS = flags.DEFINE_bool("costs", True, "Also recount ATM and the MACs (XLA's cost analysis "
                           "on CPU: compiles the learner's programs once more).")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Where the run's dataset is prepared "
                                "(default: the folder the run recorded).")
_MANUAL_DIR = flags.DEFINE_string("manual_dir", None, "Folder with the dataset's archives "
                                  "(default: the folder the run recorded).")
_REFERENCE_CSV = flags.DEFINE_string("reference_csv", None, "Also check that this reference "
                                     "results.csv's row of the run equals its results.json.")
_STREAMS = flags.DEFINE_string("streams", "0", "FLUID: the streams re-run, 'all' or indices "
                                "(0,2); each is a whole re-run (pretraining and every method).")
_THRESHOLDS = flags.DEFINE_bool("thresholds", True, "FLUID: also choose the 'new class' "
                                "thresholds again on the validation streams (re-runs them).")
FLUID_FLAGS = ("streams", "thresholds")
define_backend_flags()


def check() -> bool:
    """The workdir (local or gs://) holds a finished run; the folders given exist. Whether it
    is a FLUID workdir."""
    if _WORKDIR.value is None:  # before JAX is imported, in the words of every other command
        raise UserError("--workdir is required")
    with starting.importing("verify"):
        from cfsl_jax.experiments import verify_fluid
        from cfsl_jax.experiments.verify import load
    check_data_flags()
    files.check_url("workdir", _WORKDIR.value)
    paths = dict(data_dir=_DATA_DIR.value, manual_dir=_MANUAL_DIR.value)
    if verify_fluid.is_fluid(_WORKDIR.value):
        if _REFERENCE_CSV.value:
            raise UserError(f"--reference_csv is for a CFSL run; --workdir={_WORKDIR.value} is "
                            f"a FLUID workdir")
        _, recorded = verify_fluid.load(_WORKDIR.value, **paths)
        if _METRICS.value:
            verify_fluid.stream_indices(_STREAMS.value, len(recorded["streams"]))
        return True
    given = [f"--{name}" for name in FLUID_FLAGS if flags.FLAGS[name].present]
    if given and files.isdir(_WORKDIR.value):  # a missing folder: named as such by load
        what = ("a CFSL run" if files.exists(files.join(_WORKDIR.value, "config.json")) else
                f"not one (no {', '.join(verify_fluid.MARKERS)} or results.json of streams)")
        raise UserError(f"{', '.join(given)} is for a FLUID workdir; --workdir="
                        f"{_WORKDIR.value} is {what}")
    load(_WORKDIR.value, **paths)
    if _REFERENCE_CSV.value:
        check_input_file("reference_csv", _REFERENCE_CSV.value)
        from cfsl_jax.experiments import reference
        reference.read_rows(_REFERENCE_CSV.value)  # a file that is not one: refused here
    return False


def main(argv) -> None:
    del argv
    if check():
        verify_fluid()
        return
    from cfsl_jax.experiments.verify import (match_detail, packs_note,
                                             reference_row_differences, verify)
    from cfsl_jax.training import results
    differences = verify(_WORKDIR.value, metrics=_METRICS.value, data_dir=_DATA_DIR.value,
                         manual_dir=_MANUAL_DIR.value, costs=_COSTS.value)
    if _REFERENCE_CSV.value:
        differences += reference_row_differences(_WORKDIR.value, _REFERENCE_CSV.value)
    note = packs_note(results.read_json(files.join(_WORKDIR.value, "results.json")))
    if differences:
        print("DIFFERS")
        for line in differences + ([f"note: {note}"] if note else []):
            print(f"  {line}")
        sys.exit(1)
    print(f"  {match_detail(_METRICS.value, _COSTS.value)}")
    if note:
        print(f"  {note}")
    if _REFERENCE_CSV.value:
        print(f"  {_REFERENCE_CSV.value}: the run's row equals its results.json")
    print("MATCH")


def verify_fluid() -> None:
    """A FLUID workdir: MATCH, UNSEALED (a file without its seal) or DIFFERS, and what."""
    from cfsl_jax.experiments import verify_fluid as fluid
    outcome = fluid.verify(_WORKDIR.value, metrics=_METRICS.value, data_dir=_DATA_DIR.value,
                           manual_dir=_MANUAL_DIR.value, costs=_COSTS.value,
                           streams=_STREAMS.value, thresholds=_THRESHOLDS.value)
    notes = [f"note: {note}" for note in outcome.notes]
    if outcome.differences or outcome.unsealed:
        print("DIFFERS" if outcome.differences else "UNSEALED")
        for path in outcome.unsealed:
            print(f"  {path} has no seal ({fluid.checksums.SEALED}): written before seals, or "
                  f"its seal removed; nothing shows it unchanged since it was written")
        for line in outcome.differences + notes:
            print(f"  {line}")
        sys.exit(1)
    for line in [outcome.detail] + notes:
        print(f"  {line}")
    print("MATCH")


def run() -> None:
    cli.run(main, check=check)
