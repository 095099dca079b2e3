"""Decontamination: training pairs either side of which appears in evaluation
data (Tatoeba directories or sentence files) are dropped, compared case-folded
and stripped, by an in-graph lookup that runs inside tf.data (`Decontaminator`,
`DataConfig.decontaminate`)."""

from collections.abc import Sequence

import tensorflow as tf

from lealla_tf.parallel_corpus import find_tatoeba_languages, open_text, read_tatoeba


def normalize_for_matching(strings):
    """The form in which sentences are compared for decontamination."""
    import tensorflow_text as text  # noqa: PLC0415 - heavy; only decontamination needs it

    return tf.strings.strip(text.case_fold_utf8(strings))


def evaluation_sentences(paths: Sequence[str]) -> list[str]:
    """Every sentence of evaluation files or Tatoeba directories."""
    sentences = []
    for path in paths:
        if tf.io.gfile.isdir(path):
            for language in find_tatoeba_languages(path):
                source, english = read_tatoeba(path, language)
                sentences += source + english
        else:
            with open_text(path) as f:
                sentences += [line.rstrip("\n") for line in f]
    return sentences


class Decontaminator:
    """Drops pairs whose source or target occurs in evaluation data.

    Sentences are compared case-folded and stripped; the lookup is an in-graph
    hash table, so it runs inside tf.data.
    """

    def __init__(self, paths: Sequence[str]):
        sentences = evaluation_sentences(paths)
        keys = normalize_for_matching(tf.constant(sentences or [""])) if sentences else None
        self.size = 0 if keys is None else int(tf.size(tf.unique(keys).y))
        if keys is None:
            self._table = None
        else:
            unique = tf.unique(keys).y
            self._table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(unique, tf.ones_like(unique, tf.int32)),
                default_value=0)

    def keep(self, source, target):
        """True where neither side is an evaluation sentence."""
        if self._table is None:
            return tf.ones_like(source, tf.bool) if source.shape.rank else tf.constant(True)
        hits = (self._table.lookup(normalize_for_matching(source))
                + self._table.lookup(normalize_for_matching(target)))
        return tf.equal(hits, 0)
