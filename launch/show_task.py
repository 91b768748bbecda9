"""Write a picture of one sampled task and print its summary.

    python -m launch.show_task --dataset=synthetic --task=D8 --seed=0 --out=task.png
    python -m launch.show_task --dataset=omniglot --manual_dir=../shared/data/omniglot --task=B3
"""

from __future__ import annotations

from absl import app, flags

from cfsl_jax import visualize

from .options import quiet_third_party_logs

_DATASET = flags.DEFINE_string("dataset", "synthetic", "Dataset name (see cfsl_jax.data.DATASETS).")
_SPLIT = flags.DEFINE_enum("split", "train", ["train", "val", "test"], "Class split.")
_TASK = flags.DEFINE_string("task", "D8", "Paper cell (B3, D8, ...), a type (A-D) or type+NSS (B7).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed; the task is a pure function of it.")
_OUT = flags.DEFINE_string("out", "task.png", "Where to write the PNG.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Where prepared TFDS datasets live.")
_MANUAL_DIR = flags.DEFINE_string("manual_dir", None, "Folder with the official archives.")


def main(argv) -> None:
    quiet_third_party_logs()
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    summary = visualize.show_task(dataset=_DATASET.value, split=_SPLIT.value, task=_TASK.value,
                                seed=_SEED.value, out=_OUT.value, data_dir=_DATA_DIR.value,
                                manual_dir=_MANUAL_DIR.value)
    print(summary)
    print(f"wrote {_OUT.value}")


def run() -> None:
    app.run(main)


if __name__ == "__main__":
    run()
