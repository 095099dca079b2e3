"""Shared fixtures. Everything a test needs is built here, never downloaded.

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
    "han": "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坐集编宝谈府拉黑且随格尽剑讲布杀微怕母调局根曾准团段终乐切级克精哪官示冷域读",
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
