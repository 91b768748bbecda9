"""A run's metrics: JSON lines always, TensorBoard event files (tensorboardX) when asked."""

import glob
import json
import struct

import pytest
from tensorboardX.proto import event_pb2

from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training import tracking


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
                       ("val/ce", 10): 1.25, ("val/epoch", 10): 0.0,
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
