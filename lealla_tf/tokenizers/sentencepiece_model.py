"""SentencePiece `ModelProto` files, written and read without generated protobuf code.

The `sentencepiece` wheel ships `sentencepiece_model_pb2` generated for protobuf 7,
which refuses to import under the protobuf 6 runtime TensorFlow and Beam pin. The
few fields a unigram model needs are encoded here directly in the protobuf wire
format (field numbers from sentencepiece's `sentencepiece_model.proto`):

    ModelProto      1 pieces (repeated SentencePiece), 2 trainer_spec,
                    3 normalizer_spec, 5 denormalizer_spec
    SentencePiece   1 piece (string), 2 score (float), 3 type (enum)
    NormalizerSpec  1 name, 2 precompiled_charsmap, 3 add_dummy_prefix,
                    4 remove_extra_whitespaces, 5 escape_whitespaces,
                    6 normalization_rule_tsv (the path of the rule file compiled:
                    never written, see `without_rule_file`)
    TrainerSpec     3 model_type, 4 vocab_size, 35 byte_fallback,
                    40 unk_id, 41 bos_id, 42 eos_id, 43 pad_id,
                    45 unk_piece, 46 bos_piece, 47 eos_piece, 48 pad_piece

The result is a real model: `sentencepiece.SentencePieceProcessor` and
tensorflow-text's `SentencepieceTokenizer` load it, and the tests check that
what they read back is what was written.
"""

import dataclasses
import os
import struct
import tempfile
from collections.abc import Iterator, Sequence

import sentencepiece

# SentencePiece.Type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
UNIGRAM = 1  # TrainerSpec.ModelType

_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


@dataclasses.dataclass
class Piece:
    """One vocabulary entry: its text, unigram log-probability and type."""

    piece: str
    score: float = 0.0
    type: int = NORMAL


@dataclasses.dataclass
class SentencePieceModel:
    """The parts of a unigram `ModelProto` this package reads and writes.

    Args:
        pieces: the vocabulary; a piece's id is its position.
        normalizer_spec: the serialized `NormalizerSpec` (name, precompiled
            charsmap, whitespace handling), kept as bytes.
        unk_piece, bos_piece, eos_piece, pad_piece: the special pieces'
            spellings (each must be in `pieces`, except an absent pad/bos/eos
            given as "").
        byte_fallback: unknown characters become `<0xNN>` byte pieces.
    """

    pieces: list[Piece]
    normalizer_spec: bytes
    unk_piece: str = "<unk>"
    bos_piece: str = "<s>"
    eos_piece: str = "</s>"
    pad_piece: str = "<pad>"
    byte_fallback: bool = False

    def piece_id(self, piece: str) -> int:
        """Id of `piece`, or -1."""
        for i, entry in enumerate(self.pieces):
            if entry.piece == piece:
                return i
        return -1

    def serialize(self) -> bytes:
        """The `ModelProto` bytes (what a `.model` file holds)."""
        seen, problems = set(), []
        for entry in self.pieces:
            if entry.piece in seen:
                problems.append(f"duplicate piece {entry.piece!r}")
            seen.add(entry.piece)
        if [e.type for e in self.pieces].count(UNKNOWN) != 1:
            problems.append("exactly one piece must have type UNKNOWN")
        if problems:
            raise ValueError("invalid SentencePiece model: " + "; ".join(problems[:5]))
        out = bytearray()
        for entry in self.pieces:
            body = (_field_bytes(1, entry.piece.encode("utf-8"))
                    + _tag(2, _FIXED32) + struct.pack("<f", entry.score))
            if entry.type != NORMAL:
                body += _field_varint(3, entry.type)
            out += _field_bytes(1, body)
        trainer = _field_varint(3, UNIGRAM) + _field_varint(4, len(self.pieces))
        if self.byte_fallback:
            trainer += _field_varint(35, 1)
        for number, name in ((40, self.unk_piece), (41, self.bos_piece), (42, self.eos_piece),
                             (43, self.pad_piece)):
            trainer += _field_varint(number, self.piece_id(name) if name else -1)
        for number, name in ((45, self.unk_piece), (46, self.bos_piece), (47, self.eos_piece),
                             (48, self.pad_piece)):
            if name:
                trainer += _field_bytes(number, name.encode("utf-8"))
        out += _field_bytes(2, trainer)
        out += _field_bytes(3, without_rule_file(self.normalizer_spec))
        return bytes(out)


def parse_model(data: bytes) -> SentencePieceModel:
    """Reads the pieces, specials and normalizer of a serialized `ModelProto`."""
    pieces, normalizer, trainer = [], b"", {}
    try:
        for number, value in _fields(data):
            if number == 1:
                entry = Piece("")
                for field, item in _fields(value):
                    if field == 1:
                        entry.piece = item.decode("utf-8")
                    elif field == 2:
                        entry.score = struct.unpack("<f", item)[0]
                    elif field == 3:
                        entry.type = item
                pieces.append(entry)
            elif number == 2:
                trainer = {field: item for field, item in _fields(value)}
            elif number == 3:
                normalizer = value
    except (IndexError, struct.error, UnicodeDecodeError) as error:
        raise ValueError(f"not a SentencePiece model ({error})") from None
    if not pieces:
        raise ValueError("not a SentencePiece model: no pieces")
    names = {}
    for number, key in ((45, "unk_piece"), (46, "bos_piece"), (47, "eos_piece"),
                        (48, "pad_piece")):
        if number in trainer:
            names[key] = trainer[number].decode("utf-8")
    ids = {40: "unk_piece", 41: "bos_piece", 42: "eos_piece", 43: "pad_piece"}
    for number, key in ids.items():
        if key not in names and number in trainer:
            index = _signed(trainer[number])
            names[key] = pieces[index].piece if 0 <= index < len(pieces) else ""
    return SentencePieceModel(pieces, normalizer, byte_fallback=bool(trainer.get(35, 0)),
                              **names)


def normalizer_spec_from_map(norm_map: dict[int, Sequence[int]], name: str) -> bytes:
    """A serialized `NormalizerSpec` whose precompiled charsmap applies `norm_map`.

    `norm_map` maps a code point to its replacement code points (empty:
    deleted). sentencepiece compiles the map into its double-array trie;
    whitespace handling is XLM-R's: a dummy prefix, extra whitespace removed,
    spaces escaped as U+2581.
    """
    if not norm_map:  # identity: no charsmap, XLM-R's whitespace handling
        return bytes(_field_bytes(1, name.encode("utf-8")) + _field_varint(3, 1)
                     + _field_varint(4, 1) + _field_varint(5, 1))
    lines = []
    for code_point, replacement in sorted(norm_map.items()):
        hexes = " ".join(f"{c:X}" for c in replacement)
        lines.append(f"{code_point:X}\t{hexes}")
    with tempfile.NamedTemporaryFile("w", suffix=".tsv", delete=False, encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
        rules = f.name
    try:
        normalizer = sentencepiece.SentencePieceNormalizer(
            rule_tsv=rules, add_dummy_prefix=True, escape_whitespaces=True,
            remove_extra_whitespaces=True)
        spec = normalizer.serialized_normalizer_spec()
    finally:
        os.unlink(rules)
    # The compiled spec is named after the rule file and records its path: the
    # rule set's name instead, and no path.
    return _field_bytes(1, name.encode("utf-8")) + without_rule_file(spec, drop=(1,))


# NormalizerSpec.normalization_rule_tsv: sentencepiece records there the path of
# the rule file it compiled (a build's /tmp/tmpXXXX.tsv), which nothing reads back.
_RULE_FILE = 6


def without_rule_file(spec: bytes, drop: Sequence[int] = ()) -> bytes:
    """A serialized `NormalizerSpec` without its rule-file path (and the fields
    `drop`), the rest as it was: a model or an export then carries no path of
    the machine that built it."""
    return b"".join(spec[start:end] for number, _, start, end in _field_spans(spec)
                    if number != _RULE_FILE and number not in drop)


def normalizer_settings(spec: bytes) -> dict:
    """Name and whitespace flags of a serialized `NormalizerSpec` (for reports)."""
    fields = dict(_fields(spec))
    return {"name": fields.get(1, b"").decode("utf-8"),
            "charsmap_bytes": len(fields.get(2, b"")),
            "add_dummy_prefix": bool(fields.get(3, 1)),
            "remove_extra_whitespaces": bool(fields.get(4, 1)),
            "escape_whitespaces": bool(fields.get(5, 1))}


# === Wire format ===

def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int32/int64 are 10-byte two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _tag(number: int, wire_type: int) -> bytes:
    return _varint((number << 3) | wire_type)


def _field_varint(number: int, value: int) -> bytes:
    return _tag(number, _VARINT) + _varint(value)


def _field_bytes(number: int, value: bytes) -> bytes:
    return _tag(number, _BYTES) + _varint(len(value)) + value


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _fields(data: bytes) -> Iterator[tuple[int, object]]:
    """(field number, value) of a serialized message: ints for varints, bytes
    for length-delimited and fixed-width fields."""
    for number, value, _, _ in _field_spans(data):
        yield number, value


def _field_spans(data: bytes) -> Iterator[tuple[int, object, int, int]]:
    """`_fields`, with where each field (its tag included) starts and ends."""
    position = 0
    while position < len(data):
        start = position
        key, position = _read_varint(data, position)
        number, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            value, position = _read_varint(data, position)
        elif wire_type == _BYTES:
            length, position = _read_varint(data, position)
            value = data[position:position + length]
            if len(value) != length:
                raise ValueError("truncated field")
            position += length
        elif wire_type == _FIXED32:
            value = data[position:position + 4]
            position += 4
        elif wire_type == _FIXED64:
            value = data[position:position + 8]
            position += 8
        else:
            raise ValueError(f"unsupported wire type {wire_type}")
        yield number, value, start, position

