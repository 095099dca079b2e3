"""Mapping other BERT checkpoints' variables into `LeallaEncoder`.

Three layouts are understood:

- "tf1_bert": the names of google-research/bert, used by the released LEALLA
  hub models under a `student_bert/` prefix (`student_bert/encoder/layer_0/
  attention/self/query/kernel`). LEALLA also carries a dead
  `token_type_embeddings_real` table and a `Variable` (do_lower_case) that are
  skipped. Attention kernels may be stored 2-D `[d, d]` or per head.
- "model_garden": TF Model Garden's Keras `BertEncoder`, the LaBSE/2 encoder
  (`transformer/layer_0/self_attention/query/kernel` with einsum kernels
  `[d, heads, head_dim]`, `pooler_transform`, `type_embeddings`).
- "hf_bert": HuggingFace `BertModel` safetensors (`encoder.layer.0.attention.
  self.query.weight`, linear weights stored `[out, in]`).

The GELU of the target encoder must follow the checkpoint's origin: the tanh
approximation for TensorFlow checkpoints, the exact form for HuggingFace ones
(`hidden_act: "gelu"`).
"""

import json
import os
import re

import numpy as np
import tensorflow as tf
from safetensors.numpy import load_file
from tensorflow.core.protobuf import saved_model_pb2, trackable_object_graph_pb2

from lealla_tf.configs import EncoderConfig
from lealla_tf.models.encoder import build_encoder
from lealla_tf.models.model_dir import (
    TokenizerConfig,
    save_encoder_checkpoint,
    write_model_config,
)

LAYOUTS = ("tf1_bert", "model_garden", "hf_bert")

# Released LEALLA / LaBSE heads per width (TF1 kernels do not record heads).
KNOWN_HEADS_BY_WIDTH = {128: 8, 192: 12, 256: 8, 768: 12}

# (our weight path, tf1_bert name, model_garden name, hf_bert name); "{i}" is the layer.
_EMBEDDING_ROWS = [
    ("token_embedding/embeddings", "{p}embeddings/word_embeddings",
     "word_embeddings/embeddings", "embeddings.word_embeddings.weight"),
    ("position_embedding/embeddings", "{p}embeddings/position_embeddings",
     "position_embedding/embeddings", "embeddings.position_embeddings.weight"),
    ("segment_embedding/embeddings", "{p}embeddings/token_type_embeddings",
     "type_embeddings/embeddings", "embeddings.token_type_embeddings.weight"),
    ("embeddings_layer_norm/gamma", "{p}embeddings/LayerNorm/gamma",
     "embeddings/layer_norm/gamma", "embeddings.LayerNorm.weight"),
    ("embeddings_layer_norm/beta", "{p}embeddings/LayerNorm/beta",
     "embeddings/layer_norm/beta", "embeddings.LayerNorm.bias"),
]
_LAYER_ROWS = []
for _projection in ("query", "key", "value"):
    for _ours, _tf, _hf in (("kernel", "kernel", "weight"), ("bias", "bias", "bias")):
        _LAYER_ROWS.append((
            f"transformer_layer_{{i}}/self_attention_layer/{_projection}/{_ours}",
            f"{{p}}encoder/layer_{{i}}/attention/self/{_projection}/{_tf}",
            f"transformer/layer_{{i}}/self_attention/{_projection}/{_tf}",
            f"encoder.layer.{{i}}.attention.self.{_projection}.{_hf}"))
for _ours, _tf, _hf in (("kernel", "kernel", "weight"), ("bias", "bias", "bias")):
    _LAYER_ROWS += [
        (f"transformer_layer_{{i}}/self_attention_layer/attention_output/{_ours}",
         f"{{p}}encoder/layer_{{i}}/attention/output/dense/{_tf}",
         f"transformer/layer_{{i}}/self_attention/attention_output/{_tf}",
         f"encoder.layer.{{i}}.attention.output.dense.{_hf}"),
        (f"transformer_layer_{{i}}/feedforward_intermediate_dense/{_ours}",
         f"{{p}}encoder/layer_{{i}}/intermediate/dense/{_tf}",
         f"transformer/layer_{{i}}/intermediate/{_tf}",
         f"encoder.layer.{{i}}.intermediate.dense.{_hf}"),
        (f"transformer_layer_{{i}}/feedforward_output_dense/{_ours}",
         f"{{p}}encoder/layer_{{i}}/output/dense/{_tf}",
         f"transformer/layer_{{i}}/output/{_tf}",
         f"encoder.layer.{{i}}.output.dense.{_hf}"),
    ]
for _ours, _tf, _hf in (("gamma", "gamma", "weight"), ("beta", "beta", "bias")):
    _LAYER_ROWS += [
        (f"transformer_layer_{{i}}/self_attention_layer_norm/{_ours}",
         f"{{p}}encoder/layer_{{i}}/attention/output/LayerNorm/{_tf}",
         f"transformer/layer_{{i}}/self_attention_layer_norm/{_tf}",
         f"encoder.layer.{{i}}.attention.output.LayerNorm.{_hf}"),
        (f"transformer_layer_{{i}}/feedforward_layer_norm/{_ours}",
         f"{{p}}encoder/layer_{{i}}/output/LayerNorm/{_tf}",
         f"transformer/layer_{{i}}/output_layer_norm/{_tf}",
         f"encoder.layer.{{i}}.output.LayerNorm.{_hf}"),
    ]
_POOLER_ROWS = [
    ("pooled_dense/kernel", "{p}pooler/dense/kernel", "pooler_transform/kernel",
     "pooler.dense.weight"),
    ("pooled_dense/bias", "{p}pooler/dense/bias", "pooler_transform/bias", "pooler.dense.bias"),
]
# Present in real checkpoints but not part of the encoder.
_IGNORED = {
    "tf1_bert": (r"(^|/)Variable$", r"token_type_embeddings_real$"),
    "model_garden": (r"(^|/)Variable$",),
    "hf_bert": (r"position_ids$",),
}
_ALTERNATIVES = {"{p}embeddings/token_type_embeddings": "{p}embeddings/token_type_embeddings_real"}


def _column(layout):
    return 1 + LAYOUTS.index(layout)


def source_names(layout: str, num_layers: int, pooler: bool = True,
                 prefix: str = "") -> list[tuple[str, str]]:
    """(our weight path, source variable name) for every weight of the encoder."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    column = _column(layout)
    rows = [(r[0], r[column]) for r in _EMBEDDING_ROWS]
    for i in range(num_layers):
        rows += [(r[0].format(i=i), r[column].format(i=i, p="{p}")) for r in _LAYER_ROWS]
    if pooler:
        rows += [(r[0], r[column]) for r in _POOLER_ROWS]
    return [(ours, source.format(p=prefix)) for ours, source in rows]


def detect_layout(names) -> tuple[str, str]:
    """(layout, prefix) of a set of variable names; ValueError when unknown."""
    names = list(names)
    for name in names:
        match = re.match(r"^(.*?)encoder/layer_\d+/attention/self/query/kernel$", name)
        if match:
            return "tf1_bert", match.group(1)
    if any(re.match(r"^transformer/layer_\d+/self_attention/query/kernel$", n) for n in names):
        return "model_garden", ""
    for name in names:
        match = re.match(r"^(.*?)encoder\.layer\.\d+\.attention\.self\.query\.weight$", name)
        if match:
            return "hf_bert", match.group(1)
    raise ValueError("unrecognised checkpoint layout; expected TF1 BERT / LEALLA, Model Garden "
                     f"BertEncoder / LaBSE or HuggingFace BERT names, got e.g. {names[:5]}")


def infer_encoder_config(tensors: dict[str, np.ndarray], layout: str, prefix: str = "",
                         num_heads: int | None = None,
                         hidden_activation: str | None = None) -> EncoderConfig:
    """The architecture a checkpoint's tensors describe.

    Heads come from per-head kernels when stored so, else from `num_heads`,
    else from the released models' widths (128 and 256: 8, 192 and 768: 12).
    """
    names = dict(source_names(layout, 0, pooler=True, prefix=prefix))
    word = tensors[names["token_embedding/embeddings"]]
    position = tensors[names["position_embedding/embeddings"]]
    segment_name = names["segment_embedding/embeddings"]
    if segment_name not in tensors and layout == "tf1_bert":
        segment_name = segment_name + "_real"
    segment = tensors[segment_name]
    layer_pattern = {
        "tf1_bert": re.escape(prefix) + r"encoder/layer_(\d+)/",
        "model_garden": r"transformer/layer_(\d+)/",
        "hf_bert": re.escape(prefix) + r"encoder\.layer\.(\d+)\.",
    }[layout]
    layers = {int(m.group(1)) for n in tensors for m in [re.match(layer_pattern, n)] if m}
    if not layers:
        raise ValueError("no transformer layers found in the checkpoint")
    layer0 = dict(source_names(layout, 1, prefix=prefix))
    intermediate = tensors[layer0["transformer_layer_0/feedforward_intermediate_dense/kernel"]]
    query = tensors[layer0["transformer_layer_0/self_attention_layer/query/kernel"]]
    hidden = word.shape[1]
    if query.ndim == 3:
        num_heads = query.shape[1]
    elif num_heads is None:
        if hidden not in KNOWN_HEADS_BY_WIDTH:
            raise ValueError(f"cannot infer attention heads for width {hidden}; pass num_heads")
        num_heads = KNOWN_HEADS_BY_WIDTH[hidden]
    intermediate_dim = intermediate.shape[0] if layout == "hf_bert" else intermediate.shape[1]
    has_pooler = names["pooled_dense/kernel"] in tensors
    if hidden_activation is None:
        hidden_activation = "gelu" if layout == "hf_bert" else "gelu_approximate"
    return EncoderConfig(
        vocabulary_size=int(word.shape[0]), num_layers=max(layers) + 1, num_heads=int(num_heads),
        hidden_dim=int(hidden), intermediate_dim=int(intermediate_dim),
        max_sequence_length=int(position.shape[0]), num_segments=int(segment.shape[0]),
        pooling="cls" if has_pooler else "mean", hidden_activation=hidden_activation)


def assign_weights(encoder, tensors: dict[str, np.ndarray], layout: str,
                   prefix: str = "") -> list[str]:
    """Copies checkpoint tensors into `encoder`, reshaping per-head kernels.

    Returns the names of checkpoint tensors left unused (besides the known
    dead ones). Raises ValueError naming any weight that is missing or whose
    size does not match.
    """
    if (encoder.embedding_dim is not None or encoder.num_unique_layers is not None
            or encoder.pooler_dim is not None or encoder.output_dim is not None):
        raise ValueError("released checkpoints have no embedding bottleneck, shared layers "
                         "or extra pooler / output projection")
    weights = {w.path: w for w in encoder.weights}
    used, missing, mismatched = set(), [], []
    for ours, source in source_names(layout, encoder.num_layers,
                                     pooler=encoder.pooling == "cls", prefix=prefix):
        if source not in tensors:
            alternative = _ALTERNATIVES.get(source.replace(prefix, "{p}", 1), "")
            alternative = alternative.format(p=prefix)
            if alternative in tensors:
                source = alternative
            else:
                missing.append(source)
                continue
        value = np.asarray(tensors[source])
        target = weights[ours]
        # HuggingFace linear layers store [out, in]; Keras kernels are [in, ...].
        if layout == "hf_bert" and source.endswith(".weight") and value.ndim == 2 and (
                "embeddings" not in source and "LayerNorm" not in source):
            value = value.T
        if value.size != int(np.prod(target.shape)):
            mismatched.append(f"{source} {value.shape} -> {ours} {tuple(target.shape)}")
            continue
        target.assign(value.reshape(target.shape).astype(target.dtype))
        used.add(source)
    if missing or mismatched:
        raise ValueError("checkpoint does not fit the encoder: "
                         + "; ".join([f"missing {m}" for m in missing] + mismatched))
    ignored = [re.compile(p) for p in _IGNORED[layout]]
    return sorted(n for n in tensors
                  if n not in used and not any(p.search(n) for p in ignored))


def read_saved_model_variables(path: str) -> dict[str, np.ndarray]:
    """{variable name: value} of a TF2 SavedModel (TF-Hub module), without loading it.

    Names come from the object graph in `saved_model.pb`, values from the
    checkpoint under `variables/`, so no graph is built and no custom op
    (tensorflow-text) is needed.
    """
    proto_path = os.path.join(path, "saved_model.pb")
    if not tf.io.gfile.exists(proto_path):
        raise FileNotFoundError(f"{proto_path} not found: not a SavedModel directory")
    saved_model = saved_model_pb2.SavedModel()
    with tf.io.gfile.GFile(proto_path, "rb") as f:
        saved_model.ParseFromString(f.read())
    reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
    # The checkpoint's object graph lists nodes in the same order as the
    # SavedModel's; it holds the checkpoint key of each variable's value.
    checkpoint_graph = trackable_object_graph_pb2.TrackableObjectGraph()
    checkpoint_graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    graph = saved_model.meta_graphs[0].object_graph_def
    tensors = {}
    for node, checkpoint_node in zip(graph.nodes, checkpoint_graph.nodes):
        if node.WhichOneof("kind") != "variable":
            continue
        keys = [a.checkpoint_key for a in checkpoint_node.attributes
                if a.name == "VARIABLE_VALUE"]
        if not keys:
            continue
        name = node.variable.name
        name = name[:-2] if name.endswith(":0") else name
        if name in tensors:
            raise ValueError(f"{path} has two variables named {name}")
        tensors[name] = reader.get_tensor(keys[0])
    if not tensors:
        raise ValueError(f"{path} holds no variables")
    return tensors


def find_vocab_asset(path: str) -> str | None:
    """The vocabulary file among a SavedModel's assets, if there is one."""
    assets = os.path.join(path, "assets")
    if not tf.io.gfile.isdir(assets):
        return None
    names = sorted(tf.io.gfile.listdir(assets))
    for name in names:
        if "vocab" in name or name.endswith(".model"):
            return os.path.join(assets, name)
    return os.path.join(assets, names[0]) if len(names) == 1 else None


def read_huggingface_checkpoint(hf_dir: str):
    """(tensors, HF config dict, sentence-transformers settings) of a BERT folder.

    Reads `config.json`, `model.safetensors`, and when present the
    sentence-transformers files: `1_Pooling/config.json` (pooling mode),
    `sentence_bert_config.json` (max_seq_length), `modules.json` (Normalize),
    `tokenizer_config.json` (do_lower_case).
    """
    def read(name, default=None):
        path = os.path.join(hf_dir, name)
        if not os.path.exists(path):
            if default is None:
                raise FileNotFoundError(f"{path} not found (expected a HuggingFace BERT folder)")
            return default
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    config = read("config.json")
    if config.get("model_type", "bert") != "bert":
        raise ValueError(f"only BERT checkpoints are supported, got model_type "
                         f"{config.get('model_type')!r}")
    weights = os.path.join(hf_dir, "model.safetensors")
    if not os.path.exists(weights):
        raise FileNotFoundError(f"{weights} not found")
    tensors = load_file(weights)
    pooling = read(os.path.join("1_Pooling", "config.json"), {})
    modules = read("modules.json", [])
    settings = {
        "pooling": "mean" if pooling.get("pooling_mode_mean_tokens", not pooling) else "cls",
        "normalize": any(m.get("type", "").endswith("Normalize") for m in modules),
        "max_seq_length": read("sentence_bert_config.json", {}).get("max_seq_length", 128),
        "do_lower_case": read("tokenizer_config.json", {}).get("do_lower_case", False),
        "hidden_act": config.get("hidden_act", "gelu"),
    }
    if pooling.get("pooling_mode_cls_token") or pooling.get("pooling_mode_max_tokens"):
        raise NotImplementedError(
            f"{hf_dir}: only mean pooling (pooling_mode_mean_tokens) is supported, "
            f"got {pooling}")
    return tensors, config, settings


def hidden_activation_of_huggingface(hidden_act: str) -> str:
    """Our activation name for a HuggingFace `hidden_act`."""
    mapping = {"gelu": "gelu", "gelu_new": "gelu_approximate",
               "gelu_pytorch_tanh": "gelu_approximate", "gelu_fast": "gelu_approximate",
               "relu": "relu"}
    if hidden_act not in mapping:
        raise ValueError(f"unsupported hidden_act {hidden_act!r}; supported: {sorted(mapping)}")
    return mapping[hidden_act]


def encoder_from_huggingface(hf_dir: str):
    """(encoder, tokenizer, settings) for a HuggingFace BERT sentence encoder.

    Mean pooling + L2 normalisation as sentence-transformers does; exact GELU
    when the checkpoint says `hidden_act: "gelu"`; lower-casing from
    `tokenizer_config.json`; max length from `sentence_bert_config.json`.
    """
    from lealla_tf.tokenizers.tokenizer import Tokenizer  # noqa: PLC0415 - tensorflow_text

    tensors, hf_config, settings = read_huggingface_checkpoint(hf_dir)
    layout, prefix = detect_layout(tensors)
    config = infer_encoder_config(
        tensors, layout, prefix, num_heads=hf_config["num_attention_heads"],
        hidden_activation=hidden_activation_of_huggingface(settings["hidden_act"]))
    config = config.replace(pooling="mean",
                            dropout=float(hf_config.get("hidden_dropout_prob", 0.1)),
                            layer_norm_epsilon=float(hf_config.get("layer_norm_eps", 1e-12)))
    encoder = build_encoder(config, name="teacher_encoder")
    unused = assign_weights(encoder, tensors, layout, prefix)
    vocab_file = os.path.join(hf_dir, "vocab.txt")
    max_seq_length = min(int(settings["max_seq_length"]), config.max_sequence_length)
    tokenizer = Tokenizer(vocab_file, max_seq_length=max_seq_length,
                          lower_case=bool(settings["do_lower_case"]))
    settings.update({"unused_tensors": unused, "encoder": config})
    return encoder, tokenizer, settings


def import_saved_model(saved_model: str, model_dir: str, vocab_file: str | None = None,
                       num_heads: int | None = None, max_seq_length: int = 128,
                       lower_case: bool | None = None) -> dict:
    """Writes a model directory from a released LEALLA or LaBSE/2 SavedModel.

    The result can be fine-tuned (`python -m lealla_tf.train --init_from=...`)
    or re-exported (`export/export_tfhub.py`). Returns a summary.
    """
    tensors = read_saved_model_variables(saved_model)
    layout, prefix = detect_layout(tensors)
    if layout == "hf_bert":
        raise ValueError("HuggingFace checkpoints are folders; use encoder_from_huggingface")
    config = infer_encoder_config(tensors, layout, prefix, num_heads=num_heads)
    encoder = build_encoder(config)
    unused = assign_weights(encoder, tensors, layout, prefix)
    vocab_file = vocab_file or find_vocab_asset(saved_model)
    if vocab_file is None:
        raise FileNotFoundError(f"no vocabulary asset in {saved_model}; pass vocab_file")
    if lower_case is None:
        flags = [v for n, v in tensors.items() if re.search(r"(^|/)Variable$", n) and v.ndim == 0
                 and v.dtype == np.bool_]
        lower_case = bool(flags[0]) if flags else False
    write_model_config(model_dir, config,
                       TokenizerConfig(max_seq_length=max_seq_length, lower_case=lower_case),
                       source_vocab_file=vocab_file,
                       origin={"imported_from": saved_model, "layout": layout})
    checkpoint = save_encoder_checkpoint(model_dir, encoder)
    return {"layout": layout, "encoder": config, "checkpoint": checkpoint,
            "unused_tensors": unused, "vocab_file": vocab_file, "lower_case": lower_case}
