"""Every loss against a direct numpy transcription of its paper's equation.

Values are compared in float64; gradients of the TensorFlow functions are
compared with central finite differences of the numpy transcriptions.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from lealla_tf.losses import functions as losses

RNG = np.random.default_rng(0)
N, D, T_DIM = 5, 4, 6


def cos(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# --- direct transcriptions (loops, as written in the papers) ---

def ams_numpy(x, y, s, m):
    """LEALLA eq. 1-2 with LaBSE's scale s: 1/N sum_i L(x_i, y_i) + L(y_i, x_i)."""
    def one_way(a, b, i):
        positive = math.exp(s * (cos(a[i], b[i]) - m))
        negatives = sum(math.exp(s * cos(a[i], b[n])) for n in range(len(b)) if n != i)
        return -math.log(positive / (positive + negatives))
    return sum(one_way(x, y, i) + one_way(y, x, i) for i in range(len(x))) / len(x)


def fd_numpy(xt, yt, fxs, fys):
    """LEALLA eq. 3: 1/N sum_i ||x_i^t - f(x_i^s)||^2 + ||y_i^t - f(y_i^s)||^2."""
    return sum(np.sum((xt[i] - fxs[i]) ** 2) + np.sum((yt[i] - fys[i]) ** 2)
               for i in range(len(xt))) / len(xt)


def ld_numpy(xt, yt, xs, ys, temperature):
    """LEALLA eq. 4: 1/N^2 sum_i sum_j ((phi(x_i^t, y_j^t) - phi(x_i^s, y_j^s)) / T)^2."""
    n = len(xt)
    return sum(((cos(xt[i], yt[j]) - cos(xs[i], ys[j])) / temperature) ** 2
               for i in range(n) for j in range(n)) / n ** 2


def mcl_numpy(t_en, s_en, s_tr):
    """Ding et al. 2022 eq. 5: 1/N^2 sum_ij (phi(T(s_i), T(s_j)) - phi(S(s_i), S(t_j)))^2."""
    n = len(t_en)
    return sum((cos(t_en[i], t_en[j]) - cos(s_en[i], s_tr[j])) ** 2
               for i in range(n) for j in range(n)) / n ** 2


def mse_numpy(t_en, s_en, s_tr):
    """Reimers & Gurevych 2020: 1/N sum_j MSE(M(s_j), M^(s_j)) + MSE(M(s_j), M^(t_j))."""
    return sum(np.mean((t_en[j] - s_en[j]) ** 2) + np.mean((t_en[j] - s_tr[j]) ** 2)
               for j in range(len(t_en))) / len(t_en)


def syn_numpy(rxt, ryt, xs, ys):
    unit = lambda v: v / np.linalg.norm(v)  # noqa: E731
    return sum(np.sum((unit(rxt[i]) - unit(xs[i])) ** 2) + np.sum((unit(ryt[i]) - unit(ys[i])) ** 2)
               for i in range(len(xs))) / len(xs)


def batch_mean(per_example):
    return float(tf.reduce_mean(per_example))


def numeric_gradient(fn, arrays, index, eps=1e-6):
    grad = np.zeros_like(arrays[index])
    for position in np.ndindex(arrays[index].shape):
        plus = [a.copy() for a in arrays]
        minus = [a.copy() for a in arrays]
        plus[index][position] += eps
        minus[index][position] -= eps
        grad[position] = (fn(*plus) - fn(*minus)) / (2 * eps)
    return grad


def tf_gradient(fn, arrays):
    variables = [tf.Variable(a) for a in arrays]
    with tf.GradientTape() as tape:
        value = tf.reduce_mean(fn(*variables))
    return [g.numpy() for g in tape.gradient(value, variables)]


CASES = {
    "ams": (lambda x, y: losses.additive_margin_softmax_loss(x, y, 10.0, 0.3),
            lambda x, y: ams_numpy(x, y, 10.0, 0.3), [(N, D), (N, D)]),
    "ams_labse_scale": (lambda x, y: losses.additive_margin_softmax_loss(x, y, 100.0, 0.3),
                        lambda x, y: ams_numpy(x, y, 100.0, 0.3), [(N, D), (N, D)]),
    "fd": (losses.feature_distillation_loss, fd_numpy, [(N, T_DIM)] * 4),
    "ld": (lambda a, b, c, d: losses.logit_distillation_loss(a, b, c, d, 100.0),
           lambda a, b, c, d: ld_numpy(a, b, c, d, 100.0),
           [(N, T_DIM), (N, T_DIM), (N, D), (N, D)]),
    "ld_t1": (lambda a, b, c, d: losses.logit_distillation_loss(a, b, c, d, 1.0),
              lambda a, b, c, d: ld_numpy(a, b, c, d, 1.0),
              [(N, T_DIM), (N, T_DIM), (N, D), (N, D)]),
    "mcl": (losses.multilingual_contrastive_loss, mcl_numpy, [(N, T_DIM), (N, D), (N, D)]),
    "mse": (losses.mse_distillation_loss, mse_numpy, [(N, T_DIM)] * 3),
    "df": (losses.distillation_first_loss, fd_numpy, [(N, T_DIM)] * 4),
    "syn": (losses.synchronized_distillation_loss, syn_numpy, [(N, D)] * 4),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_value_matches_numpy_transcription(name):
    tf_fn, np_fn, shapes = CASES[name]
    arrays = [RNG.normal(size=s) for s in shapes]
    np.testing.assert_allclose(batch_mean(tf_fn(*arrays)), np_fn(*arrays), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_finite_differences(name):
    tf_fn, np_fn, shapes = CASES[name]
    arrays = [RNG.normal(size=s) for s in shapes]
    analytic = tf_gradient(tf_fn, arrays)
    for index in range(len(arrays)):
        numeric = numeric_gradient(np_fn, arrays, index)
        np.testing.assert_allclose(analytic[index], numeric, rtol=1e-4, atol=1e-7,
                                   err_msg=f"{name}: gradient of input {index}")


def test_margin_makes_the_loss_larger_and_scale_sharper():
    x, y = RNG.normal(size=(N, D)), RNG.normal(size=(N, D))
    assert batch_mean(losses.additive_margin_softmax_loss(x, y, 10.0, 0.3)) > batch_mean(
        losses.additive_margin_softmax_loss(x, y, 10.0, 0.0))
    aligned = x + 1e-3 * RNG.normal(size=(N, D))
    assert batch_mean(losses.additive_margin_softmax_loss(x, aligned, 100.0, 0.0)) < 1e-6


def test_gathered_candidates_and_offset_give_the_rows_of_the_full_loss():
    x, y = RNG.normal(size=(8, D)), RNG.normal(size=(8, D))
    t = RNG.normal(size=(8, T_DIM))
    full_ams = losses.additive_margin_softmax_loss(x, y).numpy()
    full_ld = losses.logit_distillation_loss(t, t, x, y).numpy()
    full_mcl = losses.multilingual_contrastive_loss(t, y, x).numpy()
    for replica in range(2):
        rows = slice(4 * replica, 4 * replica + 4)
        np.testing.assert_allclose(losses.additive_margin_softmax_loss(
            x[rows], y[rows], all_source=x, all_target=y, offset=4 * replica), full_ams[rows])
        np.testing.assert_allclose(losses.logit_distillation_loss(
            t[rows], t[rows], x[rows], y[rows], all_teacher_target=t, all_student_target=y),
            full_ld[rows])
        np.testing.assert_allclose(losses.multilingual_contrastive_loss(
            t[rows], y[rows], x[rows], all_teacher_english=t, all_student_translation=x),
            full_mcl[rows])


def test_bfloat16_inputs_are_computed_in_float32():
    x = tf.cast(RNG.normal(size=(N, D)), tf.bfloat16)
    value = losses.additive_margin_softmax_loss(x, x)
    assert value.dtype == tf.float32 and np.isfinite(value.numpy()).all()


def test_ld_with_monolingual_teacher_is_mcl_up_to_transposition():
    # PAPER.md: with an English-only teacher the logit target is phi(T(en_i), T(en_j)).
    t, x, y = RNG.normal(size=(N, T_DIM)), RNG.normal(size=(N, D)), RNG.normal(size=(N, D))
    ld = batch_mean(losses.logit_distillation_loss(t, t, y, x, temperature=1.0))
    mcl = batch_mean(losses.multilingual_contrastive_loss(t, y, x))
    np.testing.assert_allclose(ld, mcl, rtol=1e-9)


# --- EMS: cross-lingual token-level reconstruction ---

def xtr_numpy(source_ids, target_ids, source_logits, target_logits):
    """EMS eq. 6-7 with loops: sum over pairs of KL(p_y || q_x) + KL(p_x || q_y),
    p_S(w) = N_w / |S|, q = softmax(logits); here averaged over the batch."""
    def distribution(ids, size):
        p = np.zeros(size)
        for token in ids:
            p[token] += 1.0 / len(ids)
        return p

    def kl(p, logits):
        q = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        return sum(p[w] * math.log(p[w] / q[w]) for w in range(len(p)) if p[w] > 0)

    total = 0.0
    for xs, ys, lx, ly in zip(source_ids, target_ids, source_logits, target_logits):
        size = len(lx)
        total += kl(distribution(ys, size), lx) + kl(distribution(xs, size), ly)
    return total / len(source_ids)


def test_cross_lingual_reconstruction_matches_ems():
    vocabulary, cls, sep, pad = 12, 0, 1, 2
    source_tokens = [[4, 5, 5], [7, 8, 9, 10]]
    target_tokens = [[6, 11], [3, 4, 4, 4, 9]]

    def pack(rows):
        width = max(len(r) for r in rows) + 2
        ids = np.full((len(rows), width), pad)
        mask = np.zeros((len(rows), width), np.int32)
        for i, row in enumerate(rows):
            ids[i, :len(row) + 2] = [cls] + row + [sep]
            mask[i, :len(row) + 2] = 1
        return tf.constant(ids, tf.int32), tf.constant(mask)

    source_logits = RNG.normal(size=(2, vocabulary))
    target_logits = RNG.normal(size=(2, vocabulary))
    p_x = losses.token_distribution(*pack(source_tokens), vocabulary, (cls, sep, pad))
    p_y = losses.token_distribution(*pack(target_tokens), vocabulary, (cls, sep, pad))
    np.testing.assert_allclose(tf.reduce_sum(p_x, 1).numpy(), [1.0, 1.0], rtol=1e-6)
    assert float(p_y[1, 4]) == pytest.approx(0.6)
    value = tf.reduce_mean(losses.cross_lingual_reconstruction_loss(
        tf.constant(source_logits), tf.constant(target_logits), p_x, p_y))
    assert float(value) == pytest.approx(xtr_numpy(source_tokens, target_tokens, source_logits,
                                                   target_logits), rel=1e-5)
    # A prediction equal to the translation's distribution costs nothing.
    exact = tf.math.log(tf.maximum(p_y, 1e-30))
    assert float(tf.reduce_mean(losses.cross_lingual_reconstruction_loss(
        exact, tf.math.log(tf.maximum(p_x, 1e-30)), p_x, p_y))) == pytest.approx(0.0, abs=1e-4)


def hd_numpy(student, teacher, mask):
    """1/K sum_k 1/|S| sum_{i in S} 1/d ||h_k^s(i) - h_k^t(i)||^2, one value per sentence."""
    values = []
    for b in range(mask.shape[0]):
        tokens = [i for i in range(mask.shape[1]) if mask[b, i]]
        values.append(sum(sum(np.mean((s[b, i] - t[b, i]) ** 2) for i in tokens) / len(tokens)
                          for s, t in zip(student, teacher)) / len(student))
    return np.array(values)


def test_hidden_state_distillation_matches_its_transcription_and_skips_padding():
    student = [RNG.normal(size=(3, 5, D)) for _ in range(2)]
    teacher = [RNG.normal(size=(3, 5, D)) for _ in range(2)]
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    np.testing.assert_allclose(losses.hidden_state_distillation_loss(student, teacher, mask),
                               hd_numpy(student, teacher, mask), rtol=1e-9)
    # Padding positions do not count, whatever they hold.
    noisy = [s.copy() for s in student]
    noisy[0][1, 3] += 100.0
    np.testing.assert_allclose(losses.hidden_state_distillation_loss(noisy, teacher, mask),
                               hd_numpy(student, teacher, mask), rtol=1e-9)
    # The gradient reaches the student only, and matches finite differences.
    variables = [tf.Variable(s) for s in student]
    targets = [tf.Variable(t) for t in teacher]
    with tf.GradientTape() as tape:
        value = tf.reduce_mean(losses.hidden_state_distillation_loss(variables, targets, mask))
    gradients = tape.gradient(value, variables + targets)
    assert gradients[2] is None and gradients[3] is None
    numeric = numeric_gradient(lambda a, b: float(np.mean(hd_numpy([a, b], teacher, mask))),
                               student, 0)
    np.testing.assert_allclose(gradients[0].numpy(), numeric, rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="as many student layers"):
        losses.hidden_state_distillation_loss(student, teacher[:1], mask)
