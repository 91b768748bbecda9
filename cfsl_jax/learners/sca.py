"""SCA (Self-Critique and Adapt, Antoniou & Storkey 2019) on top of MAML++ high-end.

    learner = sca(spec)          # maml_high options + critic, critic_hidden

``sca`` is ``maml_high`` plus a meta-learned critic. After the support sets
(``adapt``, exactly as ``maml_high``; the ATM is the same), ``predict`` takes
one extra inner step on the unlabelled target set: the critic maps per-sample
features of the head's target predictions through an MLP to a per-sample
score, and the critic loss is their sum over the target samples; the fast
weights take an SGD step on it with the LSLR rate of step NSS*S, and the
target set is predicted again (per-step BN: the pre-critic forward uses row
NSS*S, the post-critic one row NSS*S + 1). The critic step keeps its
second-order path even when the support-set steps are first-order
(``first_order``): the critic is only learned through it.

``critic="original"`` (default, the authors' ``CriticNetwork`` with
``conditional_information=["preds"]``): features [logits, |logits|,
logits^2, sign(logits)], two hidden linear layers of ``critic_hidden`` (16)
units with LeakyReLU, a linear output, no biases anywhere, summed over the
target samples; drawn by ``embed_init`` ("torch": PyTorch's default).
``critic="smooth"``: the softmax in place of the sign, swish, biased hidden
layers, the mean over samples.

Per-step BN rows: the authors' code forwards the target set at rows NSS*S
(logged only), NSS*S + 1 (the critic's input, and the "pre" loss) and
NSS*S + 2 (post-critic), and steps with rate NSS*S + 1; cfsl_jax drops the
logged-only forward, so its rows NSS*S / NSS*S + 1 and rate NSS*S are the
same parameters under other indices.

``meta_loss`` = w_pre * (MAML++ target loss before the critic step, with the
multi-step loss if on) + w_post * (target loss after it), annealed over
meta-training from (0.5, 0.5) towards (0, 1) (``critic_loss_weights``; the
paper gives no weights: this is the authors' code's ``importance_vector``,
``5b814ac:few_shot_learning_system.py`` L580-585, L731).
``critic_weight_epochs=0`` (default): per meta-step, w_pre = (1 - progress) / 2
and w_post = (1 + progress) / 2. ``critic_weight_epochs=T`` (the authors' with
T = the run's ``--epochs``): fixed within each epoch e of T, w_pre = 0.5 -
0.5 * (e + 1) / T and w_post = 0.5 + 0.5 * (e + 1) / T (so (0, 1) for the
whole last epoch). The returned logits are the post-critic ones, as
``predict``'s.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from cfsl_jax.protocol import metrics
from cfsl_jax.protocol.learner import Learner
from cfsl_jax.learners.assemble import assemble
from cfsl_jax.learners.inner_loop import InnerLoop, InnerState
from cfsl_jax.learners.maml import MamlHighOptions, maml_high_loop
from cfsl_jax.runtime.options import option
from cfsl_jax.models.init import reinitialize
from cfsl_jax.protocol.spec import TaskSpec


CRITICS: tuple[str, ...] = ("original", "smooth")


class Critic(nn.Module):
    """Target logits [n, O] -> a scalar critic loss (see the module doc for the two kinds)."""

    hidden: int = 16
    kind: str = "original"

    @nn.compact
    def __call__(self, logits: jax.Array) -> jax.Array:
        smooth = self.kind == "smooth"
        last = jax.nn.softmax(logits) if smooth else jnp.sign(logits)
        features = jnp.concatenate([logits, jnp.abs(logits), jnp.square(logits), last], axis=-1)
        act = nn.swish if smooth else nn.leaky_relu
        h = act(nn.Dense(self.hidden, use_bias=smooth)(features))
        h = act(nn.Dense(self.hidden, use_bias=smooth)(h))
        scores = nn.Dense(1, use_bias=False)(h)[:, 0]  # an output bias would not change the step
        return jnp.mean(scores) if smooth else jnp.sum(scores)


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


@dataclasses.dataclass(frozen=True)
class ScaOptions(MamlHighOptions):
    """``sca``: the ``maml_high`` options and the critic's."""

    critic: str = option("original", "Critic network: the authors' (original) or a smooth "
                         "variant (module doc).", choices=CRITICS)
    critic_hidden: int = option(16, "Critic hidden units.", minimum=1)
    critic_weight_epochs: int = option(
        0, "Schedule of the pre/post-critic loss weights: 0 anneals them every meta-step "
        "((1 -/+ progress) / 2); T > 0 holds them for each of T epochs at 0.5 -/+ 0.5 * "
        "(epoch + 1) / T, the authors' code when T is the run's --epochs.", minimum=0)


def critic_loss_weights(progress: jax.Array, epochs: int = 0) -> tuple[jax.Array, jax.Array]:
    """(w_pre, w_post) at ``progress`` (step / total steps, in [0, 1]) (module doc).

    ``epochs`` T > 0: the epoch e = floor(progress * T) (a tolerance of 1e-6 * T absorbs the
    float32 rounding of step / total at an epoch's first step; checked exact for every step of
    schedules up to 9 x 10^5 steps, the paper's 125,000 among them; from about 10^6 steps the
    last step of some epochs takes the next epoch's weights, 0.5 / T apart), then 0.5 -/+ 0.5 * (e + 1) / T, as the authors' ``importance_vector``.
    """
    progress = jnp.clip(jnp.asarray(progress, jnp.float32), 0.0, 1.0)
    if epochs:
        epoch = jnp.floor(progress * epochs + 1e-6 * epochs)
        progress = jnp.minimum(epoch + 1.0, epochs) / epochs
    return 0.5 * (1.0 - progress), 0.5 * (1.0 + progress)


def sca(spec: TaskSpec, opts: ScaOptions = ScaOptions(), *, image_shape=(28, 28, 1)) -> Learner:
    """SCA: ``maml_high`` + a critic step on the target set inside ``predict`` (module doc)."""
    loop = maml_high_loop(spec, image_shape, extra_steps=1, opts=opts)
    critic_net = Critic(opts.critic_hidden, opts.critic)
    base_init_params = loop.init_params

    def init_params(key, example_x, spec):
        base_key, critic_key = jax.random.split(key)
        params = base_init_params(base_key, example_x, spec)
        logits = jnp.zeros((1, spec.num_outputs), jnp.float32)
        params["critic"] = reinitialize(critic_net.init(critic_key, logits)["params"],
                                        jax.random.fold_in(critic_key, 1), opts.embed_init)
        return params

    loop = loop._replace(init_params=init_params)

    def make_predict(loop, first_order):
        del first_order

        def predict(params, state, target_x):
            return _critic_logits(loop, critic_net, params, state,
                                  loop.featurize(params, target_x))[1]
        return predict

    def make_meta_loss(first_order):
        objective = loop.objective(first_order)

        def meta_loss(params, support_x, support_y, target_x, target_y, key, progress):
            result = objective(params, support_x, support_y, target_x, target_y, key, progress)
            _, post = _critic_logits(loop, critic_net, params, result.state,
                                     result.target_features)
            w_pre, w_post = critic_loss_weights(progress, opts.critic_weight_epochs)
            loss = w_pre * result.loss + w_post * metrics.cross_entropy(post, target_y)
            return loss, post
        return meta_loss

    return assemble("sca", loop, predict=make_predict, meta_loss=make_meta_loss)
