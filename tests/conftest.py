"""Shared fixtures. Everything a test needs is built here, never downloaded.

The one place test modules share from: pytest hands these fixtures to every
folder below tests/, and plain helpers and constants are imported with
`from conftest import ...`; no test module imports another
(tests/test_architecture.py checks).

Environment is set before TensorFlow is imported: quiet logs, no CUDA probing,
Keras' config kept inside the workspace, and two logical CPU devices so that
tf.distribute tests can run MirroredStrategy on one machine (this must happen
before any TensorFlow op runs).
"""

import gzip
import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
os.environ.setdefault("KERAS_HOME", str(REPO_ROOT / ".keras"))

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)

SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def float32_after_each_test():
    """A test that builds a bfloat16 trainer (build_trainer sets Keras' global
    dtype policy) leaves float32 to the next: one test's policy never decides
    another's numbers."""
    yield
    import keras

    keras.mixed_precision.set_dtype_policy("float32")

# A tiny cased WordPiece vocabulary: specials deliberately NOT at 0..3 so that
# code that hard-codes BERT's ids fails.
TINY_WORDS = [
    "the", "dog", "cat", "is", "nice", "Puppies", "are", "a", "house", "big",
    "der", "Hund", "ist", "die", "Katze", "le", "chien", "est", "gentil", ".", ",",
    "!", "?", "狗", "猫", "собака",
]
TINY_CHARACTERS = sorted(set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"))


def tiny_vocabulary():
    vocabulary = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + TINY_WORDS
    vocabulary += TINY_CHARACTERS + ["##" + c for c in TINY_CHARACTERS] + ["##ies"]
    return list(dict.fromkeys(vocabulary))


@pytest.fixture(scope="session")
def tiny_vocab_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "cased_vocab.txt"
    path.write_text("\n".join(tiny_vocabulary()) + "\n", encoding="utf-8")
    return str(path)


TINY_PAIRS = {
    "deu": [("Der Hund ist nett.", "The dog is nice."),
            ("Die Katze ist groß.", "The cat is big."),
            ("Das Haus ist alt.", "The house is old.")],
    "fra": [("Le chien est gentil.", "The dog is nice."),
            ("Le chat est grand.", "The cat is big."),
            ("La maison est vieille.", "The house is old.")],
    "rus": [("Собака хорошая.", "The dog is nice."),
            ("Кошка большая.", "The cat is big.")],
    "cmn": [("狗很好。", "The dog is nice."), ("猫很大。", "The cat is big.")],
}


def write_pairs(directory, language, pairs, gz=True):
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = "".join(f"{src}\t{eng}\n" for src, eng in pairs).encode("utf-8")
    if gz:
        path = directory / f"{language}-eng.tsv.gz"
        path.write_bytes(gzip.compress(data))
    else:
        path = directory / f"{language}-eng.tsv"
        path.write_bytes(data)
    return str(path)


@pytest.fixture(scope="session")
def tiny_parallel_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("parallel")
    for i, (language, pairs) in enumerate(TINY_PAIRS.items()):
        write_pairs(root / ("corpus_a" if i % 2 else "corpus_b"), language, pairs * 20)
    (root / "COUNTS.tsv").write_text("file\tpairs\nx\t1\n")
    return str(root)


@pytest.fixture(scope="session")
def tiny_tatoeba_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tatoeba")
    for language, pairs in TINY_PAIRS.items():
        (root / f"tatoeba.{language}-eng.{language}").write_text(
            "".join(src + "\n" for src, _ in pairs), encoding="utf-8")
        (root / f"tatoeba.{language}-eng.eng").write_text(
            "".join(eng + "\n" for _, eng in pairs), encoding="utf-8")
    return str(root)


@pytest.fixture(scope="session")
def shared_data():
    """../shared/data, or skip the test cleanly when it is not on this machine."""
    if not (SHARED_DATA / "tatoeba_dev").is_dir():
        pytest.skip(f"real data not present at {SHARED_DATA}")
    return SHARED_DATA


def multilingual_sentences(per_language=4):
    """Real sentences from ../shared/data/tatoeba_dev when present (both sides,
    every language), else the fixture pairs; always with the bad inputs."""
    from lealla_tf.parallel_corpus import find_tatoeba_languages, read_tatoeba

    sentences = []
    tatoeba = SHARED_DATA / "tatoeba_dev"
    if tatoeba.is_dir():
        for language in find_tatoeba_languages(str(tatoeba)):
            source, english = read_tatoeba(str(tatoeba), language)
            sentences += source[:per_language] + english[:1]
    else:
        sentences = [s for pairs in TINY_PAIRS.values() for pair in pairs for s in pair]
        sentences += generated_sentences(per_language)
    return [s.encode("utf-8") for s in sentences]


# Letters of a few scripts, for sentences made up when ../shared/data is absent.
GENERATED_SCRIPTS = {
    "latin": "aeioubcdfghklmnprstvwzäöüéèñç",
    "cyrillic": "аеиоуыбвгдзклмнпрстфхцчшщ",
    "greek": "αεηιουωβγδζθκλμνξπρστφχψ",
    "devanagari": "कखगघचछजझटठडढतथदधनपफबभमयरलवशसह",
    "arabic": "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "han": (
        "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着"
        "去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主"
        "行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二"
        "理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走"
        "电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市"
        "眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提"
        "感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它"
        "许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青"
        "管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步"
        "完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持"
        "取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯"
        "专石若兵弟谁校读志飞观争究包组造落视济喜离虽坐集编宝谈府拉黑且随格尽剑讲布杀微怕"
        "母调局根曾准团段终乐切级克精哪官示冷域读"),
}


def generated_sentences(per_language):
    """`per_language` made-up sentences in each script of GENERATED_SCRIPTS, the
    same on every run: words of 2-7 letters (1-3 characters without spaces in
    Han), 3-9 words a sentence."""
    import random

    rng = random.Random(1234)
    sentences = []
    for script, letters in GENERATED_SCRIPTS.items():
        for _ in range(per_language):
            if script == "han":
                words = ["".join(rng.choice(letters) for _ in range(rng.randint(1, 3)))
                         for _ in range(rng.randint(3, 9))]
                sentences.append("".join(words) + "。")
            else:
                words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7)))
                         for _ in range(rng.randint(3, 9))]
                sentences.append(" ".join(words).capitalize() + ".")
    return sentences


@pytest.fixture(scope="session")
def sentence_vocab_file(tmp_path_factory):
    """A real WordPiece vocabulary learned (by lealla_tf.cli.vocab) from the same
    sentences the export tests embed, so tokenization is realistic."""
    from lealla_tf.tokenizers.vocabulary import build_vocabulary

    root = tmp_path_factory.mktemp("sentence_vocab")
    sentences = [s.decode("utf-8") for s in multilingual_sentences(per_language=200)]
    write_pairs(root / "data", "mul", [(s, s) for s in sentences])
    output = str(root / "vocab.txt")
    build_vocabulary([str(root / "data")], vocab_size=8000, output=output, progress=False)
    return output


@pytest.fixture(scope="module")
def tokenizer(sentence_vocab_file):
    """The tokenizer of `sentence_vocab_file` (a module may define its own)."""
    from lealla_tf.tokenizers.tokenizer import Tokenizer

    return Tokenizer(sentence_vocab_file, max_seq_length=16)


@pytest.fixture(scope="module")
def encoder(tokenizer):
    """A one-layer encoder over `tokenizer`'s vocabulary."""
    from lealla_tf.configs import EncoderConfig
    from lealla_tf.models.encoder import build_encoder

    return build_encoder(EncoderConfig(vocabulary_size=tokenizer.vocab_size, num_layers=1,
                                       num_heads=2, hidden_dim=8, intermediate_dim=16))


# === Shared by several test modules: no test module imports another ===

def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-c", ""])
    process.wait()
    return process.pid


def assert_one_line_stderr(code, stderr, *needles):
    """Exit code 2 and ONE line on stderr, `error: ...`, holding every needle; no
    traceback (the command lines' convention, tests/cli/)."""
    import re

    assert code == 2, stderr[-2000:]
    # Progress (bars, lines, steps) and TensorFlow's own log lines aside, stderr is one line.
    lines = [line for line in stderr.replace("\r", "\n").splitlines() if line.strip()
             and not line.startswith(("WARNING", "I0000", "W0000", "mine_bitext: "))
             and not re.search(r"\d+%\||\[\d+:\d\d[<,\]]", line)]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "Traceback" not in stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def assert_one_line_error(capsys, code, *needles):
    """`assert_one_line_stderr` of what a command line's `main` printed (capsys)."""
    assert_one_line_stderr(code, capsys.readouterr().err, *needles)


@pytest.fixture(scope="module")
def exported_model(tmp_path_factory, sentence_vocab_file):
    """A one-layer model directory and its LEALLA-format export:
    {"model_dir": path, "export": path}, for the command lines to read."""
    from lealla_tf.configs import EncoderConfig, TokenizerConfig
    from lealla_tf.inference.formats import export_lealla_model
    from lealla_tf.models.encoder import build_encoder
    from lealla_tf.models.model_dir import save_encoder_checkpoint, write_model_config
    from lealla_tf.tokenizers.tokenizer import Tokenizer

    root = tmp_path_factory.mktemp("exported")
    tokenizer = Tokenizer(sentence_vocab_file)
    encoder = build_encoder(EncoderConfig(vocabulary_size=tokenizer.vocab_size, num_layers=1,
                                          num_heads=2, hidden_dim=8, intermediate_dim=8,
                                          pooling="mean"))
    write_model_config(str(root / "model"), encoder.encoder_config,
                       TokenizerConfig(max_seq_length=16), source_vocab_file=sentence_vocab_file)
    save_encoder_checkpoint(str(root / "model"), encoder)
    return {"model_dir": str(root / "model"),
            "export": export_lealla_model(encoder, tokenizer, str(root / "export"))}


# Inputs a tokenizer (and every model that embeds through one) must survive.
BAD_INPUTS = {
    "empty": b"",
    "whitespace_only": b"  \t \n  ",
    "ten_thousand_characters": ("the dog is nice " * 625).encode(),
    "ten_thousand_letters_one_word": b"a" * 10_000,
    "mixed_scripts": "The dog 狗 собака 犬 الكلب कुत्ता".encode(),
    "emoji": "dog 🐶🐕‍🦺 👍🏽".encode(),
    "control_characters": b"dog\x00\x01\x07\x1b[31m cat\x7f\r\n",
    "invalid_utf8": b"\xff\xfe dog \xc3\x28 \xa0\xa1 cat \xe2\x82",
    "lone_surrogate_bytes": b"\xed\xa0\x80 dog",
}


class OracleEmbedder:
    """Maps each known sentence of a pair to the pair's random vector (plus
    optional noise): the evaluator under test must recover exactly the gold
    alignment, so any id, threshold or scoring mistake shows."""

    def __init__(self, pairs, dimension=24, noise=0.0, seed=0):
        import numpy as np

        rng = np.random.default_rng(seed)
        self.vectors = {}
        for source, english in pairs:
            # Keyed by the English side: one English sentence paired with several
            # languages keeps one vector, and each translation lands near it.
            if english not in self.vectors:
                self.vectors[english] = rng.normal(size=dimension)
            self.vectors.setdefault(
                source, self.vectors[english] + noise * rng.normal(size=dimension))
        self.dimension = dimension
        self._rng = rng

    def __call__(self, strings):
        import numpy as np

        rows = []
        for s in strings.numpy():
            text = s.decode("utf-8")
            if text not in self.vectors:
                self.vectors[text] = self._rng.normal(size=self.dimension)
            rows.append(self.vectors[text])
        return np.asarray(rows, np.float32)


# --- Training: tiny configs, records with teacher vectors, a converted teacher ---

def training_environment():
    """The environment of a training subprocess: quiet, CPU only, deterministic ops,
    unbuffered output."""
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="-1",
                TF_DETERMINISTIC_OPS="1", PYTHONUNBUFFERED="1")


TEACHER_DIM = 6


@pytest.fixture(scope="module")
def teacher_records(tmp_path_factory):
    """TFRecord pairs with precomputed (random but fixed) teacher vectors."""
    import numpy as np

    from lealla_tf.train.data import write_pairs_tfrecord

    root = tmp_path_factory.mktemp("records")
    rng = np.random.default_rng(0)
    for language, pairs in TINY_PAIRS.items():
        pairs = pairs * 6
        write_pairs_tfrecord(str(root / f"{language}-eng-00000-of-00001.tfrecord"), pairs,
                             rng.normal(size=(len(pairs), TEACHER_DIM)),
                             rng.normal(size=(len(pairs), TEACHER_DIM)))
    return str(root)


def tiny_config(tokenizer_size, data, objective="ams+fd+ld", **changes):
    from lealla_tf.configs import (
        DataConfig,
        EncoderConfig,
        LossConfig,
        OptimizerConfig,
        TokenizerConfig,
        TrainConfig,
    )

    config = TrainConfig(
        preset="lealla_small",
        encoder=EncoderConfig(vocabulary_size=tokenizer_size, num_layers=2, num_heads=2,
                              hidden_dim=8, intermediate_dim=16, dropout=0.0),
        tokenizer=TokenizerConfig(max_seq_length=16),
        data=DataConfig([data], shuffle_buffer=50),
        loss=LossConfig(objective=objective, scale=20.0),
        optimizer=OptimizerConfig(learning_rate=1e-3, warmup_steps=2),
        global_batch_size=8, train_steps=3, checkpoint_every=100, log_every=1)
    for key, value in changes.items():
        setattr(config, key, value)
    return config


def vocab_size(path):
    with open(path, encoding="utf-8") as f:
        return len(f.read().split("\n")) - 1


def Trainer(config, model_dir, strategy, vocab_file, progress=True):
    from lealla_tf.train.launch import build_trainer

    return build_trainer(config, model_dir, vocab_file, strategy, progress)


TEACHER_WIDTH, TEACHER_LAYERS = 16, 2
SPECIAL_PIECES = ["<s>", "<pad>", "</s>", "<unk>"]


def teacher_pieces_for(student):
    """XLM-R's special pieces, then a piece for every student WordPiece token
    (`match_rows`'s rules)."""
    from lealla_tf.teachers.selection import WORD_START

    pieces = [t[2:] if t.startswith("##") else WORD_START + t for t in student]
    return SPECIAL_PIECES + list(dict.fromkeys(pieces))


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, tiny_vocab_file):
    """A converted-teacher directory: a tiny random BERT and a SentencePiece vocabulary
    holding every piece of the tiny WordPiece vocabulary."""
    import numpy as np

    from lealla_tf.configs import EncoderConfig
    from lealla_tf.inference.formats import export_labse_pair
    from lealla_tf.models.encoder import build_encoder
    from lealla_tf.teachers.conversion import SENTENCEPIECE_FILE
    from lealla_tf.tokenizers import sentencepiece_model as spm_model
    from lealla_tf.tokenizers.tokenizer import Tokenizer

    pieces = teacher_pieces_for(tiny_vocabulary())
    encoder = build_encoder(EncoderConfig(
        vocabulary_size=len(pieces), num_layers=TEACHER_LAYERS, num_heads=4,
        hidden_dim=TEACHER_WIDTH, intermediate_dim=32, max_sequence_length=24,
        pooling="mean", dropout=0.0, hidden_activation="gelu"), name="teacher_encoder")
    rng = np.random.default_rng(1)
    for weight in encoder.weights:
        weight.assign(rng.normal(scale=0.2, size=weight.shape).astype(np.float32))
    directory = tmp_path_factory.mktemp("teacher")
    export_labse_pair(encoder, Tokenizer(tiny_vocab_file, max_seq_length=16), str(directory))
    spec = spm_model.normalizer_spec_from_map({}, "identity")
    model = spm_model.SentencePieceModel(
        [spm_model.Piece(p, 0, spm_model.CONTROL) for p in SPECIAL_PIECES[:3]]
        + [spm_model.Piece("<unk>", 0, spm_model.UNKNOWN)]
        + [spm_model.Piece(p, -1.0) for p in pieces[len(SPECIAL_PIECES):]], spec)
    (directory / SENTENCEPIECE_FILE).write_bytes(model.serialize())
    return str(directory), encoder, pieces


# --- The corpus pipelines (embed_corpus, mine_bitext) ---

CORPUS_SENTENCES = [
    "The dog is nice.", "Der Hund ist nett.", "Le chien est gentil.", "狗很好。",
    "Собака хорошая.", "I like tea.", "A much longer sentence about houses and cats."]


@pytest.fixture(scope="module")
def corpus_model(tmp_path_factory, sentence_vocab_file):
    """An exported one-layer LEALLA model (its path) and each of CORPUS_SENTENCES'
    vectors as the encoder computes them."""
    from lealla_tf.configs import EncoderConfig
    from lealla_tf.inference.formats import export_lealla_model
    from lealla_tf.models.encoder import build_encoder
    from lealla_tf.tokenizers.tokenizer import Tokenizer

    tokenizer = Tokenizer(sentence_vocab_file)
    # Mean pooling spreads a random encoder's sentences apart (CLS-pooled ones sit at
    # cosine ~0.999), so identical sentences are each other's clear nearest neighbour.
    encoder = build_encoder(EncoderConfig(vocabulary_size=tokenizer.vocab_size, num_layers=1,
                                          num_heads=2, hidden_dim=16, intermediate_dim=16,
                                          pooling="mean"))
    path = str(tmp_path_factory.mktemp("model") / "lealla")
    export_lealla_model(encoder, tokenizer, path)
    reference = {s: v for s, v in zip(CORPUS_SENTENCES, encoder(tokenizer(tf.constant(
        CORPUS_SENTENCES)))["sentence_embedding"].numpy())}
    return path, reference


@pytest.fixture(scope="module")
def dask_cluster():
    """A dask.distributed cluster of two worker processes on 127.0.0.1."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       host="127.0.0.1", dashboard_address=None)
    yield cluster
    cluster.close()


def write_embedding_output(directory, vectors, shards=3, prefix="s", texts=None, ids=None):
    """An embed_corpus-style output (manifest, gzip'd TFRecord shards) of `vectors`,
    with ids `<prefix>:<row>` and texts `text <prefix> <row>` (or the given
    `ids` / `texts`, one a row), rows dealt to shards."""
    from lealla_tf.mining.run_folders import commit_run, new_run_directory
    from lealla_tf.records import embedding_example, write_tfrecord

    os.makedirs(directory, exist_ok=True)
    run_dir = new_run_directory(str(directory))
    os.makedirs(run_dir)
    files = []
    for shard in range(shards):
        path = os.path.join(run_dir, f"embeddings-{shard:05d}-of-{shards:05d}.tfrecord.gz")
        with gzip.open(path, "wb") as handle:
            for row in range(shard, len(vectors), shards):
                write_tfrecord(handle, embedding_example(
                    ids[row] if ids else f"{prefix}:{row}", vectors[row],
                    text=texts[row] if texts else f"text {prefix} {row}"))
        files.append(path)
    commit_run(str(directory), run_dir, files)


def spread_encoder(tokenizer):
    """A one-layer mean-pooled encoder whose random (unit-scale) token table keeps
    different sentences apart, as a trained one does: a freshly initialised one's
    0.02-scale table leaves every sentence at one point."""
    import numpy as np

    from lealla_tf.configs import EncoderConfig
    from lealla_tf.models.encoder import build_encoder

    encoder = build_encoder(EncoderConfig(
        vocabulary_size=tokenizer.vocab_size, num_layers=1, num_heads=2, hidden_dim=16,
        intermediate_dim=32, dropout=0.0, pooling="mean"))
    table = encoder.token_embedding.embeddings
    table.assign(np.random.default_rng(0).normal(size=table.shape).astype("float32"))
    return encoder


def collapse(weights) -> None:
    """Every layer norm's scale at 0: every sentence gets the same vector."""
    import tensorflow as tf

    for weight in weights:
        if "gamma" in weight.path:
            weight.assign(tf.zeros_like(weight))


@pytest.fixture(scope="session")
def sentencepiece_export(tmp_path_factory):
    """A tiny LEALLA-format export whose tokenizer is a SentencePiece model, as the
    student `make main` exports: its graph calls tensorflow_text's ops (a process
    must have imported them to load it), and loading it runs the tokenizer's
    restored resource functions."""
    from lealla_tf.configs import EncoderConfig
    from lealla_tf.inference.formats import export_lealla_model
    from lealla_tf.models.encoder import build_encoder
    from lealla_tf.tokenizers.tokenizer import Tokenizer
    from lealla_tf.tokenizers.vocabulary import learn_sentencepiece

    root = tmp_path_factory.mktemp("sentencepiece_export")
    sentences = [s.decode("utf-8") for s in multilingual_sentences()]
    tokenizer = Tokenizer(learn_sentencepiece(sentences * 3, 600, str(root / "vocab")))
    encoder = build_encoder(EncoderConfig(vocabulary_size=tokenizer.vocab_size, num_layers=1,
                                          num_heads=2, hidden_dim=16, intermediate_dim=16,
                                          pooling="mean"))
    return export_lealla_model(encoder, tokenizer, str(root / "lealla_small"))
