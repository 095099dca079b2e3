"""`lealla-vocab` (`lealla_tf.cli.vocab`): the vocabulary and its report written;
every fault (no pairs, corrupt or binary input, an output that cannot be written,
a size below the characters) one line, before anything is learned."""

import json

import pytest
from conftest import assert_one_line_error

from lealla_tf.cli.vocab import main
from lealla_tf.tokenizers import vocabulary
from lealla_tf.tokenizers.tokenizer import read_wordpiece_vocabulary


def test_cli_writes_vocabulary_and_report(tiny_parallel_dir, tiny_tatoeba_dir, tmp_path, capsys):
    output = str(tmp_path / "vocab.txt")
    assert main([f"--input={tiny_parallel_dir}", "--vocab_size=150", f"--output={output}",
                 f"--tatoeba_dir={tiny_tatoeba_dir}"]) == 0
    out = capsys.readouterr().out
    assert "Learned a wordpiece vocabulary" in out and "average" in out
    report = json.loads((tmp_path / "vocab.report.json").read_text())
    assert report["vocab_size"] == len(read_wordpiece_vocabulary(output))
    assert "unk_rate" in report["tatoeba"]["average"]
    assert main([f"--input={tmp_path / 'absent'}", "--vocab_size=150",
                 f"--output={output}"]) == 2
    with pytest.raises(SystemExit):
        main([f"--input={tiny_parallel_dir}", "--vocab_size=3", f"--output={output}"])


def test_vocab_faults(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "deu-eng.tsv").write_text("only one column\n")
    out = str(tmp_path / "v.txt")
    assert_one_line_error(capsys, main([f"--input={tmp_path / 'd'}", "--vocab_size=100",
                                        f"--output={out}"]), "no well-formed pairs")
    # SentencePiece used to end in its own RuntimeError here.
    assert_one_line_error(capsys, main([f"--input={tmp_path / 'd'}", "--vocab_size=100",
                                        "--sentencepiece", f"--output={tmp_path / 'sp.model'}"]),
                          "no well-formed pairs", "deu-eng.tsv")
    (tmp_path / "d" / "deu-eng.tsv").unlink()
    (tmp_path / "d" / "fra-eng.tsv.gz").write_bytes(b"\x1f\x8b\x08\x00garbage" * 10)
    assert_one_line_error(capsys, main([f"--input={tmp_path / 'd'}", "--vocab_size=100",
                                        f"--output={out}"]), "fra-eng.tsv.gz")


def test_vocab_outputs_sizes_and_binary_inputs(tmp_path, capsys, monkeypatch):
    """A directory --output failed after the vocabulary was learned; a --vocab_size
    below the character count and a binary --input ended in SentencePiece's
    RuntimeError traceback."""

    data = tmp_path / "d"
    data.mkdir()
    (data / "deu-eng.tsv").write_text("Der Hund ist nett.\tThe dog is nice.\n"
                                      "Die Katze ist groß.\tThe cat is big.\n" * 3)
    (tmp_path / "out").mkdir()
    (tmp_path / "sp.model").mkdir()
    with monkeypatch.context() as patched:
        for name in ("count_words", "read_sentences"):
            patched.setattr(vocabulary, name, lambda *_, **__: pytest.fail("learned first"))
        for args, needles in (
                ([f"--output={tmp_path / 'out'}"], [f"--output={tmp_path / 'out'}",
                                                     "is a directory"]),
                ([f"--output={tmp_path / 'sp'}", "--sentencepiece"],
                 [f"--output={tmp_path / 'sp'}: {tmp_path / 'sp.model'} is a directory"]),
                ([f"--output={tmp_path / 'v.txt'}", f"--report_json={tmp_path / 'out'}"],
                 ["--report_json", "is a directory"])):
            assert_one_line_error(capsys, main([f"--input={data}", "--vocab_size=100", *args]),
                                  *needles)
    for extra in ([], ["--sentencepiece"]):
        assert_one_line_error(capsys, main([f"--input={data}", "--vocab_size=12", *extra,
                                            f"--output={tmp_path / 'small.model'}"]),
                              "--vocab_size=12 is below the", "characters",
                              "--character_coverage")
    binary = tmp_path / "binary"
    binary.mkdir()
    (binary / "fra-eng.tsv").write_bytes(bytes(range(256)) * 64)
    for given in (binary, "/bin/ls"):
        for extra in ([], ["--sentencepiece"]):
            assert_one_line_error(capsys, main([f"--input={given}", "--vocab_size=1000", *extra,
                                                f"--output={tmp_path / 'b.model'}"]),
                                  "is a binary file, not text")
    assert not list(tmp_path.glob("small*")) and not list(tmp_path.glob("b.*"))
