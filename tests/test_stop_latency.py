"""A stop signal during an evaluation is answered while the device works, not after it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

CHILD = r"""
import signal, sys
import jax, jax.numpy as jnp
from cfsl_jax import data
from cfsl_jax.learners import get_learner
from cfsl_jax.protocol.spec import TaskSpec
from cfsl_jax.runtime import parallel, progress, stops
from cfsl_jax.training.evaluate import evaluate

signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal
stops.install()
progress.INTERVAL_S = 0.0  # a line after every chunk: the parent's cue
spec = TaskSpec.parse("B3")
split = data.load_split("synthetic", "train", num_classes=100, samples_per_class=10)
learner = get_learner("protonets", spec, image_shape=tuple(split.images.shape[1:]), filters=16)
params = jax.jit(learner.init_params, static_argnums=2)(  # one program, not op by op
    jax.random.key(0), split.images[:1].astype(jnp.float32), spec)
try:
    evaluate(learner, params, split, num_tasks=1000, batch_size=50, cost_metrics=False,
             mesh=parallel.make_mesh(1))
except stops.StopRequested as stop:
    print(f"STOPPED {stop}", flush=True)
    sys.exit(stop.exit_status)
print("FINISHED", flush=True)
"""


def test_ctrl_c_during_an_evaluation_says_what_it_waits_for_and_exits_130():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "JAX_PLATFORMS": "cpu"})
    lines = []
    for line in child.stdout:
        lines.append(line.rstrip())
        if line.startswith("[test] ") and "/1000" in line and not line.startswith("[test] 0/"):
            child.send_signal(signal.SIGINT)  # a chunk was counted; the next ones are running
            break
    rest = child.stdout.read().splitlines()
    assert child.wait(timeout=300) == 130, "\n".join(lines + rest)
    # answered while the programs in flight ran (the old blocking wait answered only after the
    # next chunk, and said nothing while the process waited for the last one to end)
    assert rest[0] == "[test] stopping: the evaluation programs in flight finish first ...", rest
    assert rest[1].startswith("[test] stopping: the evaluation programs in flight finish first: "
                              "done in "), rest
    assert rest[-1] == "STOPPED stopped by SIGINT", rest
    assert not any(line.startswith("[test] 1000/1000") for line in rest), rest
