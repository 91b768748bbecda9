"""Recompute a run's task fingerprint (and test metrics) and say MATCH or what differs.

    python -m launch.verify --workdir=/tmp/pn
"""

from __future__ import annotations

import sys

from absl import app, flags

from cfsl_jax.verify import verify

from .options import quiet_third_party_logs

_WORKDIR = flags.DEFINE_string("workdir", None, "A finished run's directory.", required=True)
_METRICS = flags.DEFINE_bool("metrics", True, "Also recompute the test metrics.")


def main(argv) -> None:
    quiet_third_party_logs()
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    differences = verify(_WORKDIR.value, metrics=_METRICS.value)
    if differences:
        print("DIFFERS")
        for line in differences:
            print(f"  {line}")
        sys.exit(1)
    print("MATCH")


def run() -> None:
    app.run(main)


if __name__ == "__main__":
    run()
