"""The run lifecycle: the loop driver that meta-training and pretraining share, and a run's
metrics (``loop``, ``tracking``)."""
