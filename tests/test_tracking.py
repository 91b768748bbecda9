"""A run's metrics: JSON lines always, TensorBoard event files (tensorboardX) when asked."""

import glob
import json
import os
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboardX.proto import event_pb2

from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training import checkpoints, loop, tracking, train
from cfsl_jax.training.config import TrainConfig


def read_events(path: str) -> list:
    """The Event protos of a TensorBoard event file (TFRecord framing: length, its CRC, the
    record, its CRC)."""
    events = []
    with open(path, "rb") as f:
        while header := f.read(12):
            (length,) = struct.unpack("<Q", header[:8])
            events.append(event_pb2.Event.FromString(f.read(length)))
            f.read(4)
    return events


def test_scalars_go_to_json_lines_and_tensorboard_event_files(tmp_path):
    sink = tracking.Tracking(str(tmp_path), tensorboard=True)
    sink.scalars("train", 10, {"loss": 0.5, "acc": 0.75, "steps_per_s": 3.0})
    sink.scalars("val", 10, {"acc": 0.6, "ce": 1.25, "epoch": 0})
    sink.scalars("test", 20, {"acc_mean": 0.7, "group_acc": [0.5, 0.875]})
    sink.close()
    records = tracking.read(str(tmp_path / tracking.METRICS_FILE))
    assert [(r["phase"], r["step"]) for r in records] == [("train", 10), ("val", 10),
                                                          ("test", 20)]
    assert records[0]["loss"] == 0.5 and records[2]["group_acc_1"] == 0.875
    (path,) = glob.glob(str(tmp_path / "tensorboard" / "events.out.tfevents.*"))
    scalars = {(value.tag, event.step): value.simple_value for event in read_events(path)
               for value in event.summary.value}
    assert scalars == {("train/loss", 10): 0.5, ("train/acc", 10): 0.75,
                       ("train/steps_per_s", 10): 3.0, ("val/acc", 10): pytest.approx(0.6),
                       ("val/ce", 10): 1.25,  # the epoch is an index: JSON lines only
                       ("test/acc_mean", 20): pytest.approx(0.7),
                       ("test/group_acc_0", 20): 0.5, ("test/group_acc_1", 20): 0.875}


def test_a_line_cut_short_by_a_kill_is_skipped_and_recorded_values_are_found(tmp_path):
    sink = tracking.Tracking(str(tmp_path))
    sink.scalars("train", 4, {"last_loss": 1.5})
    with open(tmp_path / tracking.METRICS_FILE, "a") as f:
        f.write('{"phase": "train", "st')
    assert sink.recorded("train", 4, "last_loss") == 1.5
    assert sink.recorded("train", 5, "last_loss") is None
    assert len(tracking.read(str(tmp_path / tracking.METRICS_FILE))) == 1


def test_wandb_without_the_package_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "wandb", None)  # as if not installed
    with pytest.raises(UserError, match=r"^--wandb_project needs the wandb package, which is "
                                        r"not installed: pip install wandb$"):
        tracking.Tracking(str(tmp_path), wandb_project="cfsl")
    assert json.dumps(tracking.read(str(tmp_path / tracking.METRICS_FILE))) == "[]"


def accumulated(workdir) -> EventAccumulator:
    """The run's TensorBoard event files, read as TensorBoard reads them."""
    events = EventAccumulator(os.path.join(workdir, "tensorboard"))
    events.Reload()
    return events


def test_steps_per_s_is_the_rate_of_the_devices_work(tmp_path):
    """Each step does ~1.8 GFLOP on the device; dispatching it takes microseconds. steps/s
    counts the time until the device's results are read, so it agrees with the steps between
    two records over the wall time between them (JSON lines and TensorBoard alike)."""
    @jax.jit
    def work(params, key, progress):
        del progress
        w = params + 1e-3 * jax.random.normal(key, params.shape)
        w = jax.lax.fori_loop(0, 16, lambda _, m: jnp.tanh(m @ w), w)
        return w, {"loss": w.mean(), "acc": jnp.abs(w).mean()}

    params = jnp.eye(384) * 0.5
    compiled = work.lower(params, jax.random.key(0), jnp.float32(0)).compile()

    def step(state, key, progress):
        w, out = compiled(state.params, key, progress)
        return loop.TrainState(w, state.opt_state), out

    phase = loop.Phase("train", "meta-training", epochs=1, iters_per_epoch=24,
                       checkpoint_every=0, log_every=6, key=jax.random.key(1))
    sink = tracking.Tracking(str(tmp_path), tensorboard=True)
    ckpt = checkpoints.Checkpoints(str(tmp_path), keep_best=1)
    step_fn = loop.per_step(phase.key, step)
    try:
        loop.run(phase, loop.TrainState(params, ()), lambda epoch, s: step_fn,
                 lambda epoch, s: ({"acc_mean": 0.5, "ce_mean": 1.0}, s.params),
                 loop.Outputs(str(tmp_path), ckpt, sink))
    finally:
        sink.close()
        ckpt.close()
    records = [r for r in tracking.read(str(tmp_path / tracking.METRICS_FILE))
               if r["phase"] == "train"]
    assert {6, 12, 18, 24} <= {r["step"] for r in records}  # and a progress line's reads
    for before, after in zip(records, records[1:]):
        measured = (after["step"] - before["step"]) / (after["time"] - before["time"])
        assert after["steps_per_s"] == pytest.approx(measured, rel=0.2)
    curve = accumulated(str(tmp_path)).Scalars("train/steps_per_s")
    assert [e.step for e in curve] == [r["step"] for r in records]
    for before, after in zip(curve, curve[1:]):
        measured = (after.step - before.step) / (after.wall_time - before.wall_time)
        assert after.value == pytest.approx(measured, rel=0.2)


def test_tensorboard_shows_atm_macs_and_the_runs_config(tmp_path):
    config = TrainConfig(
        learner="protonets", learner_options={"filters": 8}, dataset="synthetic",
        dataset_options={"num_classes": 60, "samples_per_class": 8}, task="B2",
        spec_overrides={"nc": 3, "kt": 2}, epochs=1, iters_per_epoch=2, meta_batch=2,
        val_tasks=4, test_tasks=4, eval_batch=4, keep_best=1, log_every=2, tensorboard=True)
    out = train.train_and_evaluate(config, str(tmp_path))
    events = accumulated(str(tmp_path))
    scalars = events.Tags()["scalars"]
    assert "val/epoch" not in scalars and "val/acc" in scalars
    for name in ("atm", "macs_adapt", "macs_predict", "macs_per_task", "macs_per_meta_step"):
        (value,) = events.Scalars(f"test/{name}")
        assert value.value == pytest.approx(out["test"][name], rel=1e-6), name
    (text,) = events.Tensors("config/text_summary")
    shown = json.loads(text.tensor_proto.string_val[0].decode())
    assert shown == config.to_json()
    start = plugin_data_pb2.HParamsPluginData.FromString(
        events.PluginTagToContent("hparams")["_hparams_/session_start_info"])
    hparams = start.session_start_info.hparams
    assert hparams["learner"].string_value == "protonets"
    assert hparams["learner_options.filters"].number_value == 8
    assert hparams["meta_batch"].number_value == 2
