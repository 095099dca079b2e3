"""The warmup-stable-decay window (`lealla_tf.train.schedules.WarmupLinearDecay`)
as arithmetic that runs on numbers or on tensors: the schedule computes it in
the graph, the cooldown's settings (`lealla_tf.train.cooldown`) and the
main job's planner (`lealla_tf.recipe.planner`) on numbers. Importing it loads
no TensorFlow."""


def decay_window(total_steps, warmup_steps: int, decay_fraction: float, maximum=max):
    """(the step the rate starts to decay at, the steps it decays over): the last
    `decay_fraction` of the steps after warmup, never before the warmup ends
    (step 1 without one). `maximum`: `tf.maximum` for tensors."""
    decay_steps = maximum(decay_fraction * (total_steps - float(warmup_steps)), 1.0)
    return maximum(total_steps - decay_steps, float(max(warmup_steps, 1))), decay_steps
