"""Inverted dropout whose mask is a counter hash, compiled with XLA.

Keras' dropout draws a float per entry with TensorFlow's Philox kernel, then
compares and selects in separate ops, which on a student's training step (three
dropouts a layer, every layer, both sides of a pair) is a sizeable share of the step
on a CPU (the `hash_dropout` lever of the retired `benchmarks/train_throughput.py
--levers`: docs/benchmarks.md, "Settings chosen by retired benchmarks"). Here the
keep bit of entry i is `hash(i, seed) >= rate * 2^32`, murmur3's 32-bit finaliser
applied twice (a bijection with full avalanche, keyed by both words of the seed),
and mask, scale and select run as one XLA-compiled loop (compiled once per input
shape; training's shapes repeat). The same distribution (each entry kept with
probability 1 - rate, independently, scaled by 1 / (1 - rate)), a different stream
of masks. The seed is a `keras.random.SeedGenerator`'s `next()`, so a checkpoint
that holds the generators' state resumes with the masks an uninterrupted run would
draw.

Only the dropout is compiled: layer norm, softmax and GELU as XLA functions
measured slower than TensorFlow's own kernels on a CPU.
"""

import tensorflow as tf

_GOLDEN = 0x9E3779B9  # 2^32 / golden ratio: spreads consecutive counters
_KEY_OFFSET = 0x632BE5AB


def _xor_shift(h, bits: int):
    return tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, tf.constant(bits, tf.uint32)))


def _fmix32(h):
    """murmur3's 32-bit finaliser (uint32 -> uint32, a bijection)."""
    h = _xor_shift(h, 16) * tf.constant(0x85EBCA6B, tf.uint32)
    h = _xor_shift(h, 13) * tf.constant(0xC2B2AE35, tf.uint32)
    return _xor_shift(h, 16)


def keep_mask(shape, seed, rate: float):
    """Bool mask of `shape`: True with probability `1 - rate`, independently per
    entry; `seed`: two integers."""
    words = tf.cast(tf.bitwise.bitwise_and(tf.cast(seed, tf.int64),
                                           tf.constant(0xFFFFFFFF, tf.int64)), tf.uint32)
    counter = tf.bitcast(tf.range(tf.reduce_prod(shape), dtype=tf.int32), tf.uint32)
    h = _fmix32(counter * tf.constant(_GOLDEN, tf.uint32) + _fmix32(words[0]))
    h = _fmix32(tf.bitwise.bitwise_xor(
        h, _fmix32(words[1] + tf.constant(_KEY_OFFSET, tf.uint32))))
    return tf.reshape(h >= tf.constant(keep_threshold(rate), tf.uint32), shape)


def keep_threshold(rate: float) -> int:
    """An entry is kept when its 32-bit hash is at least this (round(rate * 2^32))."""
    return min(int(round(rate * 2.0 ** 32)), 2 ** 32 - 1)


def _drop(x, seed, rate: float):
    if rate == 0.0:
        return x
    keep = keep_mask(tf.shape(x), seed, rate)
    return tf.where(keep, x * tf.cast(1.0 / (1.0 - rate), x.dtype), tf.zeros_like(x))


def check_rate(rate) -> float:
    rate = float(rate)
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
    return rate


_COMPILED = {}


def dropout(x, rate: float, seed):
    """`x` with each entry zeroed with probability `rate`, the rest scaled by
    1 / (1 - rate); `seed`: two integers (`keras.random.SeedGenerator.next()`)."""
    rate = check_rate(rate)
    if rate == 0.0:
        return x
    if rate not in _COMPILED:
        _COMPILED[rate] = tf.function(lambda x, seed: _drop(x, seed, rate), jit_compile=True)
    return _COMPILED[rate](x, seed)
