"""Write a picture of one sampled task and print its summary.

    python -m launch.show_task --dataset=synthetic --task=D8 --seed=0 --out=task.png
    python -m launch.show_task --dataset=omniglot --manual_dir=FOLDER_WITH_ZIPS --task=B3

The support sets are packed several to a row (the first image of each says
S<n> g<group>: its support set and class group), then the target set follows in
rows; every image is framed in its class group's colour and titled with its label.
The summary names each class group's classes. --out must be in a folder that exists.
"""

from __future__ import annotations

if __name__ == "__main__":  # the command: its first line before the imports below (JAX)
    from .starting import main
    raise SystemExit(main("show_task", __package__))

from absl import flags

from cfsl_jax.dataset_options import DATASETS, SPLITS

# The library (JAX, matplotlib) is imported once the flags are parsed (``starting.importing``).
from . import cli, starting
from .checks import check_data_flags, check_output_file, parse_task
from .options import define_data_flags, parse_options

_DATASET = flags.DEFINE_enum("dataset", "synthetic", DATASETS, "Dataset.")
_SPLIT = flags.DEFINE_enum("split", "train", SPLITS, "Class split.")
_TASK = flags.DEFINE_string("task", "D8", "Paper cell (B3, D8, ...), a type (A-D) or type+NSS "
                            "(B7); any case.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed; the task is a pure function of it.")
_OUT = flags.DEFINE_string("out", "task.png", "Where to write the PNG.")
define_data_flags()

FLAGS = flags.FLAGS


def check() -> None:
    """The task parses, the data folders exist, --out can be written."""
    with starting.importing("show_task"):
        from cfsl_jax.experiments import visualize  # noqa: F401 (imported for main)
    check_data_flags()
    check_output_file("out", _OUT.value)
    parse_task(_TASK.value)
    with cli.user_input():
        parse_options(FLAGS.dataset_option, "dataset_option")


def main(argv) -> None:
    del argv
    check()
    from cfsl_jax.experiments import visualize
    with cli.user_input():
        summary = visualize.show_task(
            dataset=_DATASET.value, split=_SPLIT.value, task=parse_task(_TASK.value),
            seed=_SEED.value, out=_OUT.value, data_dir=FLAGS.data_dir,
            manual_dir=FLAGS.manual_dir, download=FLAGS.download,
            **parse_options(FLAGS.dataset_option, "dataset_option"))
    print(summary)
    print(f"wrote {_OUT.value}")


def run() -> None:
    cli.run(main, check=check)
