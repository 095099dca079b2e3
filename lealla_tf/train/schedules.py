"""Learning-rate schedules of the trainer."""

import keras
import tensorflow as tf

from lealla_tf.train.decay import decay_window


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
        start, decay_steps = decay_window(tf.cast(self.total_steps, tf.float32),
                                          self.warmup_steps, self.decay_fraction, tf.maximum)
        progress = tf.clip_by_value((step - start) / decay_steps, 0.0, 1.0)
        decayed = self.peak * (1.0 - (1.0 - self.end_fraction) * progress)
        return tf.where(step < warmup, self.peak * (step + 1.0) / warmup, decayed)

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps,
                "total_steps": int(self.total_steps), "end_fraction": self.end_fraction,
                "decay_fraction": self.decay_fraction}
