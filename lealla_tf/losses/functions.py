"""Training losses, as pure functions of tensors.

Every function returns a PER-EXAMPLE loss `[b]` for the `b` rows a replica
holds; the trainer sums them and divides by the GLOBAL batch size N, so that
summing over replicas gives the paper's batch mean. Contrastive terms take
the candidates of the whole global batch (`all_*`, gathered across replicas)
and the position `offset` of this replica's rows inside it; with one replica
`all_* = *` and `offset = 0`.

Notation (LEALLA, Mao & Nakagawa 2023): x = the non-English side, y = the
English side; s = student, t = teacher; phi = cosine similarity.
"""

import tensorflow as tf


def _float(x):
    """float32 for half-precision inputs (bf16 training); float32/64 kept."""
    x = tf.convert_to_tensor(x)
    return x if x.dtype in (tf.float32, tf.float64) else tf.cast(x, tf.float32)


def _unit(x):
    return tf.math.l2_normalize(_float(x), axis=-1)


def _cosine(a, b):
    """phi(a_i, b_j) for all i, j: `[len(a), len(b)]`."""
    return tf.matmul(_unit(a), _unit(b), transpose_b=True)


def _single_direction_margin_softmax(query, all_candidates, scale, margin, offset):
    similarities = _cosine(query, all_candidates)
    rows = tf.shape(query)[0]
    labels = tf.range(rows) + offset
    positives = tf.one_hot(labels, tf.shape(all_candidates)[0], dtype=similarities.dtype)
    logits = scale * (similarities - margin * positives)
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def additive_margin_softmax_loss(source, target, scale=100.0, margin=0.3, all_source=None,
                                 all_target=None, offset=0):
    """Bidirectional additive margin softmax (AMS), LEALLA eq. 1-2 / LaBSE.

    For pair i, one direction is
        L(x_i, y_i) = -log( e^{s(phi(x_i,y_i) - m)} /
                            (e^{s(phi(x_i,y_i) - m)} + sum_{n != i} e^{s phi(x_i,y_n)}) )
    and the loss of pair i is L(x_i, y_i) + L(y_i, x_i); the batch loss is
    their mean (eq. 1). The margin m separates translations from the other
    N - 1 in-batch candidates; s scales cosines into logits (LaBSE: s=100,
    m=0.3). Negatives are the whole global batch: pass the gathered
    candidates and this replica's offset.

    Args:
        source: `[b, d]` embeddings of the x side (normalised inside).
        target: `[b, d]` embeddings of the y side.
        scale: s. margin: m.
        all_source, all_target: `[N, d]` candidates of the global batch
            (default: `source`, `target`).
        offset: index of this replica's first row in the global batch.

    Returns:
        `[b]`: L(x_i, y_i) + L(y_i, x_i).

    Relations: with margin 0 it is the in-batch softmax (InfoNCE /
    MultipleNegativesRankingLoss) in both directions.
    """
    all_source = source if all_source is None else all_source
    all_target = target if all_target is None else all_target
    forward = _single_direction_margin_softmax(source, all_target, scale, margin, offset)
    backward = _single_direction_margin_softmax(target, all_source, scale, margin, offset)
    return forward + backward


def feature_distillation_loss(teacher_source, teacher_target, projected_source, projected_target):
    """Feature distillation, LEALLA eq. 3.

        L_fd = 1/N sum_i ( ||x_i^t - f(x_i^s)||^2 + ||y_i^t - f(y_i^s)||^2 )

    f is a trainable dense layer d -> teacher dimension applied by the caller
    to the student embeddings (the `projected_*` inputs).

    Args:
        teacher_source, teacher_target: `[b, D]` teacher embeddings x^t, y^t.
        projected_source, projected_target: `[b, D]` f(x^s), f(y^s).

    Returns:
        `[b]` per-pair squared distances.

    Relations: with a monolingual teacher x^t = y^t = T(English) and this is
    the MSE of Reimers & Gurevych 2020 up to their per-dimension averaging
    (`mse_distillation_loss`).
    """
    source = tf.reduce_sum(tf.square(_float(teacher_source) - _float(projected_source)), axis=-1)
    target = tf.reduce_sum(tf.square(_float(teacher_target) - _float(projected_target)), axis=-1)
    return source + target


def logit_distillation_loss(teacher_source, teacher_target, student_source, student_target,
                            temperature=100.0, all_teacher_target=None, all_student_target=None):
    """Logit distillation, LEALLA eq. 4.

        L_ld = 1/N^2 sum_i sum_j ( (phi(x_i^t, y_j^t) - phi(x_i^s, y_j^s)) / T )^2

    The student learns the teacher's similarity matrix over the global batch;
    T = 100 in the paper.

    Args:
        teacher_source, student_source: `[b, .]` this replica's x rows.
        teacher_target, student_target: `[b, .]` y rows (used when the
            `all_*` candidates are not given).
        temperature: T.
        all_teacher_target, all_student_target: `[N, .]` y of the global batch.

    Returns:
        `[b]`: row i's term, 1/N sum_j (...)^2 (its mean over i is L_ld).

    Relations: with the teacher matrix phi(T(en_i), T(en_j)) and T = 1 it is
    the MCL loss of Ding et al. 2022 (`multilingual_contrastive_loss`).
    """
    all_teacher_target = teacher_target if all_teacher_target is None else all_teacher_target
    all_student_target = student_target if all_student_target is None else all_student_target
    difference = (_cosine(teacher_source, all_teacher_target)
                  - _cosine(student_source, all_student_target)) / temperature
    return tf.reduce_mean(tf.square(difference), axis=-1)


def multilingual_contrastive_loss(teacher_english, student_english, student_translation,
                                  all_teacher_english=None, all_student_translation=None):
    """MCL of Ding et al. 2022, eq. 5.

        l_1 = 1/N^2 sum_i sum_j ( phi(h_T^{s_i}, h_T^{s_j}) - phi(h_S^{s_i}, h_S^{t_j}) )^2

    s is the teacher's language (English), t its translation: a student
    pair (English i, translation j) is pushed as far apart as the teacher
    puts English sentences i and j; positives (i = j) are pulled together.

    Returns:
        `[b]`: row i's term, 1/N sum_j (...)^2.
    """
    all_teacher_english = (teacher_english if all_teacher_english is None
                           else all_teacher_english)
    all_student_translation = (student_translation if all_student_translation is None
                               else all_student_translation)
    difference = (_cosine(teacher_english, all_teacher_english)
                  - _cosine(student_english, all_student_translation))
    return tf.reduce_mean(tf.square(difference), axis=-1)


def mse_distillation_loss(teacher_english, student_english, student_translation):
    """Multilingual knowledge distillation MSE (Reimers & Gurevych 2020; Ding eq. 6).

        1/N sum_j [ MSE(M(s_j), M^(s_j)) + MSE(M(s_j), M^(t_j)) ]

    The teacher M embeds the English sentence s_j; the student M^ must map
    both s_j and its translation t_j onto it. MSE averages over dimensions, as
    sentence-transformers' MSELoss does.

    Returns:
        `[b]` per pair.
    """
    teacher = _float(teacher_english)
    return (tf.reduce_mean(tf.square(teacher - _float(student_english)), axis=-1)
            + tf.reduce_mean(tf.square(teacher - _float(student_translation)), axis=-1))


def distillation_first_loss(teacher_source, teacher_target, pooled_source, pooled_target):
    """"Distillation-first" feature distillation (LEALLA Appendix C, L_df).

    The student's [CLS] pooler is teacher-sized (e.g. 768); the squared
    distance to the teacher is taken there, and a dense layer down to d
    produces the embedding used by AMS. Same form as eq. 3, on the pooled
    outputs instead of f(embedding).

    Returns:
        `[b]` per pair.
    """
    return feature_distillation_loss(teacher_source, teacher_target, pooled_source,
                                     pooled_target)


def synchronized_distillation_loss(reduced_teacher_source, reduced_teacher_target,
                                   student_source, student_target):
    """"Synchronized" feature distillation (LEALLA Appendix C, L_syn).

    The teacher embeddings are reduced to d by the fixed dense layer of the
    dimension-reduction experiment (Section 3.2), and the squared distance is
    taken in d dimensions between unit vectors.

    Returns:
        `[b]` per pair.
    """
    return feature_distillation_loss(_unit(reduced_teacher_source), _unit(reduced_teacher_target),
                                     _unit(student_source), _unit(student_target))


def token_distribution(input_word_ids, input_mask, vocabulary_size, exclude_ids=()):
    """p_S of EMS eq. 7: each sentence's tokens as a distribution over the vocabulary.

    p_S(w) = N_w / |S| for the tokens w of S (special tokens in `exclude_ids`,
    such as [CLS] and [SEP], and padding left out); `[b, vocabulary_size]`.
    """
    ids = tf.cast(input_word_ids, tf.int32)
    weight = tf.cast(input_mask, tf.float32)
    for excluded in exclude_ids:
        weight *= tf.cast(tf.not_equal(ids, excluded), tf.float32)
    weight /= tf.maximum(tf.reduce_sum(weight, axis=1, keepdims=True), 1.0)
    rows = tf.broadcast_to(tf.range(tf.shape(ids)[0])[:, None], tf.shape(ids))
    indices = tf.stack([tf.reshape(rows, [-1]), tf.reshape(ids, [-1])], axis=1)
    return tf.scatter_nd(indices, tf.reshape(weight, [-1]),
                         tf.stack([tf.shape(ids)[0], vocabulary_size]))


def cross_lingual_reconstruction_loss(source_logits, target_logits, source_tokens,
                                      target_tokens):
    """Cross-lingual token-level reconstruction (XTR), EMS (Mao & Nakagawa 2023) eq. 6.

        L_XTR = sum_S ( D_KL(p_{S_l'} || q_{S_l}) + D_KL(p_{S_l} || q_{S_l'}) )

    q_{S_l} = softmax(logits) is what an MLP head predicts from the sentence
    embedding of S_l and the TARGET language's embedding (EMS eq. 4-5): the
    bag of tokens of its translation S_l'. p_S is the uniform distribution over
    S's tokens (`token_distribution`). Only the token distribution of the
    translation is predicted, so no decoder is needed.

    Args:
        source_logits: `[b, V]` predicted from x (target language: y's).
        target_logits: `[b, V]` predicted from y (target language: x's).
        source_tokens, target_tokens: `[b, V]` p_x, p_y.

    Returns:
        `[b]` per pair: KL(p_y || q_x) + KL(p_x || q_y).

    Relations: minus the constant entropy of p, it is the cross-entropy of the
    translation's tokens under the prediction (a bag-of-words decoder).
    """
    def kl(p, logits):
        log_q = tf.nn.log_softmax(_float(logits), axis=-1)
        p = tf.cast(p, log_q.dtype)
        log_p = tf.math.log(tf.where(p > 0, p, tf.ones_like(p)))
        return tf.reduce_sum(p * (log_p - log_q), axis=-1)

    return kl(target_tokens, source_logits) + kl(source_tokens, target_logits)


def hidden_state_distillation_loss(student_states, teacher_states, input_mask):
    """Layer-wise hidden-state distillation on the tokens both models read.

        L_hd(S) = 1/K sum_k  1/|S| sum_{i in S}  1/d ||h_{l_k}^s(i) - P h_{m_k}^t(i)||^2

    for K pairs (student layer l_k, teacher layer m_k); h(i) is token i's
    output of that layer, P keeps the teacher's coordinates the student's
    width corresponds to, and |S| counts the sentence's real tokens (padding
    left out). Student and teacher read the same token ids (the student's
    pruned teacher vocabulary), so token i is the same piece in both.
    TinyBERT (Jiao et al. 2020) distils hidden states through a learned
    projection; with a student selected from the teacher's weights
    (`--embedding_init=teacher_select`) the coordinates already correspond,
    and P is that selection.

    Args:
        student_states: list of K `[b, s, d]` student layer outputs.
        teacher_states: list of K `[b, s, d]` teacher outputs, already at the
            kept coordinates (no gradient flows into them).
        input_mask: `[b, s]` 1 for real tokens.

    Returns:
        `[b]` per-sentence loss.
    """
    if len(student_states) != len(teacher_states) or not student_states:
        raise ValueError(f"hidden-state distillation needs as many student layers as teacher "
                         f"layers (at least one), got {len(student_states)} and "
                         f"{len(teacher_states)}")
    total = 0.0
    for student, teacher in zip(student_states, teacher_states):
        student = _float(student)
        squared = tf.reduce_mean(tf.square(
            student - tf.stop_gradient(tf.cast(teacher, student.dtype))), axis=-1)
        mask = tf.cast(input_mask, squared.dtype)
        total += tf.reduce_sum(squared * mask, axis=1) / tf.maximum(
            tf.reduce_sum(mask, axis=1), 1.0)
    return total / len(student_states)
