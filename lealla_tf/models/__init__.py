"""The encoder and what defines or restores it: `encoder` (LeallaEncoder, built
from keras-hub layers, with its fused inference path), `presets` (every
architecture of the paper), `layers` (small Keras layers), `kernels` (the
fused C++ CPU kernels), `model_dir` (what training writes and export reads),
`checkpoint_conversion` (released LEALLA / LaBSE / BERT checkpoints into the
encoder) and `e5_checkpoint` (the 4-bit multilingual-e5-small file).

May import: lealla_tf.json_files, lealla_tf.machine, lealla_tf.progress,
lealla_tf.configs, lealla_tf.flags, lealla_tf.tokenizers.
"""
