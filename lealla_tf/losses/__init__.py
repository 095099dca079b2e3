"""Training losses as pure functions of tensors (`functions`: additive margin
softmax, feature and logit distillation, hidden-state distillation), and the
objectives table that names every term the trainer can optimise (`objectives`).

May import: nothing else of lealla_tf (TensorFlow only).
"""
