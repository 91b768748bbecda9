"""How a sweep's packs are run as jobs: a SLURM array task's pack shrinks with ``--pack=auto``
as a local sweep's does, a pack that fails says so before its runs go on alone, and a pack
computed with ``lax.map`` over its runs (``pack_axis="map"``) trains each run as alone."""

import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags

from launch_inprocess import command_module
from cfsl_jax.experiments import slurm, sweep
from cfsl_jax.runtime import seeding
from cfsl_jax.training import packing, runs, steps, train
from cfsl_jax.training.config import TrainConfig


def test_a_slurm_pack_of_pack_auto_shrinks_and_an_explicit_one_does_not(monkeypatch, tmp_path):
    """``launch.sweep --launcher=slurm --pack=auto`` submits PackJobs that shrink a pack too
    large for the job's device (``PackOptions(shrink=True)``); ``--pack=2`` submits ones that
    do not."""
    calls = []
    monkeypatch.setattr(sweep, "execute_pack", lambda configs, workdirs, options:
                        calls.append((options.shrink, options.steps_per_dispatch,
                                      options.pack_axis))
                        or [("finished", 0.0, "ok")] * len(workdirs))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR2)}
    try:
        for pack, more, expected in (("auto", [], (True, 1, "auto")),
                                     ("2", ["--steps_per_dispatch=5", "--pack_axis=map"],
                                      (False, 5, "map"))):
            with command_module("sweep") as module:
                flags.FLAGS(["cfsl-sweep", f"--workdir={tmp_path}", "--seeds=0,1",
                             f"--pack={pack}", *more])
                job = module.slurm_job({})
            assert isinstance(job, slurm.PackJob)
            assert job([{}, {}], ["a", "b"]) == "2 runs finished"
            assert calls.pop() == expected
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)


def test_a_failed_pack_says_so_and_its_runs_go_on_alone(monkeypatch, capsys):
    """A pack whose program fails (here: a fault raised by its training) prints one line naming
    the pack and the error, then each run is executed alone, where it reports its own error."""
    given = []

    def broken(*args, **kwargs):
        given.append((args[3], kwargs["pack_axis"]))
        raise RuntimeError("XLA ran out of something\nRESOURCE_EXHAUSTED: 3 GiB more")
    monkeypatch.setattr(packing, "meta_train_pack", broken)
    alone = []
    monkeypatch.setattr(sweep, "execute", lambda config, workdir, tested=None:
                        alone.append(workdir) or ("finished", 1.0, "test acc 0.5000"))
    outcomes = sweep.execute_pack([{"seed": 0}, {"seed": 1}], ["w/seed0", "w/seed1"],
                                  packing.PackOptions(steps_per_dispatch=4, pack_axis="vmap"))
    assert given == [(4, "vmap")]  # the sweep's --steps_per_dispatch and --pack_axis
    out = capsys.readouterr().out
    assert ("[sweep] the pack of 2 (w/seed0, w/seed1) failed: RuntimeError: RESOURCE_EXHAUSTED: "
            "3 GiB more; its runs go on one at a time") in out, out
    assert alone == ["w/seed0", "w/seed1"]
    assert [state for state, _, _ in outcomes] == ["finished", "finished"]


def test_a_map_packed_maml_run_trains_bit_for_bit_as_it_trains_alone():
    """``pack_axis="map"`` (``--pack`` on CPU: ``auto``): each run of a MAML++ pack computes the
    step it computes alone, one run after another in one program; on CPU its losses and params
    equal the solo one-step loop's bit for bit (elsewhere: within float32 rounding)."""
    # 2 inner steps (5 by default): the same property, 46 s instead of 79 s (mostly compiling).
    config = TrainConfig(learner="maml_low", learner_options={"filters": 8, "inner_steps": 2},
                         dataset="synthetic",
                         dataset_options={"num_classes": 60, "samples_per_class": 8}, task="B2",
                         spec_overrides={"nc": 3, "kt": 2}, meta_batch=2)
    learner, splits = runs.build(config)
    split, optimizer = splits["train"], train.make_optimizer(config)
    seeds, count = (0, 1), 2
    params = [runs.init_params(learner, split, seed) for seed in seeds]
    keys = [seeding.purpose_key(seed, "train") for seed in seeds]
    at = [np.float32(s / 4) for s in range(count)]

    step, alone = train.make_train_step(learner, optimizer, config.meta_batch), []
    for p, key in zip(params, keys):
        opt_state, losses = optimizer.init(p), []
        for s in range(count):
            p, opt_state, out = step(p, opt_state, split, jax.random.fold_in(key, s), at[s])
            losses.append(out["loss"])
        alone.append((p, np.asarray(losses)))

    packed = steps.make_steps(learner, optimizer, config.meta_batch, count, runs=True,
                              pack_axis="map")
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *params)
    stacked, _, out = packed(stacked, jax.vmap(optimizer.init)(stacked), split, jnp.stack(keys),
                             0, jnp.asarray(at))
    check = (np.testing.assert_array_equal if jax.default_backend() == "cpu" else
             lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6))
    for k, (p, losses) in enumerate(alone):
        check(np.asarray(out["loss"][k]), losses)
        for mine, theirs in zip(jax.tree.leaves(stacked), jax.tree.leaves(p)):
            check(np.asarray(mine[k]), np.asarray(theirs))
    assert not np.allclose(out["loss"][0], out["loss"][1])  # each seed its own tasks
    with pytest.raises(ValueError, match="pack_axis must be one of"):
        steps.resolve_pack_axis("pmap")


def test_a_pack_trains_first_order_in_the_first_order_epochs_as_each_run_alone(tmp_path):
    """MAML++ with ``first_order_epochs=1``: a pack's first step is the first-order step each
    run takes alone (``learner.at_epoch``, one program per variant), not the second-order one
    of later epochs: its checkpointed params are the solo run's."""
    from cfsl_jax.training import checkpoints, loop
    config = TrainConfig(
        learner="maml_low", learner_options={"filters": 4, "num_blocks": 2, "inner_steps": 1,
                                             "first_order_epochs": 1},
        dataset="synthetic", dataset_options={"num_classes": 60, "samples_per_class": 8},
        task="B2", spec_overrides={"nc": 3, "kt": 2}, epochs=2, iters_per_epoch=2,
        meta_batch=2, val_tasks=4, test_tasks=4, eval_batch=4, log_every=1,
        checkpoint_every=1)
    dirs = [str(tmp_path / f"seed{s}") for s in (0, 1)]
    with pytest.raises(loop.Interrupted):
        packing.meta_train_pack(config, (0, 1), dirs, stop_after_steps=1, pack_axis="map")
    with pytest.raises(loop.Interrupted):
        train.train_and_evaluate(config, str(tmp_path / "solo"), stop_after_steps=1)
    learner, splits = runs.build(config)
    assert learner.at_epoch(0) is not learner  # the first epoch's learner is another one
    init = runs.init_params(learner, splits["train"], 0)
    state = train.make_optimizer(config).init(init)

    def latest(workdir):
        ckpt = checkpoints.Checkpoints(workdir, config.keep_best)
        try:
            return ckpt.restore_latest(init, state)
        finally:
            ckpt.close()

    (packed_at, packed, _), (solo_at, solo, _) = latest(dirs[0]), latest(str(tmp_path / "solo"))
    assert packed_at == solo_at == 1

    def distance(a, b):
        return float(jnp.sqrt(sum(jnp.sum(jnp.square(x - y)) for x, y in
                                  zip(jax.tree.leaves(a), jax.tree.leaves(b)))))

    # the solo step to float rounding (measured 1e-9 per weight; a second-order step instead
    # lands 75 % of the step's length away)
    assert distance(packed, solo) < 1e-3 * distance(solo, init)


def test_pack_flags_without_a_pack_or_that_do_not_divide_are_refused(tmp_path):
    """--steps_per_dispatch and --pack_axis say how a pack trains: one line and status 2 where
    there is no pack, or where S does not divide the intervals; nothing is created."""
    from test_cli import assert_error, run_cases
    train = ["--dataset=synthetic", "--task=B2", "--epochs=1", "--iters_per_epoch=10"]
    one, axis, odd = run_cases("train", [
        [f"--workdir={tmp_path / 'a'}", *train, "--seeds=0", "--steps_per_dispatch=5"],
        [f"--workdir={tmp_path / 'b'}", *train, "--pack_axis=map"],
        [f"--workdir={tmp_path / 'c'}", *train, "--seeds=0,1", "--steps_per_dispatch=7"]])
    assert_error(one, "--steps_per_dispatch=5: applies to a pack (--seeds or --learning_rates "
                      "with two or more runs)")
    assert_error(axis, "--pack_axis=map: applies to a pack")
    assert_error(odd, "--steps_per_dispatch=7 must divide --iters_per_epoch, --log_every and "
                      "--checkpoint_every (now 10, 50, 0")
    alone, = run_cases("sweep", [[f"--workdir={tmp_path / 's'}", "--dataset=synthetic",
                                  "--cells=B2", "--learners=protonets", "--dry_run",
                                  "--steps_per_dispatch=2"]])
    assert_error(alone, "--steps_per_dispatch=2: applies to packs (--pack=N with N >= 2")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("runs", [["--seeds=0,1"], ["--learning_rates=0.001,0.002"]])
def test_a_pack_too_large_for_the_device_is_refused_and_leaves_nothing(tmp_path, monkeypatch,
                                                                      runs):
    """``launch.train --seeds`` (or ``--learning_rates``: W/lrR/seed0) whose pack does not fit:
    one line naming --pack and the largest pack that fits, status 2, and no workdir or folder
    left behind (as a solo run refused)."""
    from cfsl_jax.runtime import memory
    from launch_inprocess import run_in_process
    monkeypatch.setattr(memory, "needed_bytes", lambda compiled, with_arguments=True:
                        2 * memory.GIB)  # XLA's estimate of the pack of 2: 1 GiB a run
    monkeypatch.setattr(memory, "device_limit", lambda device: (int(1.5 * memory.GIB), True))
    with command_module("train") as module:
        code, _, err = run_in_process(module, "train", [
            f"--workdir={tmp_path / 'w'}", *runs, "--dataset=synthetic", "--task=B2",
            "--learner=protonets", "--learner_option=filters=8", "--epochs=1",
            "--iters_per_epoch=2", "--val_tasks=2", "--test_tasks=2", "--eval_batch=2"])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: a pack of 2 protonets runs needs 2.0 GiB") and (
        "--pack=2 is too many: at most --pack=1 fits" in err), err
    assert os.listdir(tmp_path) == []  # neither run's folder nor W
