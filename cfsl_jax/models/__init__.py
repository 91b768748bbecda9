"""flax.linen backbones."""
