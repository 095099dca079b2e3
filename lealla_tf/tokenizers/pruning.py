"""The teacher's vocabulary, pruned to the pieces a corpus uses.

`prune_teacher_vocabulary(teacher_model, inputs, output)` tokenizes every
sentence of the parallel corpus with the teacher's SentencePiece model (XLM-R's
250k unigram pieces for multilingual-e5-small), counts the pieces per language,
balances languages by temperature sampling (as the vocabulary builder does), and
writes a SentencePiece model that keeps:

- the special pieces (<s>, <pad>, </s>, <unk>);
- the most used pieces (all that occur, or the `max_pieces` most used);
- every single-character piece of every piece that occurs, so a word whose
  pieces were dropped falls back to smaller pieces and finally to characters,
  never to a wrong id (a character the teacher itself lacks stays <unk>).

Pieces keep the teacher's scores and relative order, so the pruned model
segments as the teacher would wherever its pieces survive. Because the pieces
are the teacher's own strings, the student's token embeddings can start from
the teacher's (`lealla_tf.train.initialization`). This is the LEALLA paper's stated
future work: embeddings are 64M of LEALLA-small's 69M parameters.
"""

import collections
import time
from collections.abc import Sequence

import sentencepiece
import tensorflow as tf

from lealla_tf.parallel_corpus import find_parallel_files
from lealla_tf.progress import progress_bar
from lealla_tf.tokenizers import sentencepiece_model as spm_model
from lealla_tf.tokenizers.vocabulary import language_weights, read_sentences


def read_model_proto(path: str) -> bytes:
    """The bytes of a SentencePiece `.model` file (any path tf.io.gfile reads)."""
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


def count_pieces(processor, by_language, batch_size: int = 4096, progress: bool = True):
    """{language: Counter of piece ids} over every sentence."""
    counts = {}
    for language in progress_bar(sorted(by_language), desc="counting pieces",
                                 unit="language", disable=not progress):
        counter = collections.Counter()
        sentences = by_language[language]
        for start in range(0, len(sentences), batch_size):
            for ids in processor.encode(sentences[start:start + batch_size], num_threads=2):
                counter.update(ids)
        counts[language] = counter
    return counts


def prune_teacher_vocabulary(teacher_model: str, inputs: Sequence[str], output: str,
                             max_pieces: int | None = None, alpha: float = 0.3,
                             progress: bool = True) -> dict:
    """Writes the pruned SentencePiece model to `output` (see the module docstring).

    Args:
        teacher_model: the teacher's `.model` file (a converted teacher keeps it
            as `<teacher>/sentencepiece.model`).
        inputs: parallel TSV files, directories or globs.
        output: the `.model` file to write.
        max_pieces: keep at most this many pieces besides specials and the
            characters (None: every piece that occurs).
        alpha: language balancing exponent of the counts.

    Returns:
        A summary: pieces kept, of which characters, teacher size, coverage.
    """
    if not output.endswith(".model"):
        raise ValueError(f"--output must end in .model (a SentencePiece model), got {output}")
    if max_pieces is not None and max_pieces < 1:
        raise ValueError(f"max_pieces must be positive, got {max_pieces}")
    start = time.time()
    proto = read_model_proto(teacher_model)
    model = spm_model.parse_model(proto)
    processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
    files = find_parallel_files(inputs)
    by_language, stats = read_sentences(files, progress)
    counts = count_pieces(processor, by_language, progress=progress)
    weights = language_weights({lang: len(s) for lang, s in by_language.items()}, alpha)
    weighted = collections.Counter()
    for language, counter in counts.items():
        for piece_id, count in counter.items():
            weighted[piece_id] += count * weights.get(language, 0.0)
    special = {i for i, p in enumerate(model.pieces)
               if p.type in (spm_model.CONTROL, spm_model.UNKNOWN)}
    occurring = [i for i, _ in weighted.most_common() if i not in special]
    chosen = set(occurring if max_pieces is None else occurring[:max_pieces])
    piece_ids = {p.piece: i for i, p in enumerate(model.pieces)}
    characters = set()
    for piece_id in occurring:
        for character in model.pieces[piece_id].piece:
            character_id = piece_ids.get(character)
            if character_id is not None and character_id not in special:
                characters.add(character_id)
    kept = sorted(special | chosen | characters)
    pruned = spm_model.SentencePieceModel(
        [model.pieces[i] for i in kept], model.normalizer_spec, unk_piece=model.unk_piece,
        bos_piece=model.bos_piece, eos_piece=model.eos_piece, pad_piece=model.pad_piece,
        byte_fallback=model.byte_fallback)
    with open(output, "wb") as f:
        f.write(pruned.serialize())
    total = sum(weighted.values())
    covered = sum(weighted[i] for i in chosen)
    return {"output": output, "teacher_model": teacher_model, "teacher_pieces": len(model.pieces),
            "pieces": len(kept), "occurring_pieces": len(occurring),
            "characters_added": len(characters - chosen), "max_pieces": max_pieces,
            "weighted_token_coverage": covered / max(total, 1e-12),
            "languages": len(by_language), "pairs": stats.get("pairs", 0),
            "seconds": time.time() - start}
