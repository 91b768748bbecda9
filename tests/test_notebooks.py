"""The notebooks run top to bottom (nbclient, this environment's python3 kernel) with tiny
settings injected after their "parameters" cell (papermill's convention), writing only into
temporary directories; and they are stored clean (no outputs). Their shared "install" cell uses
the checkout it is opened from, and on Colab asks for the repository's URL.

The injected settings are tests/test_sweep_report.py's tiny sweep, compiled with the same jax
options into the session's persistent compilation cache, so whichever test runs first
compiles and the other loads.
"""

import importlib.util
import os

import jax
import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from cfsl_jax.training.config import TrainConfig
from conftest import TINY_SWEEP, WORKER_JAX_OPTIONS
from conftest import TINY_SWEEP_LEARNER_OPTIONS as LEARNER_OPTIONS

TINY = TrainConfig(**TINY_SWEEP)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = ("quickstart", "reproduce_table1", "atm_macs")
BUDGET = {name: getattr(TINY, name) for name in (
    "epochs", "iters_per_epoch", "meta_batch", "val_tasks", "test_tasks", "eval_batch",
    "keep_best", "log_every")}


def settings(name: str, out_dir: str) -> dict:
    """Tiny values for the notebook's parameters."""
    common = {"DATASET_OPTIONS": TINY.dataset_options, "SPEC_OVERRIDES": TINY.spec_overrides,
              "LEARNER_OPTIONS": TINY.learner_options, "BUDGET": BUDGET}
    if name == "quickstart":  # no WORKDIR: the notebook makes a fresh folder of its own
        return {**common, "TASK": "B2"}
    if name == "reproduce_table1":
        return {**common, "SWEEP_DIR": out_dir, "WORKERS": 2,
                "LEARNERS": ["protonets", "init_tune"], "CELLS": ["B2", "C2"], "SEEDS": [0],
                "PER_LEARNER_OPTIONS": LEARNER_OPTIONS}
    return {"LEARNERS": ["protonets", "init_tune"], "NSS": [1, 2, 4], "OUT_DIR": out_dir,
            "CACHE_DIR": jax.config.values["jax_compilation_cache_dir"],
            "LEARNER_OPTIONS": {"protonets": {"filters": 8},
                                "init_tune": {"filters": 8, "inner_steps": 1}}}


def injected_cell(name: str, out_dir: str) -> nbformat.NotebookNode:
    options = {"jax_compilation_cache_dir": jax.config.values["jax_compilation_cache_dir"],
               "jax_persistent_cache_min_entry_size_bytes": 0}
    if name != "atm_macs":  # atm_macs compiles as tests/test_sweep_report.py's Figure 4 test
        options.update(WORKER_JAX_OPTIONS)
    lines = ["import jax", f"for name, value in {options!r}.items():",
             "    jax.config.update(name, value)"]
    lines += [f"{key} = {value!r}" for key, value in settings(name, out_dir).items()]
    return nbformat.v4.new_code_cell("\n".join(lines), metadata={"tags": ["injected-parameters"]})


def load(name: str) -> nbformat.NotebookNode:
    return nbformat.read(os.path.join(REPO, "notebooks", f"{name}.ipynb"), as_version=4)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_stored_clean_with_a_parameters_cell(name):
    notebook = load(name)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(not cell.outputs and cell.execution_count is None for cell in code)
    assert sum("parameters" in cell.metadata.get("tags", []) for cell in code) == 1


def install_cell(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    (cell,) = [cell for cell in notebook.cells if "install" in cell.metadata.get("tags", [])]
    return cell


def run_install_cell(path: str, setup: str = "") -> str:
    """Run the install cell (after ``setup``) in a fresh kernel started in ``path``."""
    cells = [nbformat.v4.new_code_cell(setup)] if setup else []
    notebook = nbformat.v4.new_notebook(cells=cells + [install_cell(load("quickstart"))])
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": path}}).execute()
    return "\n".join(output.get("text", "") for output in notebook.cells[-1].outputs)


def test_the_notebooks_share_one_install_cell_with_a_repository_field():
    sources = {install_cell(load(name)).source for name in NOTEBOOKS}
    assert len(sources) == 1
    (source,) = sources
    assert 'REPO_URL = ""  # @param {type:"string"}' in source and "CFSL_JAX_REPO" in source


def test_the_install_cell_uses_the_checkout_it_is_opened_from(tmp_path):
    repo = os.path.realpath(REPO)
    installed = os.path.dirname(os.path.dirname(importlib.util.find_spec("cfsl_jax").origin))
    if os.path.realpath(installed) != repo:
        pytest.skip(f"cfsl_jax is installed from {installed}, not this checkout: the cell "
                    f"would install this checkout into the environment")
    text = run_install_cell(os.path.join(repo, "notebooks"))
    assert f"from {os.path.join(repo, 'cfsl_jax')} (the checkout {repo})" in text
    assert "(the checkout" not in run_install_cell(str(tmp_path))  # not in a checkout


def test_on_colab_the_install_cell_asks_for_the_repository(tmp_path):
    colab = ("import os, sys, types\n"
             "sys.modules['google.colab'] = types.ModuleType('google.colab')\n")
    with pytest.raises(CellExecutionError) as error:
        run_install_cell(str(tmp_path), colab + "os.environ.pop('CFSL_JAX_REPO', None)")
    assert error.value.ename == "RuntimeError"
    assert error.value.evalue.startswith("Set REPO_URL (the form field of this cell) or the "
                                         "environment variable CFSL_JAX_REPO")
    # With the variable set, the cell goes on (cfsl_jax is installed here: nothing to clone).
    text = run_install_cell(str(tmp_path), colab + "os.environ['CFSL_JAX_REPO'] = 'unused'")
    assert text.startswith("cfsl_jax ")


FOLDERS = {"quickstart": "WORKDIR", "reproduce_table1": "SWEEP_DIR", "atm_macs": "OUT_DIR"}


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_a_notebook_writes_into_a_fresh_folder_of_its_own(name):
    """No notebook hard-codes a folder (the quickstart's /tmp/cfsl_quickstart was the README
    command's workdir): by default each makes a new temporary folder and prints it."""
    notebook = load(name)
    code = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    parameters = next(cell.source for cell in notebook.cells
                      if "parameters" in cell.metadata.get("tags", []))
    assert "/tmp" not in code
    assert f"{FOLDERS[name]} = None" in parameters
    assert f"{FOLDERS[name]} = tempfile.mkdtemp(prefix=" in code
    assert f'print("writing under", {FOLDERS[name]})' in code


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_top_to_bottom(name, tmp_path, monkeypatch):
    notebook = load(name)
    position = next(i for i, cell in enumerate(notebook.cells)
                    if "parameters" in cell.metadata.get("tags", []))
    out_dir = str(tmp_path / "out")
    notebook.cells.insert(position + 1, injected_cell(name, out_dir))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the kernel's temporary folders
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "\n".join(output.get("text", "") for cell in notebook.cells
                     for output in cell.get("outputs", []))
    if name == "quickstart":
        fresh = [f for f in os.listdir(tmp_path) if f.startswith("cfsl_quickstart_")]
        assert len(fresh) == 1 and f"writing under {tmp_path / fresh[0]}" in text
        out_dir = str(tmp_path / fresh[0])
        assert "chance level 0.167; ProtoNets" in text
        assert "  group 0: classes synthetic/glyph" in text  # the task's classes by name
        assert any(line.startswith("[train] ") and " steps (" in line
                   for line in text.splitlines())  # progress lines render in the notebook
        assert os.path.exists(os.path.join(out_dir, "results.json"))
    elif name == "reproduce_table1":
        assert "4 finished" in text
        assert "[sweep] 4/4 runs (100%)" in text  # the sweep's progress renders in the notebook
        assert os.path.exists(os.path.join(out_dir, "report", "table1_synthetic.md"))
    else:
        assert "slopes: ATM -1.000" in text
        assert "[figure 4] " in text
        assert os.path.getsize(os.path.join(out_dir, "figure4.png")) > 0
