"""A mistaken flag is refused before JAX is imported: ``launch.report``, ``launch.verify``,
``launch.show_task``, ``launch.train``, ``launch.evaluate``, ``launch.sweep`` and
``launch.fluid`` define their flags without JAX and import their library only once absl has
parsed them (``launch.starting.importing``). Checked on ``sys.modules``, not timed."""

import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
HEAVY = ("jax", "flax", "optax", "matplotlib", "tensorflow_datasets")

# Runs ``python -m launch.NAME ARGS...`` in this process, then prints which heavy modules the
# refusal imported.
HARNESS = r"""
import runpy, sys
name, args = sys.argv[1], sys.argv[2:]
sys.argv = [f"launch/{name}.py", *args]
try:
    runpy.run_module(f"launch.{name}", run_name="__main__", alter_sys=True)
except SystemExit as stop:
    status = stop.code
else:
    status = 0
print("imported:", ",".join(m for m in HEAVY if m in sys.modules), "status:", status)
"""


@pytest.mark.parametrize("command, args, message", [
    ("report", ["--nosuchflag"], "error: Unknown command line flag 'nosuchflag'"),
    ("report", ["--task_type=Z"], "error: flag --task_type=Z: value should be one of <A|B|C|D>"),
    ("verify", ["--workdir=/tmp", "--metricz"],
     "error: Unknown command line flag 'metricz'. Did you mean: metrics ?"),
    ("show_task", ["--nosuchflag"], "error: Unknown command line flag 'nosuchflag'"),
    ("show_task", ["--dataset=omniglott"],
     "error: flag --dataset=omniglott: value should be one of "
     "<synthetic|omniglot|omniglot/full|omniglot/small|slimagenet64>"),
    ("train", ["--nosuchflag"], "error: Unknown command line flag 'nosuchflag'"),
    ("train", ["--budget=x"], "error: flag --budget=x: value should be one of "
     "<default|quick|paper>"),
    ("train", ["--pack_axis=x"], "error: flag --pack_axis=x: value should be one of "
     "<auto|vmap|map>"),
    ("evaluate", ["--nosuchflag"], "error: Unknown command line flag 'nosuchflag'"),
    ("evaluate", ["--learner=x"], "error: flag --learner=x: value should be one of "
     "<protonets|init_tune|pretrain_tune|ewc_init|ewc_pretrain|maml_low|maml_high|sca>"),
    ("sweep", ["--nosuchflag"], "error: Unknown command line flag 'nosuchflag'"),
    ("sweep", ["--launcher=x"], "error: flag --launcher=x: value should be one of "
     "<local|slurm>"),
    ("sweep", ["--budget=x"], "error: flag --budget=x: value should be one of "
     "<default|quick|paper>"),
    ("fluid", ["--nosuchflag"], "error: Unknown command line flag 'nosuchflag'"),
    ("fluid", ["--preset=x"], "error: flag --preset=x: value should be one of <paper|small>"),
    ("fluid", ["--class_draw=x"], "error: flag --class_draw=x: value should be one of "
     "<disjoint|independent>"),
    ("fluid", ["--order=x"], "error: flag --order=x: value should be one of "
     "<uniform|staggered>"),
])
def test_a_mistaken_flag_is_refused_in_one_line_before_jax_is_imported(command, args, message):
    process = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\n" + HARNESS, command, *args], cwd=REPO,
        capture_output=True, text=True, timeout=120)
    assert process.stderr.splitlines() == [message]
    assert process.stdout.splitlines()[-1] == "imported:  status: 2", process.stdout
