"""The best-epoch checkpoints: which epochs are written and kept."""

import threading
import time

import numpy as np

from cfsl_jax.training import checkpoints


def test_an_epoch_below_every_kept_one_is_not_written_and_the_kept_set_is_orbaxs(
        tmp_path, monkeypatch):
    written = []
    save = checkpoints._save
    monkeypatch.setattr(checkpoints, "_save", lambda manager, step, tree, **options: (
        written.append(step), save(manager, step, tree, **options)))
    params = {"w": np.arange(3, dtype=np.float32)}
    accs = [0.5, 0.7, 0.4, 0.6, 0.5, 0.8, 0.7]
    ckpt = checkpoints.Checkpoints(str(tmp_path), keep_best=2)
    try:
        for epoch, acc in enumerate(accs):
            ckpt.save_best(epoch, params, acc)
    finally:
        ckpt.close()
    # epochs 2 (0.4 < 0.5, 0.7) and 4 (0.5 < 0.6, 0.7) are below both kept ones: not written;
    # epoch 6 (0.7) ties the worse kept one (epoch 1): written, and orbax keeps one of them
    assert written == [0, 1, 3, 5, 6]
    reopened = checkpoints.Checkpoints(str(tmp_path), keep_best=2)
    try:
        kept = reopened.best.all_steps()
        assert 5 in kept and len(kept) == 2 and set(kept) <= {1, 5, 6}
        assert sorted(reopened.best.metrics(e)["val_acc"] for e in kept) == [0.7, 0.8]
    finally:
        reopened.close()


def test_a_failed_writes_temporary_folder_is_removed_after_its_last_straggling_write(tmp_path):
    """After a full disk, tensorstore's threads finish writes already begun, creating the
    folders they write into: the temporary folder is removed once they are done, not before."""
    folder = tmp_path / "10.orbax-checkpoint-tmp"
    writes = []

    def straggler():  # a write every 0.1 s for 1 s, each creating its folder again
        for i in range(10):
            (folder / "d").mkdir(parents=True, exist_ok=True)
            (folder / "d" / f"{i}").write_bytes(b"x" * i)
            writes.append(time.monotonic())
            time.sleep(0.1)

    writer = threading.Thread(target=straggler)
    writer.start()
    time.sleep(0.05)
    try:
        checkpoints._remove_when_still(str(folder), still=0.3)
        removed = time.monotonic()
    finally:
        writer.join()
    assert not folder.exists() and removed > writes[-1]
