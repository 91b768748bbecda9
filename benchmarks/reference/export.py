"""Export a reference sweep folder to docs/reference: results.csv, table.md, each run's small files.

    python -m benchmarks.reference.export --sweep_dir=SWEEP_DIR [--out_dir=docs/reference]

One row per run of the sweep (complete, or partial with its validation curve so far);
each run's results.json, val_history.json and config.json are copied, never a
checkpoint (``cfsl_jax/experiments/reference.py``); ``table.md`` is the grid at a glance,
generated from the CSV (``reference_report.write_table``). Rows of other sweeps already in
``--out_dir`` are kept. One export at a time writes into ``--out_dir`` (its lock
``.export.lock``): a second is refused in one line naming the holder (status 2). Then
``python -m launch.report --reference`` shows them, and
``python -m launch.verify --workdir=W --reference_csv=docs/reference/results.csv``
recomputes a run and checks its row.
"""

from __future__ import annotations

import os

from absl import flags

from cfsl_jax.experiments import reference, reference_report
from launch import cli
from launch.checks import check_input_dir, check_output_dir

_SWEEP_DIR = flags.DEFINE_string("sweep_dir", None, "The reference sweep folder "
                                 "(benchmarks/reference/run_cpu.sh's SWEEP_DIR).", required=True)
_OUT_DIR = flags.DEFINE_string("out_dir", os.path.join("docs", "reference"),
                               "Where results.csv and runs/ go.")


def check() -> None:
    check_input_dir("sweep_dir", _SWEEP_DIR.value, holding="config.json")
    check_output_dir("out_dir", _OUT_DIR.value)


def main(argv) -> None:
    del argv
    check()
    # and the grid at a glance, from the CSV; under the folder's lock (a second export into
    # it is refused, naming the holder)
    rows = reference.export(_SWEEP_DIR.value, _OUT_DIR.value, table=reference_report.write_table)
    done = sum(row["status"] == "complete" for row in rows)
    print(f"{os.path.join(_OUT_DIR.value, 'results.csv')}: {len(rows)} rows ({done} complete, "
          f"{len(rows) - done} partial)")


if __name__ == "__main__":
    cli.run(main, check=check)
