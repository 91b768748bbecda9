"""SCA (Self-Critique and Adapt, Antoniou & Storkey 2019) on top of MAML++ high-end.

    learner = sca(spec)          # maml_high options + critic_hidden

``sca`` is ``maml_high`` plus a meta-learned critic. After the support sets
(``adapt``, exactly as ``maml_high``; the ATM is the same), ``predict`` takes
one extra inner step on the unlabelled target set: the critic maps per-sample
features of the head's target predictions -- logits, |logits|, logits^2 and
the softmax (as in the paper's critic's "preds" inputs) -- through an MLP
(``critic_hidden``, 2 swish layers: the critic is learned only through the
gradient it induces, and with piecewise-linear activations that gradient does
not depend on its hidden biases) to a per-sample score whose mean is
the critic loss; the fast weights take an SGD step on it with the LSLR rate
(and per-step BN) of step NSS*S, and the target set is predicted again. The
critic step keeps its second-order path even when the support-set steps are
first-order (``first_order``): the critic is only learned through it.

``meta_loss`` = w_pre * (MAML++ target loss before the critic step, with the
multi-step loss if on) + w_post * (target loss after it), w_pre = (1 -
progress) / 2 and w_post = (1 + progress) / 2 (the paper's importance vector,
annealed over training from (0.5, 0.5) to (0, 1)). The returned logits are
the post-critic ones, as ``predict``'s.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from cfsl_jax import metrics
from cfsl_jax.learners.base import Learner
from cfsl_jax.learners.inner_loop import InnerLoop, InnerState, assemble
from cfsl_jax.learners.maml import maml_high_loop
from cfsl_jax.spec import TaskSpec


class Critic(nn.Module):
    """Target logits [n, O] -> a scalar critic loss (mean of per-sample MLP scores)."""

    hidden: int = 32

    @nn.compact
    def __call__(self, logits: jax.Array) -> jax.Array:
        features = jnp.concatenate(
            [logits, jnp.abs(logits), jnp.square(logits), jax.nn.softmax(logits)], axis=-1)
        h = nn.swish(nn.Dense(self.hidden)(features))
        h = nn.swish(nn.Dense(self.hidden)(h))
        return jnp.mean(nn.Dense(1, use_bias=False)(h))  # a bias would not change the step


def _critic_logits(loop: InnerLoop, critic: Critic, params, state: InnerState,
                   target_features: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(pre-critic, post-critic) target logits from the state after the support sets."""
    step = state.step  # SCA always carries the counter: step NSS*S is the critic step

    def critic_loss(fast):
        return critic.apply({"params": params["critic"]},
                            loop.logits(params, fast, target_features, step))

    pre = loop.logits(params, state.fast, target_features, step)
    fast = loop.sgd_step(params, state.fast, critic_loss, step, False)
    post = loop.logits(params, fast, target_features, step + 1)
    return pre, post


def sca(spec: TaskSpec, image_shape=(28, 28, 1), critic_hidden: int = 32, **options) -> Learner:
    """SCA: ``maml_high`` (same options) + a critic step on the target set inside ``predict``."""
    if isinstance(critic_hidden, bool) or not isinstance(critic_hidden, int) or critic_hidden < 1:
        raise ValueError(f"critic_hidden must be a positive integer, got {critic_hidden!r}")
    loop = maml_high_loop(spec, image_shape, extra_steps=1, **options)
    critic = Critic(critic_hidden)
    base_init_params = loop.init_params

    def init_params(key, example_x, spec):
        base_key, critic_key = jax.random.split(key)
        params = base_init_params(base_key, example_x, spec)
        logits = jnp.zeros((1, spec.num_outputs), jnp.float32)
        params["critic"] = critic.init(critic_key, logits)["params"]
        return params

    loop = loop._replace(init_params=init_params)

    def make_predict(first_order):
        del first_order

        def predict(params, state, target_x):
            return _critic_logits(loop, critic, params, state, loop.featurize(params, target_x))[1]
        return predict

    def make_meta_loss(first_order):
        objective = loop.objective(first_order)

        def meta_loss(params, support_x, support_y, target_x, target_y, key, progress):
            result = objective(params, support_x, support_y, target_x, target_y, key, progress)
            _, post = _critic_logits(loop, critic, params, result.state, result.target_features)
            progress = jnp.clip(jnp.asarray(progress, jnp.float32), 0.0, 1.0)
            loss = (0.5 * (1.0 - progress) * result.loss
                    + 0.5 * (1.0 + progress) * metrics.cross_entropy(post, target_y))
            return loss, post
        return meta_loss

    return assemble("sca", loop, predict=make_predict, meta_loss=make_meta_loss)
