"""Tables and figures of a sweep, and Figure 4 (ATM and MACs against NSS), which needs no training.

    python -m launch.report --sweep_dir=/tmp/sweep                 # Table 1s, Figure 3
    python -m launch.report --figure=atm_macs --out_dir=/tmp/fig4  # Figure 4, every learner
    python -m launch.report --figure=atm_macs --learners=protonets,init_tune --nss=1,10,100

With --sweep_dir, writes table1_<dataset>.md (Table 1 for accuracy, cross-entropy,
ATM and MACs, and the paper's published accuracy side by side where it has one)
and table1_<dataset>_<metric>.csv for every dataset of the sweep, and Figure 3
(figure3_<dataset>.png) when --figure includes accuracy_nss. --figure=atm_macs
writes figure4.png and figure4.csv: ATM and MACs per task of every learner at
every --nss on task type --task_type (C: CCI=1, overwrite), computed from shapes
and XLA's cost analysis in a few minutes on CPU. Output goes to --out_dir
(default: SWEEP_DIR/report, or ./cfsl_report without a sweep).
"""

from __future__ import annotations

if __name__ == "__main__":  # the command: its first line before the imports below (JAX)
    from .starting import main
    raise SystemExit(main("report", __package__))

from absl import app, flags

from cfsl_jax.experiments.paper_results import FIGURE4_NSS
from cfsl_jax.runtime import files
from cfsl_jax.learners import LEARNERS

# The library (JAX, matplotlib) is imported once the flags are parsed (``starting.importing``).
from . import cli, starting
from .checks import check_input_dir, check_input_file, check_output_dir
from .flag_types import define_list
from .options import define_deprecated_flag

flags.DEFINE_string("sweep_dir", None, "Sweep directory (launch.sweep --workdir; local or gs://).")
flags.DEFINE_string("out_dir", None, "Where to write (default: SWEEP_DIR/report or ./cfsl_report).")
define_list("figure", ["accuracy_nss"], "Figures: accuracy_nss (Figure 3, needs --sweep_dir), "
            "atm_macs (Figure 4, no training).", enum_values=["accuracy_nss", "atm_macs"],
            module=__name__)
flags.DEFINE_string("paper_results", None, "JSON file with the paper's numbers (default: the "
                    "table shipped in cfsl_jax/experiments/paper_results.py).")
define_list("learners", [], f"Figure 4 learners (default: all of {','.join(LEARNERS)} "
            "that build).", module=__name__)
define_list("nss", [str(n) for n in FIGURE4_NSS], "Figure 4 NSS values.", module=__name__)
flags.DEFINE_enum("task_type", "C", ["A", "B", "C", "D"], "Figure 4 task type.")
define_list("image_shape", ["28", "28", "1"], "Figure 4 image shape H,W,C.", module=__name__)
flags.DEFINE_string("compilation_cache_dir", None, "Persistent XLA cache for Figure 4 "
                    "(default: OUT_DIR/xla_cache; '' for none).")
define_deprecated_flag("compilation_cache")
flags.DEFINE_bool("reference", False, "The reference results (docs/reference) beside Table 1, "
                  "their paired differences, a convergence figure, and --sweep_dir's runs "
                  "beside them (experiments.reference_report).")
flags.DEFINE_string("reference_dir", None, "Reference results (default: the checkout's "
                    "docs/reference).")

FLAGS = flags.FLAGS


def figure4(out_dir: str) -> str:
    from cfsl_jax.experiments import figures
    from cfsl_jax.runtime import backend

    cache = FLAGS.compilation_cache_dir
    backend.enable_compilation_cache(backend.cache_dir_in(out_dir) if cache is None else cache)
    curves, skipped = figures.cost_curves(
        FLAGS.learners or LEARNERS, [int(n) for n in FLAGS.nss], FLAGS.task_type,
        tuple(int(n) for n in FLAGS.image_shape))
    if not curves:
        raise app.UsageError(f"no learner could be measured: {skipped}")
    figures.write_cost_curves_csv(curves, files.join(out_dir, "figure4.csv"))
    path = figures.plot_cost_curves(
        curves, files.join(out_dir, "figure4.png"),
        title=f"ATM and MACs per task against NSS (type {FLAGS.task_type})")
    print(f"Figure 4: {path} (numbers: {files.join(out_dir, 'figure4.csv')})")
    for key, what in (("atm", "ATM"), ("macs_per_task", "MACs")):
        for names in figures.coinciding(curves, key):
            print(f"  {what}: {' = '.join(names)} within {figures.OVERLAP_RTOL:.0%} at every "
                  f"NSS (their lines overlap)")
    return path


def check() -> None:
    """What to write is given, every input exists and parses, --out_dir can be created."""
    with starting.importing("report"):
        from cfsl_jax.experiments import reference_report, report
    if not FLAGS.sweep_dir and "atm_macs" not in FLAGS.figure and not FLAGS.reference:
        raise app.UsageError("give --sweep_dir (tables, Figure 3), --reference or "
                             "--figure=atm_macs")
    reference_dir = FLAGS.reference_dir or reference_report.default_dir()
    if FLAGS.reference and not files.isfile(files.join(reference_dir, "results.csv")):
        raise cli.UserError(f"--reference_dir={reference_dir}: holds no results.csv (the "
                            f"reference data: a checkout's docs/reference)")
    if FLAGS.reference:
        from cfsl_jax.experiments import reference
        reference.read_rows(files.join(reference_dir, "results.csv"))  # refused if not one
    if FLAGS.sweep_dir:
        check_input_dir("sweep_dir", FLAGS.sweep_dir, holding="results.json")
    if FLAGS.paper_results:
        check_input_file("paper_results", FLAGS.paper_results)
        try:
            report.load_paper_table(FLAGS.paper_results)
        except ValueError as error:  # json.JSONDecodeError included
            raise cli.UserError(f"--paper_results={FLAGS.paper_results}: {error}") from None
    check_output_dir("out_dir", FLAGS.out_dir)
    for flag, values in (("nss", FLAGS.nss), ("image_shape", FLAGS.image_shape)):
        if not all(v.isdigit() and int(v) > 0 for v in values):
            raise cli.UserError(f"--{flag}={','.join(values)}: every value must be a positive "
                                f"integer")
    if len(FLAGS.image_shape) != 3:
        raise cli.UserError(f"--image_shape={','.join(FLAGS.image_shape)}: give H,W,C")
    unknown = [name for name in FLAGS.learners if name not in LEARNERS]
    if unknown:
        raise cli.UserError(f"--learners={','.join(FLAGS.learners)}: unknown "
                            f"{', '.join(unknown)}; valid: "
                            f"{', '.join(LEARNERS)}")


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    check()
    default = files.join(FLAGS.sweep_dir, "report") if FLAGS.sweep_dir else "cfsl_report"
    out_dir = FLAGS.out_dir or default
    created = not files.exists(out_dir)
    files.makedirs(out_dir)
    try:
        write(out_dir)
    except BaseException:  # refused (a damaged or mixed input): no empty folder left behind
        if created and files.isdir(out_dir) and not files.listdir(out_dir):
            files.rmtree(out_dir)
        raise


def write(out_dir: str) -> None:
    """The report's files in ``out_dir`` (which exists), as the flags ask."""
    from cfsl_jax.experiments import reference_report, report
    if FLAGS.reference:
        paths = reference_report.write(FLAGS.reference_dir or reference_report.default_dir(),
                                       out_dir, FLAGS.sweep_dir, report.load_paper_table(
                                           FLAGS.paper_results))
        print(files.read_text(paths["markdown"]) + f"written: {paths['markdown']}")
    elif FLAGS.sweep_dir:
        try:
            paper = report.load_paper_table(FLAGS.paper_results)
            paths = report.write_report(FLAGS.sweep_dir, out_dir, paper,
                                        figure3="accuracy_nss" in FLAGS.figure)
        except (FileNotFoundError, ValueError) as error:
            raise app.UsageError(str(error)) from error
        for dataset, path in paths["markdown"].items():
            print(files.read_text(path))
            print(f"written: {path}, CSVs {sorted(paths['csv'][dataset].values())}"
                  + (f", Figure 3 {paths['figure3'][dataset]}"
                     if paths["figure3"].get(dataset) else ""))
    if "atm_macs" in FLAGS.figure:
        figure4(out_dir)


def run() -> None:
    cli.run(main, check=check)
