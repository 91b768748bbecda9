"""Published numbers of Antoniou, Patacchiola, Ochal and Storkey, "Defining Benchmarks for
Continual Few-Shot Learning" (arXiv:2004.11967), for the reports' side-by-side column.

Layout (``report.load_paper_table`` reads the same layout from a JSON file):

    {"source": URL, "table": "Table 1", "note": str,
     "values": {paper dataset: {learner: {cell: {"mean": float, "std": float}}}}}

``values`` hold test accuracy in percent, as printed in the paper; learners are
named as in ``cfsl_jax.learners.LEARNERS``, cells as in ``spec.PAPER_GRID``,
datasets as the values of ``PAPER_DATASETS`` (or, in a JSON file of one's own
numbers, as our dataset names). Only numbers read in the source may go here,
never estimates: a cell the table lacks is simply absent.
"""

from __future__ import annotations

# Our dataset names -> the dataset of the paper their numbers compare with. The paper
# used full Omniglot; omniglot/small (242 characters) is compared with it for reference only.
PAPER_DATASETS: dict[str, str] = {"omniglot": "omniglot", "omniglot/full": "omniglot",
                                  "omniglot/small": "omniglot", "slimagenet64": "slimagenet64"}

TABLE1: dict = {
    "source": "https://arxiv.org/abs/2004.11967",
    "table": "Table 1",
    "note": ("Empty: the paper's Table 1 could not be read from the sources available when "
             "this file was written (only its abstract and introduction were). Add its numbers "
             "here, each as printed, with the source; or pass --paper_results=FILE.json."),
    "values": {},
}
