"""AdamW whose per-variable update is TensorFlow's fused Adam kernel.

`keras.optimizers.AdamW` updates a variable with about a dozen separate ops
(decay, two moment updates, the step), each a full pass over the variable and a
temporary of its size, which on lealla_small's 501,153 x 128 token table is a
large share of a training step on a CPU (`benchmarks/training_step.py --profile`,
its optimizer group; what this class gained is the `fused_adamw` lever of the
retired `benchmarks/train_throughput.py --levers`: docs/benchmarks.md, "Settings
chosen by retired benchmarks"). `FusedAdamW`
computes the same update with two ops a dense variable: the decoupled weight
decay, then `ResourceApplyAdam`, whose formula is Keras' Adam's term for term
(alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t); m += (g - m)(1 - beta_1);
v += (g^2 - v)(1 - beta_2); w -= alpha m / (sqrt(v) + eps)).
The one difference is float32 rounding: the kernel forms 1 - beta_2 in float32
(1 - 0.999f = 0.000999987), Keras in double (0.001), so the velocities differ by
about 1.3e-5 relative and the weights by about 1e-6 after a step
(tests/train/test_optimizers.py).
Its variables (iterations, momentums, velocities) are AdamW's, with AdamW's
names, so checkpoints of either restore into the other. The per-variable decay
and Adam slots come from `lealla_tf.models.keras_adapter.AdamWDecayInStep`
(Keras has no public API for them).

A lookup table's sparse gradient (`tf.IndexedSlices`) is applied, on a CPU with
`lealla_tf.models.kernels`, by one op that does the same arithmetic in one pass over the
table (`LeallaSparseApplyAdamW`); without it, the gradient is densified first.
Other backends, AMSGrad and non-float32 variables take AdamW's own update.
"""

import keras
import tensorflow as tf

from lealla_tf.models import kernels
from lealla_tf.models.keras_adapter import AdamWDecayInStep


@keras.saving.register_keras_serializable(package="lealla_tf")
class FusedAdamW(AdamWDecayInStep):
    """`keras.optimizers.AdamW` with TensorFlow's fused Adam kernel (same arguments).

    Sparse gradients (`tf.IndexedSlices`, e.g. of an embedding lookup) are
    accepted: the update stays AdamW's dense one (every row's moments decay),
    so the result equals AdamW's on the densified gradient.
    """

    def decays_in_update_step(self, variable) -> bool:
        """The variables the fused update takes: float32 ones, without AMSGrad,
        on TensorFlow; the others take AdamW's own update, decay included."""
        return (keras.backend.backend() == "tensorflow" and not self.amsgrad
                and keras.backend.standardize_dtype(variable.dtype) == "float32")

    def update_step(self, gradient, variable, learning_rate):
        if not self.decays_in_update_step(variable):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        lr = tf.cast(learning_rate, dtype)
        decays = self.weight_decay_due(variable)
        momentum, velocity = self.adam_slots(variable)
        local_step = tf.cast(self.iterations + 1, dtype)
        beta1_power = tf.pow(tf.cast(self.beta_1, dtype), local_step)
        beta2_power = tf.pow(tf.cast(self.beta_2, dtype), local_step)
        if isinstance(gradient, tf.IndexedSlices) and kernels.usable():
            # A lookup table: decay and Adam in one pass, without densifying.
            return kernels.sparse_apply_adamw(
                variable.handle, momentum.value.handle, velocity.value.handle, gradient, lr,
                beta1_power, beta2_power, self.beta_1, self.beta_2, self.epsilon,
                self.weight_decay if decays else 0.0)
        if decays:
            variable.assign_sub(variable * tf.cast(self.weight_decay, dtype) * lr)
        if isinstance(gradient, tf.IndexedSlices):
            gradient = tf.convert_to_tensor(gradient)
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=momentum.value.handle, v=velocity.value.handle,
            beta1_power=beta1_power, beta2_power=beta2_power,
            lr=lr, beta1=tf.cast(self.beta_1, dtype), beta2=tf.cast(self.beta_2, dtype),
            epsilon=tf.cast(self.epsilon, dtype), grad=tf.cast(gradient, dtype))
