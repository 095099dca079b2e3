"""The objectives table: every loss term the trainer can optimise, one row each.

A row says how to compute its term from what one step has (`TermInputs`),
whether it needs a teacher, whether it uses the candidates of the whole global
batch (gathered across replicas), its default weight (the paper's alpha, beta
and gamma by width), and which heads it needs. Adding a term is one row here
plus its function in `lealla_tf.losses.functions`; the trainer, the config resolution,
the CLI's `--objective` help and the checks all read this table.

    ams  bidirectional additive margin softmax (LEALLA eq. 1-2)
    fd   feature distillation through a trainable d -> D projection (eq. 3)
    ld   logit distillation over the global batch (eq. 4)
    df   "distillation-first": MSE at a teacher-sized pooler (Appendix C)
    syn  "synchronized": MSE in d after the teacher's fixed reduction (Appendix C)
    mse  multilingual knowledge distillation (Reimers & Gurevych 2020)
    mcl  multilingual contrastive learning (Ding et al. 2022, eq. 5)
    xtr  cross-lingual token-level reconstruction (EMS, Mao & Nakagawa 2023, eq. 6)
    hd   hidden-state distillation: the student's layers learn the frozen teacher's
         layer outputs on the same tokens (TinyBERT-style, at the coordinates and
         layers weight selection gave the student)
"""

import dataclasses
from collections.abc import Callable

PROJECTION, REDUCTION, RECONSTRUCTION = "projection", "reduction", "reconstruction"
TEACHER_LAYERS = "teacher_layers"


@dataclasses.dataclass
class TermInputs:
    """What a term can use, for one replica's rows.

    Attributes:
        student_source, student_target: `[b, d]` unit student embeddings (x, y).
        pooled_source, pooled_target: `[b, p]` pooled outputs before the
            output projection (the distillation-first pooler).
        teacher_source, teacher_target: `[b, D]` unit teacher vectors x^t, y^t
            (equal in English-only mode); None without a teacher.
        gather: `[b, .]` -> `[N, .]`, the global batch's rows (identity on one replica).
        offset: index of this replica's first row in the global batch.
        heads: the `Heads` module (projection, reduction).
        scale, margin, temperature: the loss settings.
        batch: the raw batch dict (token ids), for terms that need it.
        hidden_source, hidden_target: the student's layer outputs (lists of
            `[b, s, d]`), for terms that need them; None for students without.
    """

    student_source: object
    student_target: object
    pooled_source: object
    pooled_target: object
    teacher_source: object
    teacher_target: object
    gather: Callable
    offset: object
    heads: object
    scale: float
    margin: float
    temperature: float
    batch: dict | None = None
    hidden_source: list | None = None
    hidden_target: list | None = None


@dataclasses.dataclass(frozen=True)
class Objective:
    """One row of the objectives table.

    Args:
        name: the `--objective` term.
        compute: `TermInputs` -> `[b]` per-example loss of this replica's rows.
        needs_teacher: the term reads teacher vectors.
        gathers: the term's candidates are the whole global batch.
        default_weight: the student's hidden width d -> default weight.
        heads: heads the term needs (`PROJECTION`: trainable d -> D;
            `REDUCTION`: the fixed D -> d of a dimension-reduction run;
            `RECONSTRUCTION`: EMS's language embedding and MLP over the vocabulary;
            `TEACHER_LAYERS`: the frozen teacher run on the student's tokens).
        teacher_width_pooler: the student's pooler is the teacher's width,
            followed by a dense layer back down to d (distillation-first).
        reads_margin: the term reads `TermInputs.margin` (a change of margin
            changes what the step computes).
        description: one line for help texts.
    """

    name: str
    compute: Callable[[TermInputs], object]
    needs_teacher: bool
    gathers: bool
    default_weight: Callable[[int], float]
    heads: tuple[str, ...] = ()
    teacher_width_pooler: bool = False
    reads_margin: bool = False
    description: str = ""


def paper_beta(hidden_dim: int) -> float:
    """LEALLA's beta: 1e3 for LEALLA-small/base, 1e4 for LEALLA-large (d >= 256) and wider."""
    return 1e4 if hidden_dim >= 256 else 1e3


def _ams(x: TermInputs):
    from lealla_tf.losses import functions as losses  # noqa: PLC0415 - TensorFlow; --help reads this table

    return losses.additive_margin_softmax_loss(
        x.student_source, x.student_target, x.scale, x.margin, x.gather(x.student_source),
        x.gather(x.student_target), x.offset)


def _fd(x: TermInputs):
    from lealla_tf.losses import functions as losses  # noqa: PLC0415 - TensorFlow; --help reads this table

    projection = x.heads.projection
    return losses.feature_distillation_loss(x.teacher_source, x.teacher_target,
                                            projection(x.student_source),
                                            projection(x.student_target))


def _ld(x: TermInputs):
    from lealla_tf.losses import functions as losses  # noqa: PLC0415 - TensorFlow; --help reads this table

    return losses.logit_distillation_loss(
        x.teacher_source, x.teacher_target, x.student_source, x.student_target, x.temperature,
        x.gather(x.teacher_target), x.gather(x.student_target))


def _df(x: TermInputs):
    from lealla_tf.losses import functions as losses  # noqa: PLC0415 - TensorFlow; --help reads this table

    return losses.distillation_first_loss(x.teacher_source, x.teacher_target, x.pooled_source,
                                          x.pooled_target)


def _syn(x: TermInputs):
    from lealla_tf.losses import functions as losses  # noqa: PLC0415 - TensorFlow; --help reads this table

    reduction = x.heads.reduction
    return losses.synchronized_distillation_loss(reduction(x.teacher_source),
                                                 reduction(x.teacher_target),
                                                 x.student_source, x.student_target)


def _mse(x: TermInputs):
    from lealla_tf.losses import functions as losses  # noqa: PLC0415 - TensorFlow; --help reads this table

    projection = x.heads.projection
    return losses.mse_distillation_loss(x.teacher_target, projection(x.student_target),
                                        projection(x.student_source))


def _mcl(x: TermInputs):
    from lealla_tf.losses import functions as losses  # noqa: PLC0415 - TensorFlow; --help reads this table

    # English rows i against translation columns j.
    return losses.multilingual_contrastive_loss(
        x.teacher_target, x.student_target, x.student_source, x.gather(x.teacher_target),
        x.gather(x.student_source))


def _xtr(x: TermInputs):
    from lealla_tf.losses import functions as losses  # noqa: PLC0415 - TensorFlow; --help reads this table

    head = x.heads.reconstruction
    source, target = x.batch["source"], x.batch["target"]
    # Each side predicts the other's tokens, told the other's language.
    source_logits = head(x.student_source, head.english_ids(x.batch["language"]))
    target_logits = head(x.student_target, x.batch["language"])
    return losses.cross_lingual_reconstruction_loss(
        source_logits, target_logits,
        losses.token_distribution(source["input_word_ids"], source["input_mask"],
                                  head.vocabulary_size, head.special_ids),
        losses.token_distribution(target["input_word_ids"], target["input_mask"],
                                  head.vocabulary_size, head.special_ids))


def _hd_side(x: TermInputs, side: str):
    """The hd loss of one side of each pair ("source" or "target")."""
    from lealla_tf.losses import functions as losses  # noqa: PLC0415 - TensorFlow; --help reads this table

    if x.hidden_source is None:
        raise ValueError("the hd objective needs an encoder student (its layer outputs)")
    teacher, tokens = x.heads.teacher_layers, x.batch[side]
    hidden = x.hidden_source if side == "source" else x.hidden_target
    return losses.hidden_state_distillation_loss(teacher.student_states(hidden),
                                                 teacher(tokens), tokens["input_mask"])


def _hd(x: TermInputs):
    return _hd_side(x, "source") + _hd_side(x, "target")


def _hdsrc(x: TermInputs):
    return _hd_side(x, "source")


OBJECTIVES: dict[str, Objective] = {row.name: row for row in [
    Objective("ams", _ams, needs_teacher=False, gathers=True, default_weight=lambda d: 1.0,
              reads_margin=True,
              description="additive margin softmax, negatives from the global batch"),
    Objective("fd", _fd, needs_teacher=True, gathers=False, default_weight=paper_beta,
              heads=(PROJECTION,), description="feature distillation, both sides (eq. 3)"),
    Objective("ld", _ld, needs_teacher=True, gathers=True, default_weight=lambda d: 1e-2,
              description="logit distillation over the global batch (eq. 4)"),
    Objective("df", _df, needs_teacher=True, gathers=False, default_weight=paper_beta,
              teacher_width_pooler=True,
              description="distillation-first: MSE at a teacher-sized pooler"),
    Objective("syn", _syn, needs_teacher=True, gathers=False, default_weight=paper_beta,
              heads=(REDUCTION,), description="synchronized: MSE after a fixed reduction"),
    Objective("mse", _mse, needs_teacher=True, gathers=False, default_weight=lambda d: 1.0,
              heads=(PROJECTION,), description="Reimers & Gurevych 2020 MSE to T(en)"),
    Objective("mcl", _mcl, needs_teacher=True, gathers=True, default_weight=lambda d: 1.0,
              description="Ding et al. 2022 multilingual contrastive loss"),
    Objective("xtr", _xtr, needs_teacher=False, gathers=False, default_weight=lambda d: 1.0,
              heads=(RECONSTRUCTION,),
              description="EMS cross-lingual token reconstruction (an MLP over the vocabulary)"),
    Objective("hd", _hd, needs_teacher=False, gathers=False, default_weight=lambda d: 1.0,
              heads=(TEACHER_LAYERS,),
              description="hidden-state distillation: the teacher's layer outputs on the "
                          "student's tokens, both sides (needs --embedding_init_source)"),
    Objective("hdsrc", _hdsrc, needs_teacher=False, gathers=False, default_weight=lambda d: 1.0,
              heads=(TEACHER_LAYERS,),
              description="hd on the source (non-English) side only: half the teacher's "
                          "cost per step"),
]}

ALIASES = {"lealla": "ams+fd+ld", "reimers": "mse", "ding": "mcl+mse"}


def parse_objective(objective: str) -> list[str]:
    """["ams", "fd", "ld"] for "ams+fd+ld" or "lealla"; an alias may be one of the
    joined parts ("lealla+hd"); ValueError otherwise."""
    terms = [term for part in objective.split("+") if part.strip()
             for term in ALIASES.get(part.strip(), part.strip()).split("+")]
    unknown = [t for t in terms if t not in OBJECTIVES]
    if not terms or unknown:
        raise ValueError(f"objective {objective!r}: unknown terms {unknown}; use '+'-joined "
                         f"terms of {tuple(OBJECTIVES)} or one of {sorted(ALIASES)}")
    if len(set(terms)) != len(terms):
        raise ValueError(f"objective {objective!r} repeats a term")
    return terms


def terms_needing(terms: list[str], head: str) -> list[str]:
    """The terms of `terms` whose row needs `head`."""
    return [t for t in terms if head in OBJECTIVES[t].heads]


def reads_teacher(term: str) -> bool:
    """Whether a term reads the teacher: its vectors, or its layers (hd)."""
    row = OBJECTIVES[term]
    return row.needs_teacher or TEACHER_LAYERS in row.heads


def default_loss_weights(hidden_dim: int) -> dict[str, float]:
    """Every term's default weight for a student of width `hidden_dim`."""
    return {name: row.default_weight(hidden_dim) for name, row in OBJECTIVES.items()}


def objective_help() -> str:
    """The table as one line per term, for `--objective`'s help."""
    rows = [f"{name}: {row.description}" for name, row in OBJECTIVES.items()]
    aliases = [f"{alias} = {terms}" for alias, terms in ALIASES.items()]
    return "'+'-joined terms: " + "; ".join(rows) + ". Aliases: " + ", ".join(aliases)


def compute_terms(terms: list[str], inputs: TermInputs, global_batch_size: int) -> dict:
    """{term: this replica's share of the batch-mean loss} for `terms`.

    Each row's per-example loss is summed over the replica's rows and divided
    by the GLOBAL batch size, so summing over replicas gives the batch mean.
    """
    import tensorflow as tf  # noqa: PLC0415 - --help reads this table without TensorFlow

    return {name: tf.reduce_sum(OBJECTIVES[name].compute(inputs)) / global_batch_size
            for name in terms}
