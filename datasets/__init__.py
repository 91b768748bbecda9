"""Dataset builders (TFDS, array_record) and the embedded synthetic set; installed as `cfsl_jax.datasets`."""
