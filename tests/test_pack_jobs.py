"""How a sweep's packs are run as jobs: a SLURM array task's pack shrinks with ``--pack=auto``
as a local sweep's does, and a pack that fails says so before its runs go on alone."""

import signal

from absl import flags

from launch_inprocess import command_module
from cfsl_jax.experiments import slurm, sweep
from cfsl_jax.training import packing


def test_a_slurm_pack_of_pack_auto_shrinks_and_an_explicit_one_does_not(monkeypatch, tmp_path):
    """``launch.sweep --launcher=slurm --pack=auto`` submits PackJobs that shrink a pack too
    large for the job's device (``execute_pack(shrink=True)``); ``--pack=2`` submits ones that
    do not."""
    calls = []
    monkeypatch.setattr(sweep, "execute_pack", lambda configs, workdirs, shrink=False:
                        calls.append(shrink) or [("finished", 0.0, "ok")] * len(workdirs))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR2)}
    try:
        for pack, shrinks in (("auto", True), ("2", False)):
            with command_module("sweep") as module:
                flags.FLAGS(["cfsl-sweep", f"--workdir={tmp_path}", "--seeds=0,1", f"--pack={pack}"])
                job = module.slurm_job({})
            assert isinstance(job, slurm.PackJob)
            assert job([{}, {}], ["a", "b"]) == "2 runs finished"
            assert calls.pop() is shrinks
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)


def test_a_failed_pack_says_so_and_its_runs_go_on_alone(monkeypatch, capsys):
    """A pack whose program fails (here: a fault raised by its training) prints one line naming
    the pack and the error, then each run is executed alone, where it reports its own error."""
    def broken(*args, **kwargs):
        raise RuntimeError("XLA ran out of something\nRESOURCE_EXHAUSTED: 3 GiB more")
    monkeypatch.setattr(packing, "meta_train_pack", broken)
    alone = []
    monkeypatch.setattr(sweep, "execute", lambda config, workdir, tested=None:
                        alone.append(workdir) or ("finished", 1.0, "test acc 0.5000"))
    outcomes = sweep.execute_pack([{"seed": 0}, {"seed": 1}], ["w/seed0", "w/seed1"])
    out = capsys.readouterr().out
    assert ("[sweep] the pack of 2 (w/seed0, w/seed1) failed: RuntimeError: RESOURCE_EXHAUSTED: "
            "3 GiB more; its runs go on one at a time") in out, out
    assert alone == ["w/seed0", "w/seed1"]
    assert [state for state, _, _ in outcomes] == ["finished", "finished"]
