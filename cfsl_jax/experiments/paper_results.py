"""Published numbers of Antoniou, Patacchiola, Ochal and Storkey, "Defining Benchmarks for
Continual Few-Shot Learning" (arXiv:2004.11967), for the reports' side-by-side column.

``TABLE1`` is the paper's Table 1 ("Accuracy and standard deviation (percentage) on the
test set for the proposed benchmarks"), both datasets, all 8 learners, all 11 cells:
176 entries. ``TABLE1_TEXT`` is the table's text, one printed row per line (cells
separated by `` | ``, as the paper prints them, "±" included); ``parse_table1`` reads it.
Layout (``report.load_paper_table`` reads the same layout from a JSON file)::

    {"source": str, "table": str, "note": str,
     "values": {paper dataset: {learner: {cell: {"mean": float, "std": float,
                                                  "mean_printed": str, "std_printed": str}}}}}

``mean``/``std`` are test accuracy in percent; ``*_printed`` keep the printed digits
("95.30", "8.4": SlimageNet64's fine-tuning and ProtoNets/MAML rows print one decimal).
Learners are named as in ``cfsl_jax.learners.LEARNERS``, cells as in ``spec.PAPER_GRID``,
datasets as the values of ``PAPER_DATASETS``. Only printed numbers go here, never
estimates; a JSON file of one's own numbers needs only ``mean`` and ``std``.

Header of the A5 column: the table prints CCI=1, but an A (new samples) task has
CCI >= NSS, and the authors' configs for that cell use CCI=5
(``experiment_config/*_True_5_5_*.json``); the column is read as A5 = NSS 5, CCI 5.

A second source, ``AUTHORS_CSV_FEB2020``, holds the authors' earlier results file
(``omniglot_variant.csv`` at commit 39025a3, Feb 2020; Omniglot only, one decimal). It
is not the published table: its D cells and fine-tuning rows differ from Table 1, and
its ``standard-vgg-fine-tune-pretrained`` rows are Table 1's "Pre. & Tune" (the
figure script's legend, which called them "Init + Tune", had them swapped). It is
kept, with that mapping, as the authors' own machine-readable record of the runs;
the reports use ``TABLE1``.
"""

from __future__ import annotations

from cfsl_jax.protocol.spec import PAPER_GRID, TaskSpec

# Our dataset names -> the dataset of the paper their numbers compare with. The paper
# used full Omniglot; omniglot/small (242 characters) is compared with it for reference only.
# A variant's name adds its preprocessing (``cfsl_jax.datasets.preprocessing``): nearest-neighbour
# Omniglot (the authors') is ``*_nearest``, ImageNet-normalised SlimageNet64 (the authors')
# ``slimagenet64/imagenet_norm``; the names without a suffix are the other settings.
PAPER_DATASETS: dict[str, str] = {
    "omniglot": "omniglot", "omniglot/full": "omniglot", "omniglot/small": "omniglot",
    "omniglot/full_nearest": "omniglot", "omniglot/small_nearest": "omniglot",
    "slimagenet64": "slimagenet64", "slimagenet64/imagenet_norm": "slimagenet64"}
# Ours that hold the paper's images (omniglot/small is 242 of Omniglot's 1,623 characters).
# On full Omniglot the classes of each split also depend on the dataset option class_split:
# ``other_classes``.
SAME_DATA: tuple[str, ...] = ("omniglot", "omniglot/full", "omniglot/full_nearest",
                              "slimagenet64", "slimagenet64/imagenet_norm")
# Table 1's Omniglot numbers came from the authors' class split (docs/fidelity.md, "Omniglot
# class split"); the default, ``ordered``, trains and tests on other characters.
PAPER_CLASS_SPLIT = "authors"
# The NSS values of Figure 4 (ATM and MACs per task against NSS, log-log): ``figures.cost_curves``.
FIGURE4_NSS: tuple[int, ...] = (1, 2, 5, 10, 20, 40, 80, 160, 320, 640)


def other_classes(dataset: str, dataset_options: dict) -> str | None:
    """The class split of a run on full Omniglot (one of ``SAME_DATA``) when it is not the one
    Table 1 came from (``PAPER_CLASS_SPLIT``): its train, validation and test characters are
    others, so a comparison with Table 1 is indicative only; None otherwise."""
    if dataset not in SAME_DATA or not dataset.startswith("omniglot"):
        return None
    split = dataset_options.get("class_split", "ordered")
    return None if split == PAPER_CLASS_SPLIT else split

SOURCE = ("Antoniou, Patacchiola, Ochal, Storkey. Defining Benchmarks for Continual Few-Shot "
          "Learning. arXiv:2004.11967, Table 1")

# Table 1 as printed: 4 header rows, then 8 rows per dataset (the dataset named on its first).
TABLE1_TEXT = """\
Task Type | B | C | A | D | B | C | A | D | B | C | A
NSS | 3 | 3 | 3 | 4 | 5 | 5 | 5 | 8 | 10 | 10 | 10
CCI | 1 | 1 | 3 | 2 | 1 | 1 | 1 | 2 | 1 | 1 | 10
Overwrite | False | True | True | False | False | True | True | False | False | True | True
Omniglot | Init & Tune | 10.87±0.01 | 27.51±0.01 | 44.76±0.01 | 8.74±0.01 | 6.15±0.01 | 24.52±0.01 | 45.30±0.01 | 3.93±0.01 | 3.12±0.01 | 22.16±0.01 | 45.64±0.01
  | Pre. & Tune | 9.97±0.14 | 26.75±0.27 | 32.44±0.29 | 7.91±0.15 | 6.02±0.02 | 24.51±0.06 | 31.89±1.10 | 3.86±0.06 | 3.13±0.03 | 22.30±0.06 | 33.17±0.39
  | EWC-Init | 10.75±0.00 | 27.76±0.00 | 42.55±0.00 | 8.72±0.00 | 6.23±0.00 | 24.49±0.00 | 42.18±0.00 | 3.91±0.00 | 3.02±0.00 | 22.22±0.01 | 41.82±0.00
  | EWC-Pre. | 9.55±0.00 | 26.23±0.00 | 30.27±0.00 | 7.73±0.00 | 5.93±0.00 | 24.20±0.00 | 30.15±0.00 | 3.71±0.00 | 3.23±0.02 | 22.10±0.00 | 30.14±0.00
  | ProtoNets | 95.30±0.12 | 45.44±0.19 | 98.73±0.02 | 48.98±0.03 | 91.52±0.20 | 35.10±0.09 | 98.73±0.12 | 48.44±0.03 | 83.72±0.19 | 27.39±0.17 | 98.65±0.14
  | MAML++L | 38.18±0.14 | 46.12±0.15 | 99.38±0.07 | 28.87±0.07 | 22.69±0.07 | 35.76±0.14 | 99.41±0.04 | 14.29±0.05 | 11.30±0.02 | 27.82±0.03 | 99.44±0.01
  | MAML++H | 96.14±0.02 | 96.77±0.08 | 99.73±0.04 | 49.44±0.02 | 92.70±0.03 | 93.47±0.05 | 99.80±0.01 | 49.00±0.04 | 85.56±0.10 | 86.38±0.14 | 99.86±0.01
  | SCA | 96.84±0.04 | 97.38±0.02 | 99.82±0.01 | 49.71±0.01 | 93.81±0.02 | 94.08±0.45 | 99.88±0.03 | 49.51±0.01 | 86.07±0.03 | 87.29±0.19 | 99.88±0.01
SlimageNet64 | Init & Tune | 8.4±0.01 | 21.3±0.01 | 24.4±0.01 | 6.1±0.01 | 4.5±0.01 | 20.8±0.01 | 24.7±0.01 | 3.0±0.01 | 2.4±0.01 | 20.5±0.01 | 24.9±0.01
  | Pre. & Tune | 8.7±0.03 | 21.9±0.11 | 24.2±0.17 | 6.4±0.01 | 4.9±0.02 | 21.2±0.05 | 24.5±0.23 | 3.3±0.03 | 2.7±0.03 | 20.7±0.10 | 24.4±0.20
  | EWC-Init | 8.51±0.00 | 21.66±0.00 | 24.81±0.00 | 6.11±0.00 | 4.60±0.00 | 20.98±0.00 | 24.87±0.00 | 2.93±0.00 | 2.38±0.00 | 20.39±0.00 | 24.67±0.00
  | EWC-Pre. | 8.83±0.09 | 22.21±0.04 | 23.47±0.09 | 6.42±0.08 | 5.18±0.01 | 21.17±0.06 | 23.44±0.35 | 3.26±0.02 | 2.66±0.01 | 20.74±0.04 | 24.40±0.42
  | ProtoNets | 24.1±0.05 | 25.9±0.23 | 43.1±0.24 | 15.1±0.03 | 18.2±0.14 | 22.7±0.09 | 43.3±0.03 | 10.4±0.12 | 12.3±0.09 | 21.0±0.06 | 43.7±0.15
  | MAML++L | 13.6±0.04 | 25.5±0.23 | 42.7±0.10 | 10.2±0.11 | 7.9±0.13 | 22.6±0.03 | 43.0±0.12 | 5.0±0.08 | 3.6±0.14 | 20.8±0.09 | 43.0±0.42
  | MAML++H | 27.2±0.25 | 33.8±0.16 | 61.2±0.36 | 16.8±0.18 | 21.0±0.21 | 30.4±0.51 | 68.6±0.47 | 12.3±0.11 | 14.4±0.12 | 25.7±0.10 | 75.6±0.10
  | SCA | 27.9±0.16 | 34.0±0.23 | 65.3±0.15 | 17.3±0.07 | 22.0±0.18 | 30.1±0.36 | 72.0±0.36 | 12.7±0.08 | 14.6±0.07 | 26.3±0.13 | 77.4±0.06
"""

# The table's row labels -> our learner names.
TABLE1_LEARNERS: dict[str, str] = {
    "Init & Tune": "init_tune", "Pre. & Tune": "pretrain_tune", "EWC-Init": "ewc_init",
    "EWC-Pre.": "ewc_pretrain", "ProtoNets": "protonets", "MAML++L": "maml_low",
    "MAML++H": "maml_high", "SCA": "sca",
}
TABLE1_DATASETS: dict[str, str] = {"Omniglot": "omniglot", "SlimageNet64": "slimagenet64"}
# Header entries that the table prints and the cell does not have: (cell, field) -> printed.
HEADER_MISPRINTS: dict[tuple[str, str], str] = {("A5", "CCI"): "1"}


def _cells(header: dict[str, list[str]]) -> list[str]:
    """The paper cell of every column, checked against the header's NSS/CCI/overwrite."""
    cells = []
    for column, (kind, nss) in enumerate(zip(header["Task Type"], header["NSS"])):
        cell = f"{kind}{nss}"
        spec = TaskSpec.preset(cell)
        printed = {"NSS": spec.nss, "CCI": spec.cci, "Overwrite": spec.overwrite}
        for field, value in printed.items():
            text = header[field][column]
            if text != str(value) and HEADER_MISPRINTS.get((cell, field)) != text:
                raise ValueError(f"Table 1 column {column} ({cell}): {field} printed {text}, "
                                 f"the cell has {value}")
        cells.append(cell)
    if sorted(cells) != sorted(PAPER_GRID):
        raise ValueError(f"Table 1 columns {cells} are not the paper grid {PAPER_GRID}")
    return cells


def parse_table1(text: str = TABLE1_TEXT) -> dict[str, dict[str, dict[str, dict]]]:
    """{dataset: {learner: {cell: {"mean", "std", "mean_printed", "std_printed"}}}}."""
    lines = [[part.strip() for part in line.split("|")] for line in text.splitlines()]
    header = {line[0]: line[1:] for line in lines[:4]}
    cells = _cells(header)
    values: dict[str, dict[str, dict[str, dict]]] = {}
    dataset = None
    for line in lines[4:]:
        dataset = TABLE1_DATASETS[line[0]] if line[0] else dataset
        learner = TABLE1_LEARNERS[line[1]]
        if len(line) != 2 + len(cells):
            raise ValueError(f"Table 1 row {line[:2]} has {len(line) - 2} entries, "
                             f"expected {len(cells)}")
        row = values.setdefault(dataset, {}).setdefault(learner, {})
        for cell, entry in zip(cells, line[2:]):
            mean, std = entry.split("±")
            row[cell] = {"mean": float(mean), "std": float(std),
                         "mean_printed": mean, "std_printed": std}
    return values


TABLE1: dict = {
    "source": SOURCE,
    "table": "Table 1",
    "note": ("The paper's Table 1 (both datasets, 8 learners, 11 cells). Its A5 header "
             "prints CCI=1; the authors' configs use CCI=5. Pass --paper_results=FILE.json "
             "to compare with other numbers."),
    "values": parse_table1(),
}


def printed(entry: dict) -> str:
    """An entry as the paper prints it ("95.30 ± 0.12"), or with two decimals without text."""
    mean = entry.get("mean_printed", f"{entry['mean']:.2f}")
    std = entry.get("std_printed", f"{entry['std']:.2f}")
    return f"{mean} ± {std}"


# ---- the authors' earlier results file (second source, not used by the reports) ------------

AUTHORS_CSV_SOURCE = ("https://github.com/AntreasAntoniou/FewShotContinualLearning/blob/"
                      "39025a39425fcb32ed57cc2e1af15973a5d29c30/omniglot_variant.csv")

# The CSV's Model column -> ours, by matching its numbers with Table 1's rows.
AUTHORS_CSV_MODELS: dict[str, str] = {
    "intrinsic-densenet-embedding-based": "sca",
    "standard-densenet-embedding-based": "maml_high",
    "standard-vgg-based": "maml_low",
    "standard-vgg-fine-tune-pretrained": "pretrain_tune",  # Table 1 "Pre. & Tune"
    "standard-vgg-fine-tune-scratch": "init_tune",  # Table 1 "Init & Tune"
    "standard-vgg-matching-network": "protonets",
}

# (Model, Overwrite, NSS, CCI, Acc, Std) of omniglot_variant.csv, in its order.
_CSV_ROWS: tuple[tuple[str, int, int, int, float, float], ...] = (
    ("intrinsic-densenet-embedding-based", 0, 3, 1, 96.8, 0.04),
    ("intrinsic-densenet-embedding-based", 1, 3, 1, 97.4, 0.02),
    ("intrinsic-densenet-embedding-based", 0, 5, 1, 93.8, 0.02),
    ("intrinsic-densenet-embedding-based", 1, 5, 1, 94.1, 0.45),
    ("intrinsic-densenet-embedding-based", 0, 10, 1, 86.1, 0.03),
    ("intrinsic-densenet-embedding-based", 1, 10, 1, 87.3, 0.19),
    ("intrinsic-densenet-embedding-based", 0, 4, 2, 52.1, 0.10),
    ("intrinsic-densenet-embedding-based", 0, 8, 2, 49.8, 0.10),
    ("intrinsic-densenet-embedding-based", 1, 3, 3, 99.8, 0.01),
    ("intrinsic-densenet-embedding-based", 1, 5, 5, 99.9, 0.03),
    ("intrinsic-densenet-embedding-based", 1, 10, 10, 99.9, 0.01),
    ("standard-densenet-embedding-based", 0, 3, 1, 96.1, 0.02),
    ("standard-densenet-embedding-based", 1, 3, 1, 96.8, 0.08),
    ("standard-densenet-embedding-based", 0, 5, 1, 92.7, 0.03),
    ("standard-densenet-embedding-based", 1, 5, 1, 93.5, 0.05),
    ("standard-densenet-embedding-based", 0, 10, 1, 85.6, 0.10),
    ("standard-densenet-embedding-based", 1, 10, 1, 86.4, 0.14),
    ("standard-densenet-embedding-based", 0, 4, 2, 51.6, 0.15),
    ("standard-densenet-embedding-based", 0, 8, 2, 49.2, 0.20),
    ("standard-densenet-embedding-based", 1, 3, 3, 99.7, 0.04),
    ("standard-densenet-embedding-based", 1, 5, 5, 99.8, 0.00),
    ("standard-densenet-embedding-based", 1, 10, 10, 99.9, 0.01),
    ("standard-vgg-based", 0, 3, 1, 38.2, 0.14),
    ("standard-vgg-based", 1, 3, 1, 46.1, 0.15),
    ("standard-vgg-based", 0, 5, 1, 22.7, 0.07),
    ("standard-vgg-based", 1, 5, 1, 35.8, 0.14),
    ("standard-vgg-based", 0, 10, 1, 11.3, 0.02),
    ("standard-vgg-based", 1, 10, 1, 27.8, 0.03),
    ("standard-vgg-based", 0, 4, 2, 29.6, 0.07),
    ("standard-vgg-based", 0, 8, 2, 14.9, 0.03),
    ("standard-vgg-based", 1, 3, 3, 99.4, 0.07),
    ("standard-vgg-based", 1, 5, 5, 99.4, 0.04),
    ("standard-vgg-based", 1, 10, 10, 99.4, 0.01),
    ("standard-vgg-fine-tune-pretrained", 0, 3, 1, 10.0, 0.14),
    ("standard-vgg-fine-tune-pretrained", 1, 3, 1, 26.7, 0.27),
    ("standard-vgg-fine-tune-pretrained", 0, 5, 1, 6.0, 0.02),
    ("standard-vgg-fine-tune-pretrained", 1, 5, 1, 24.5, 0.06),
    ("standard-vgg-fine-tune-pretrained", 0, 10, 1, 3.1, 0.03),
    ("standard-vgg-fine-tune-pretrained", 1, 10, 1, 22.3, 0.06),
    ("standard-vgg-fine-tune-pretrained", 0, 4, 2, 7.7, 0.15),
    ("standard-vgg-fine-tune-pretrained", 0, 8, 2, 4.3, 0.06),
    ("standard-vgg-fine-tune-pretrained", 1, 3, 3, 32.4, 0.29),
    ("standard-vgg-fine-tune-pretrained", 1, 5, 5, 31.9, 1.10),
    ("standard-vgg-fine-tune-pretrained", 1, 10, 10, 33.2, 0.39),
    ("standard-vgg-fine-tune-scratch", 0, 3, 1, 10.9, 0.00),
    ("standard-vgg-fine-tune-scratch", 1, 3, 1, 27.5, 0.00),
    ("standard-vgg-fine-tune-scratch", 0, 5, 1, 6.1, 0.00),
    ("standard-vgg-fine-tune-scratch", 1, 5, 1, 24.5, 0.00),
    ("standard-vgg-fine-tune-scratch", 0, 10, 1, 3.1, 0.00),
    ("standard-vgg-fine-tune-scratch", 1, 10, 1, 22.2, 0.00),
    ("standard-vgg-fine-tune-scratch", 0, 4, 2, 8.8, 0.00),
    ("standard-vgg-fine-tune-scratch", 0, 8, 2, 3.9, 0.00),
    ("standard-vgg-fine-tune-scratch", 1, 3, 3, 44.8, 0.00),
    ("standard-vgg-fine-tune-scratch", 1, 5, 5, 45.3, 0.00),
    ("standard-vgg-fine-tune-scratch", 1, 10, 10, 45.6, 0.00),
    ("standard-vgg-matching-network", 0, 3, 1, 95.3, 0.12),
    ("standard-vgg-matching-network", 1, 3, 1, 45.4, 0.19),
    ("standard-vgg-matching-network", 0, 5, 1, 91.5, 0.20),
    ("standard-vgg-matching-network", 1, 5, 1, 35.1, 0.09),
    ("standard-vgg-matching-network", 0, 10, 1, 83.7, 0.19),
    ("standard-vgg-matching-network", 1, 10, 1, 27.4, 0.17),
    ("standard-vgg-matching-network", 0, 4, 2, 46.2, 0.09),
    ("standard-vgg-matching-network", 0, 8, 2, 44.6, 0.09),
    ("standard-vgg-matching-network", 1, 3, 3, 98.7, 0.02),
    ("standard-vgg-matching-network", 1, 5, 5, 98.7, 0.12),
    ("standard-vgg-matching-network", 1, 10, 10, 98.6, 0.14),
)


def _csv_values(rows) -> dict[str, dict[str, dict[str, float]]]:
    """{learner: {cell: {"mean", "std"}}} of (Model, Overwrite, NSS, CCI, Acc, Std) rows."""
    cells = {}
    for cell in PAPER_GRID:
        spec = TaskSpec.preset(cell)
        cells[(int(spec.overwrite), spec.nss, spec.cci)] = cell
    values: dict[str, dict[str, dict[str, float]]] = {}
    for model, overwrite, nss, cci, mean, std in rows:
        cell = cells[(overwrite, nss, cci)]
        values.setdefault(AUTHORS_CSV_MODELS[model], {})[cell] = {"mean": mean, "std": std}
    return values


AUTHORS_CSV_FEB2020: dict = {
    "source": AUTHORS_CSV_SOURCE,
    "table": "the authors' results file of Feb 2020 (not the published Table 1)",
    "note": ("Omniglot only, one decimal; its D cells and fine-tuning rows differ from "
             "the published Table 1. Its NSS=1 rows (not a grid cell) are "
             "AUTHORS_CSV_ONE_SUPPORT_SET."),
    "values": {"omniglot": _csv_values(_CSV_ROWS)},
}

# The same file's NSS=1 rows (Overwrite 0, NSS 1, CCI 1: a task of one support set), copied
# as printed: {learner: {"mean", "std"}}. Where only the last support set reached the target
# set (the paper-era fine-tuners), an A cell measures this task's accuracy (experiments.paper_era;
# Init+Tune's A cells lie 1.8-2.6 points above its 43.0).
AUTHORS_CSV_ONE_SUPPORT_SET: dict[str, dict[str, float]] = {
    AUTHORS_CSV_MODELS[model]: {"mean": mean, "std": std} for model, mean, std in (
        ("intrinsic-densenet-embedding-based", 99.8, 0.01),
        ("standard-densenet-embedding-based", 99.5, 0.03),
        ("standard-vgg-based", 99.5, 0.03),
        ("standard-vgg-fine-tune-pretrained", 33.1, 2.04),
        ("standard-vgg-fine-tune-scratch", 43.0, 0.00),
        ("standard-vgg-matching-network", 98.5, 0.04),
    )
}
