"""Nothing a run or an import does leaks into the process: the user's matplotlib backend stays,
progress prefixes are scoped."""

import subprocess
import sys
import threading

from cfsl_jax.runtime import progress


def test_importing_the_package_leaves_the_matplotlib_backend_alone():
    code = ("import matplotlib, sys; matplotlib.use('svg'); "
            "import cfsl_jax.experiments.figures, cfsl_jax.experiments.visualize, cfsl_jax.experiments.report, cfsl_jax.fluid.report; "
            "print(matplotlib.get_backend(), 'matplotlib.pyplot' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.split() == ["svg", "False"], result.stderr[-2000:]


def test_a_figure_is_drawn_without_pyplot(tmp_path):
    from cfsl_jax.experiments import figures
    path = figures.plot_cost_curves({"protonets": [{"nss": 1, "atm": 1.0, "macs_per_task": 2.0},
                                                   {"nss": 2, "atm": 1.5, "macs_per_task": 4.0}]},
                                    str(tmp_path / "curves.png"))
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_progress_prefix_holds_inside_its_block_and_its_stages_only(monkeypatch, capsys):
    monkeypatch.setenv("CFSL_PROGRESS", "1")
    with progress.prefixed("protonets/B3/seed0: "):
        progress.say("inside")
        with progress.stage("compiling", heartbeat=0.01):
            threading.Event().wait(0.05)
    progress.say("after")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "protonets/B3/seed0: inside" and lines[-1] == "after"
    assert all(line.startswith("protonets/B3/seed0: ") for line in lines[:-1])
    assert any("still compiling" in line for line in lines)  # from the heartbeat thread
