"""Recompute a run's task fingerprint (and test metrics) and say MATCH or what differs.

    python -m launch.verify --workdir=/tmp/pn

Exit status: 0 MATCH, 1 DIFFERS, 2 a mistake (no such run). Progress lines show
the test tasks done and the ETA.
"""

from __future__ import annotations

import sys

from absl import flags

from cfsl_jax.verify import verify

from . import cli
from .options import define_backend_flags

_WORKDIR = flags.DEFINE_string("workdir", None, "A finished run's directory.", required=True)
_METRICS = flags.DEFINE_bool("metrics", True, "Also recompute the test metrics.")
define_backend_flags()


def main(argv) -> None:
    del argv
    differences = verify(_WORKDIR.value, metrics=_METRICS.value)
    if differences:
        print("DIFFERS")
        for line in differences:
            print(f"  {line}")
        sys.exit(1)
    print("MATCH")


def run() -> None:
    cli.run(main)


if __name__ == "__main__":
    run()
