"""cfsl_jax: continual few-shot learning benchmarks in JAX/Flax."""

__version__ = "0.1.0"
