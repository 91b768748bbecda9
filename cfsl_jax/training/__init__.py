"""A run's lifecycle, from its config to its results.

- ``config``: ``TrainConfig`` (every field and its default, the legacy defaults of old
  ``config.json`` files); ``budgets``: named schedules.
- ``runs``: the learner and splits a config builds, its workdir, restoring and re-testing a
  finished run.
- ``loop``: the epoch loop that meta-training and task pretraining share (resume, step, loss
  checked finite before any checkpoint, validation, keep-best, history, stop signals), and
  the plain step loop of uniform and FLUID pretraining.
- ``train``: meta-training and ``train_and_evaluate``; ``pretrain``: supervised pretraining.
- ``checkpoints``: a workdir's orbax checkpoints; ``tracking``: its metrics (JSON lines,
  TensorBoard, W&B).

Stop signals themselves are ``cfsl_jax.runtime.stops`` (a runtime utility).
"""
