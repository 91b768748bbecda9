"""Peak resident memory of the README's main command, checked against the figure the README states.

    python benchmarks/peak_memory.py                 # the quickstart command, in a fresh folder
    python benchmarks/peak_memory.py --budget_mb=0   # measure only

The command runs in a subprocess (a fresh workdir and compilation cache under a temporary
folder, so nothing is loaded from an earlier run); its resident memory is sampled every 0.1 s
(psutil) beside its progress lines, and its peak is the kernel's (``ru_maxrss`` of the child).
It prints the peak, the progress line the peak came after (which phase needs the memory), and
one JSON line; it exits 1 when the peak is more than ``--tolerance`` (10 %) above
``--budget_mb`` (the figure the README states), so a regression fails the check. Not a test:
it takes the command's minutes.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

from absl import app, flags

QUICKSTART = ["-m", "cfsl_jax.launch.train", "--learner=protonets", "--task=B3", "--epochs=3",
              "--iters_per_epoch=20", "--meta_batch=4", "--val_tasks=100"]
COMMANDS = {"quickstart": QUICKSTART}
# The README's figures, measured (MiB of ru_maxrss). Before 2026-11-28 the quickstart peaked
# in its test (4,273 MiB): its 50-task evaluation program, one vmap of the tasks, held 2.87 GB
# of XLA temporaries (XLA:CPU's YNNPACK "reduce" fusion broadcast the first layer's running
# batch-norm statistics to its [50, 75, 28, 28, 64] activation). On CPU the tasks now run one
# at a time (episode.sequential), one task's activations at a time: 1,338 MiB on 2026-11-28.
BUDGET_MB = {"quickstart": 1338}

flags.DEFINE_enum("command", "quickstart", tuple(COMMANDS), "Which command to measure.")
flags.DEFINE_integer("budget_mb", None, "Peak RSS the command may reach (MB; default: the "
                     "README's figure for it; 0: measure only).")
flags.DEFINE_float("tolerance", 0.10, "Fraction above the budget that fails the check.")
FLAGS = flags.FLAGS


def measure(argv: list[str]) -> dict:
    """Run ``python argv...`` with a fresh workdir and cache; its peak RSS and where it came."""
    import psutil

    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "XDG_CACHE_HOME": os.path.join(folder, "cache")}
        started = time.perf_counter()
        child = subprocess.Popen([sys.executable, *argv, f"--workdir={folder}/run"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: list[tuple[float, str]] = []
        reader = threading.Thread(target=lambda: lines.extend(
            (time.perf_counter() - started, line.rstrip()) for line in child.stdout))
        reader.start()
        samples: list[tuple[float, int]] = []
        process = psutil.Process(child.pid)
        while child.poll() is None:
            try:
                samples.append((time.perf_counter() - started, process.memory_info().rss))
            except psutil.Error:
                break
            time.sleep(0.1)
        child.wait()
        reader.join()
    if child.returncode:
        raise SystemExit("the command failed:\n" + "\n".join(line for _, line in lines[-20:]))
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    at, _ = max(samples, key=lambda s: s[1]) if samples else (0.0, 0)
    before = [line for t, line in lines if t <= at and line.lstrip().startswith(("[", "still"))]
    return {"peak_rss_mb": round(peak / 2**20), "seconds": round(time.perf_counter() - started, 1),
            "peak_after": before[-1] if before else "", "peak_at_s": round(at, 1)}


def main(argv: list[str]) -> None:
    del argv
    budget = BUDGET_MB[FLAGS.command] if FLAGS.budget_mb is None else FLAGS.budget_mb
    result = measure(COMMANDS[FLAGS.command])
    print(f"{FLAGS.command}: peak RSS {result['peak_rss_mb']} MB at {result['peak_at_s']} s of "
          f"{result['seconds']} s, after: {result['peak_after']}")
    limit = budget * (1 + FLAGS.tolerance)
    print(json.dumps({"benchmark": "peak_memory", "command": FLAGS.command, **result,
                      "budget_mb": budget, "limit_mb": round(limit)}))
    if budget and result["peak_rss_mb"] > limit:
        print(f"FAIL: {result['peak_rss_mb']} MB is more than {FLAGS.tolerance:.0%} above the "
              f"README's {budget} MB", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
