"""The encoder and what defines or restores it: `encoder` (LeallaEncoder, the
Keras model built from keras-hub layers), `forward_pass` (its outputs computed
with fewer, larger ops: what the exports, embedders and training run),
`presets` (every architecture of the paper), `layers` (small Keras layers),
`kernels` (the fused C++ CPU kernels), `model_dir` (what training writes and
export reads), `checkpoint_conversion` (released LEALLA / LaBSE / BERT
checkpoints into the encoder) and `e5_checkpoint` (the 4-bit
multilingual-e5-small file). The private Keras and keras-hub attributes the
package relies on live in two adapters and nowhere else: `keras_adapter` (a
TFSMLayer that trains a SavedModel's own variables, AdamW's per-variable decay
and slots) and `transformer_adapter` (keras-hub TransformerEncoder's sublayers).

May import: lealla_tf.json_files, lealla_tf.machine, lealla_tf.progress,
lealla_tf.configs, lealla_tf.flags, lealla_tf.tokenizers.
"""
