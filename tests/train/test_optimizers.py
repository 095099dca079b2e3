"""FusedAdamW: Keras' AdamW, computed with TensorFlow's fused Adam kernel."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from lealla_tf.train.optimizers import FusedAdamW
from lealla_tf.train.schedules import WarmupLinearDecay
from lealla_tf.train.task import scale_gradient, unique_rows

IDS = tf.constant([[1, 3, 3, 7], [7, 2, 1, 1]])


def train(optimizer_class, sparse, steps=4):
    rng = np.random.default_rng(0)
    table = keras.Variable(rng.normal(size=(50, 8)).astype("float32"), name="embeddings")
    kernel = keras.Variable(rng.normal(size=(8, 4)).astype("float32"), name="kernel")
    bias = keras.Variable(np.zeros(4, "float32"), name="bias")
    variables = [table, kernel, bias]
    optimizer = optimizer_class(learning_rate=WarmupLinearDecay(1e-2, 2, 10, 0.0),
                                weight_decay=0.1, epsilon=1e-6)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    optimizer.build(variables)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            x = tf.gather(table.value, IDS)
            loss = tf.reduce_sum(tf.tanh(tf.einsum("btd,dk->btk", x, kernel.value)
                                         + bias.value) ** 2)
        gradients = tape.gradient(loss, [v.value for v in variables])
        gradients = [(unique_rows(g) if sparse else tf.convert_to_tensor(g))
                     if isinstance(g, tf.IndexedSlices) else g for g in gradients]
        optimizer.apply_gradients(zip(gradients, variables))

    for _ in range(steps):
        step()
    return optimizer, variables


@pytest.mark.parametrize("sparse", [False, True])
def test_fused_adamw_equals_keras_adamw(sparse):
    reference, reference_variables = train(keras.optimizers.AdamW, sparse=False, steps=2)
    fused, fused_variables = train(FusedAdamW, sparse=sparse, steps=2)
    def names(optimizer):  # the optimizer's own name differs, its variables' do not
        return [v.path.split("/", 1)[1] for v in optimizer.variables]

    assert names(fused) == names(reference)
    for ours, theirs in zip(fused_variables + fused.variables,
                            reference_variables + reference.variables):
        # The kernel forms 1 - beta_2 in float32 (1 - 0.999f = 0.000999987), Keras in
        # double (0.001): velocities differ by ~1.3e-5 relative, weights by ~1e-6.
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-4, atol=1e-7,
                                   err_msg=theirs.path)
    assert int(fused.iterations.numpy()) == 2


def test_checkpoints_of_either_optimizer_restore_into_the_other(tmp_path):
    reference, variables = train(keras.optimizers.AdamW, sparse=False, steps=2)
    path = tf.train.Checkpoint(optimizer=reference).save(str(tmp_path / "ckpt"))
    fused, _ = train(FusedAdamW, sparse=True, steps=1)
    tf.train.Checkpoint(optimizer=fused).restore(path).assert_existing_objects_matched()
    for ours, theirs in zip(fused.variables, reference.variables):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    # and the other way round
    path = tf.train.Checkpoint(optimizer=fused).save(str(tmp_path / "fused"))
    back, _ = train(keras.optimizers.AdamW, sparse=False, steps=1)
    tf.train.Checkpoint(optimizer=back).restore(path).assert_existing_objects_matched()
    for ours, theirs in zip(back.variables, fused.variables):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_unique_rows_sums_duplicates_and_keeps_the_norm():
    slices = tf.IndexedSlices(tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]),
                              tf.constant([4, 1, 4]), tf.constant([6, 2]))
    unique = unique_rows(slices)
    assert sorted(unique.indices.numpy().tolist()) == [1, 4]
    np.testing.assert_allclose(tf.convert_to_tensor(unique), tf.convert_to_tensor(slices))
    np.testing.assert_allclose(tf.linalg.global_norm([unique]),
                               tf.norm(tf.convert_to_tensor(slices)), rtol=1e-6)
    half = scale_gradient(unique, 0.5)
    np.testing.assert_allclose(tf.convert_to_tensor(half), 0.5 * tf.convert_to_tensor(slices))
    np.testing.assert_allclose(scale_gradient(tf.ones([2]), 3.0), [3.0, 3.0])
