"""Encoder presets: every architecture of LEALLA's Table 1 and Table 7.

`lealla-presets` (`lealla_tf.cli.list_presets`) prints each preset with L, d, H, d_ff and
its exact parameter count for a vocabulary size (default: LaBSE's 501,153 tokens).
"""

import dataclasses

from lealla_tf.configs import EncoderConfig

LABSE_VOCABULARY_SIZE = 501_153


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named architecture with what the paper reports for it.

    Args:
        encoder: the `EncoderConfig` (with LaBSE's vocabulary size).
        description: where the architecture comes from.
        paper_parameters: the parameter count as printed in the paper.
        released_parameters: exact count of the released TF-Hub model, if any.
    """

    encoder: EncoderConfig
    description: str
    paper_parameters: str
    released_parameters: int | None = None


def _encoder(num_layers, hidden_dim, num_heads, intermediate_dim):
    return EncoderConfig(
        vocabulary_size=LABSE_VOCABULARY_SIZE, num_layers=num_layers,
        num_heads=num_heads, hidden_dim=hidden_dim, intermediate_dim=intermediate_dim)


PRESETS: dict[str, Preset] = {
    "labse": Preset(_encoder(12, 768, 12, 3072), "LaBSE, the teacher (Table 1 #0)",
                    "471M", 470_926_848),
    "lealla_small": Preset(_encoder(24, 128, 8, 512), "LEALLA-small, released (#8)",
                           "69M", 68_988_672),
    "lealla_base": Preset(_encoder(24, 192, 12, 768), "LEALLA-base, released (#7)",
                          "107M", 107_034_240),
    "lealla_large": Preset(_encoder(24, 256, 8, 1024), "LEALLA-large, released (#6)",
                           "147M", 147_447_296),
    "layers6_hidden768": Preset(_encoder(6, 768, 12, 3072), "fewer layers (Table 1 #1)", "428M"),
    "layers3_hidden768": Preset(_encoder(3, 768, 12, 3072), "fewer layers (Table 1 #2)", "407M"),
    "layers12_hidden384": Preset(_encoder(12, 384, 12, 1536), "smaller hidden (Table 1 #3)",
                                 "214M"),
    "layers12_hidden192": Preset(_encoder(12, 192, 12, 768), "smaller hidden (Table 1 #4)",
                                 "102M"),
    "layers24_hidden384": Preset(_encoder(24, 384, 12, 1536), "thin-deep (Table 1 #5)", "235M"),
    "layers24_hidden64": Preset(_encoder(24, 64, 8, 256), "thin-deep (Table 7 #9)", "33M"),
    "mobilebert_like_256": Preset(_encoder(24, 256, 4, 256), "MobileBERT-like d_ff=d (Table 7 #10)",
                                  "138M"),
    "mobilebert_like_192": Preset(_encoder(24, 192, 4, 192), "MobileBERT-like d_ff=d (Table 7 #11)",
                                  "102M"),
    "mobilebert_like_128": Preset(_encoder(24, 128, 4, 128), "MobileBERT-like d_ff=d (Table 7 #12)",
                                  "66M"),
}


def get_preset(name: str) -> Preset:
    """The preset called `name`; ValueError listing the valid names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}") from None


DIMENSION_REDUCTION = "dimension_reduction"


def student_preset(name: str, overrides: dict | None = None, reduction_dim: int = 128,
                   objective: str = "lealla"):
    """What a trainer's --preset means: (student kind, EncoderConfig, objective).

    `name` is an encoder preset (changed by `overrides`, EncoderConfig fields)
    or "dimension_reduction" (Section 3.2: the frozen teacher plus a dense layer
    to `reduction_dim`, trained with AMS; the default objective "lealla" then
    means "ams"). Its stand-in encoder has no fields to override, so
    `overrides` with it are a ValueError rather than silently ignored.
    """
    if name == DIMENSION_REDUCTION:
        if overrides:
            raise ValueError("--encoder_overrides do not apply to dimension_reduction (its "
                             "only size is --reduction_dim)")
        # EncoderConfig refuses it too, but as "EncoderConfig.hidden_dim"; the user typed a flag.
        if reduction_dim <= 0:
            raise ValueError(f"--reduction_dim must be positive, got {reduction_dim}")
        encoder = EncoderConfig(num_layers=1, num_heads=1, hidden_dim=reduction_dim,
                                intermediate_dim=1)
        return DIMENSION_REDUCTION, encoder, "ams" if objective == "lealla" else objective
    return "encoder", get_preset(name).encoder.replace(**(overrides or {})), objective


def count_parameters(config: EncoderConfig) -> int:
    """Exact number of weights of `build_encoder(config)`, without building it.

    The tests check this formula against built models for every preset.
    """
    d, f = config.hidden_dim, config.intermediate_dim
    token_dim = config.embedding_dim or d
    embeddings = config.vocabulary_size * token_dim
    if config.embedding_dim is not None:
        embeddings += token_dim * d + d  # bottleneck projection
    embeddings += config.max_sequence_length * d + config.num_segments * d
    embeddings += 2 * d  # embedding layer norm
    attention = 4 * (d * d + d)  # query, key, value, output (with biases)
    feed_forward = d * f + f + f * d + d
    layer = attention + feed_forward + 2 * (2 * d)  # two layer norms
    layers = (config.num_unique_layers or config.num_layers) * layer
    pooled = d
    pooler = 0
    if config.pooling == "cls":
        pooled = config.pooler_dim or d
        pooler = d * pooled + pooled
    output = pooled * config.output_dim + config.output_dim if config.output_dim else 0
    return embeddings + layers + pooler + output


def count_flops_per_token(config: EncoderConfig, length: float) -> float:
    """Floating-point operations (a multiply-add is two) of `build_encoder(config)`'s
    forward pass per token of a sentence `length` tokens long: every layer's
    matmuls (attention projections, feed-forward) and its attention over the
    sentence (scores and the weighted sum), then the pooler and output
    projection, once a sentence. Lookups, layer norms, softmax and activations,
    a few operations an element, are left out: the roofline's compute is the
    matmuls'."""
    d, f = config.hidden_dim, config.intermediate_dim
    bottleneck = 2 * config.embedding_dim * d if config.embedding_dim is not None else 0
    layer = 2 * (4 * d * d + 2 * d * f) + 2 * 2 * length * d
    pooled = (config.pooler_dim or d) if config.pooling == "cls" else d
    pooler = 2 * d * pooled if config.pooling == "cls" else 0
    output = 2 * pooled * config.output_dim if config.output_dim else 0
    return bottleneck + config.num_layers * layer + (pooler + output) / max(length, 1)


def count_encoder_parameters(config: EncoderConfig) -> int:
    """Parameters except the token embedding table (the paper's P_E)."""
    token_dim = config.embedding_dim or config.hidden_dim
    return count_parameters(config) - config.vocabulary_size * token_dim


def format_preset_table(vocabulary_size: int = LABSE_VOCABULARY_SIZE) -> str:
    """The preset table as text, one row per preset."""
    header = (f"{'preset':<21}{'L':>3}{'d':>5}{'H':>4}{'d_ff':>6}"
              f"{'parameters':>14}{'encoder':>12}{'paper':>7}  description")
    rows = [header, "-" * len(header)]
    for name, preset in PRESETS.items():
        config = preset.encoder.replace(vocabulary_size=vocabulary_size)
        rows.append(
            f"{name:<21}{config.num_layers:>3}{config.hidden_dim:>5}{config.num_heads:>4}"
            f"{config.intermediate_dim:>6}{count_parameters(config):>14,}"
            f"{count_encoder_parameters(config):>12,}{preset.paper_parameters:>7}  "
            f"{preset.description}")
    return "\n".join(rows)
