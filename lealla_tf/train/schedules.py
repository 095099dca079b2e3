"""Learning-rate schedules of the trainer."""

import keras
import tensorflow as tf


def decay_window(total_steps, warmup_steps: int, decay_fraction: float):
    """(the step the rate starts to decay at, the steps it decays over), as
    float32 tensors: the last `decay_fraction` of the steps after warmup, and
    never before the warmup ends (step 1 without one). `total_steps` may be a
    tensor or a `tf.Variable`."""
    total = tf.cast(total_steps, tf.float32)
    decay_steps = tf.maximum(decay_fraction * (total - float(warmup_steps)), 1.0)
    return tf.maximum(total - decay_steps, float(max(warmup_steps, 1))), decay_steps


class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to `peak` over `warmup_steps`, then linear decay to
    `end_fraction * peak` at `total_steps`.

    `decay_fraction` < 1 makes it warmup-stable-decay: the rate holds at `peak`
    and decays only over the last `decay_fraction` of the steps after warmup.
    Until its decay starts such a run is a constant-rate run, so a checkpoint
    there can branch into a cooldown of its own (`benchmarks/long_run.py`).

    `total_steps` may be an int64 `tf.Variable`: a run that plans its length
    while it warms up (`lealla_tf.train.trainer.Trainer.train(planner=)`) sets it
    then, and the traced step reads the new value."""

    def __init__(self, peak, warmup_steps, total_steps, end_fraction=0.0, decay_fraction=1.0):
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = (total_steps if isinstance(total_steps, tf.Variable)
                            else int(total_steps))
        self.end_fraction = float(end_fraction)
        self.decay_fraction = float(decay_fraction)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = tf.cast(max(self.warmup_steps, 1), tf.float32)
        start, decay_steps = decay_window(self.total_steps, self.warmup_steps,
                                          self.decay_fraction)
        progress = tf.clip_by_value((step - start) / decay_steps, 0.0, 1.0)
        decayed = self.peak * (1.0 - (1.0 - self.end_fraction) * progress)
        return tf.where(step < warmup, self.peak * (step + 1.0) / warmup, decayed)

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps,
                "total_steps": int(self.total_steps), "end_fraction": self.end_fraction,
                "decay_fraction": self.decay_fraction}
