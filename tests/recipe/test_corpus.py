"""The main job's data stages (`lealla_tf.recipe.corpus`): the sample leaves out
every evaluation sentence and counts every line it skips; the news set is made
from NTREX, or skipped, said so, without one."""

import shutil

from conftest import TINY_PAIRS, write_pairs

from lealla_tf.parallel_corpus import read_pairs
from lealla_tf.recipe.corpus import news_set_stage, sample_stage
from lealla_tf.recipe.settings import RecipeConfig


def test_the_sample_counts_every_line_it_skips(tmp_path, tiny_tatoeba_dir, capsys):
    """Lines with no tab, a third column or bytes that are not UTF-8 are skipped
    and counted by kind; the stage's summary and log say so."""
    data_dir = tmp_path / "data"
    shutil.copytree(tiny_tatoeba_dir, data_dir / "tatoeba_dev")
    write_pairs(data_dir / "parallel", "deu", [(f"deu {i}", f"english {i}") for i in range(30)],
                gz=False)
    with open(data_dir / "parallel" / "deu-eng.tsv", "ab") as f:
        f.write(b"no tab\na\tb\tc\n\xff\tbad\n")
    summary = sample_stage(RecipeConfig(sample_pairs=100), data_dir, str(tmp_path / "sample"))
    assert summary["pairs"] == 30
    assert summary["lines"]["skipped_by_kind"] == {"no_tab": 1, "extra_columns": 1,
                                                   "not_utf8": 1}
    assert "3 lines skipped in 1 file" in capsys.readouterr().out


def test_the_sample_leaves_out_every_tatoeba_dev_sentence(tmp_path, tiny_tatoeba_dir, capsys):
    data_dir = tmp_path / "data"
    shutil.copytree(tiny_tatoeba_dir, data_dir / "tatoeba_dev")
    dev = [s for pairs in TINY_PAIRS.values() for pair in pairs for s in pair]
    pairs = [(f"Satz {i}.", f"Sentence {i}.") for i in range(20)] + TINY_PAIRS["deu"]
    write_pairs(data_dir / "parallel", "deu", pairs)
    write_pairs(data_dir / "parallel", "fra", [(f"Phrase {i}.", "The dog is nice.")
                                               for i in range(5)])
    summary = sample_stage(RecipeConfig(sample_pairs=100), data_dir, str(tmp_path / "sample"))
    sampled = [pair for path in (tmp_path / "sample").glob("*.tsv.gz")
               for pair in read_pairs(str(path))]
    # Every fra pair has a dev sentence on its English side.
    assert summary["pairs"] == len(sampled) == 20 and not summary["per_language"].get("fra")
    assert not {s for pair in sampled for s in pair} & set(dev)
    assert "20 pairs in" in capsys.readouterr().out


def test_without_ntrex_the_news_set_is_skipped_and_said_so(tmp_path, capsys):
    news = tmp_path / "news"
    news.mkdir()
    (news / "old_split.tsv").write_text("an earlier job's set")
    summary = news_set_stage(RecipeConfig(news_languages=["deu", "fra"]), tmp_path / "data",
                             str(news))
    assert summary == {"languages": [], "pairs": {}, "gold": {}, "missing": ["deu", "fra"]}
    assert not news.exists()  # no earlier set is left to be read as this one
    assert "the news evaluation is skipped" in capsys.readouterr().out
