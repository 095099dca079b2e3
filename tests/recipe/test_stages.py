"""The main job's stages (`lealla_tf.recipe.stages`)."""

import collections
import dataclasses
import pathlib

import numpy as np
from conftest import write_pairs

from lealla_tf.parallel_corpus import find_parallel_files, sample_pairs
from lealla_tf.recipe.config import RecipeConfig
from lealla_tf.recipe.stages import student_loss_weights, train_config
from lealla_tf.train.data import LANGUAGE, pair_dataset

CORPUS = {"deu": 20000, "fra": 2000, "rus": 200}


def test_the_language_temperature_applies_once(tmp_path):
    """The sample gives each language n^alpha of it, and the students' stream
    draws languages as the sample holds them: the stream's language counts match
    n^alpha over the corpus (applied twice, they would be about n^(alpha^2),
    0.45 / 0.32 / 0.23 here instead of 0.57 / 0.29 / 0.14)."""
    for language, size in CORPUS.items():
        write_pairs(tmp_path / "parallel", language,
                    [(f"{language} {i}", f"english {i}") for i in range(size)])
    config = RecipeConfig(language_alpha=0.3, train_steps=10)
    sample = str(tmp_path / "sample")
    sample_pairs(find_parallel_files([str(tmp_path / "parallel")]), 600, sample,
                 alpha=config.language_alpha)
    train = train_config(config, pathlib.Path(tmp_path), {"tokenizer": "sentencepiece",
                                                         "multilingual": True},
                         "teacher", sample, config.objective, student_loss_weights(config),
                         in_step=True)
    data = dataclasses.replace(train.data, train_data=[sample], decontaminate=[])
    stream, info = pair_dataset(data, 64)
    drawn = collections.Counter(
        info["languages"][int(pair[LANGUAGE])] for pair in stream.take(3000).as_numpy_iterator())
    powers = {language: size ** config.language_alpha for language, size in CORPUS.items()}
    for language, power in powers.items():
        expected = power / sum(powers.values())
        assert abs(drawn[language] / 3000 - expected) < 0.03, (language, drawn, expected)
    assert np.isclose(train.data.language_alpha, 1.0)


def test_the_sample_counts_every_line_it_skips(tmp_path, tiny_tatoeba_dir, capsys):
    """Lines with no tab, a third column or bytes that are not UTF-8 are skipped
    and counted by kind; the stage's summary and log say so."""
    import shutil

    from lealla_tf.recipe.stages import sample_stage

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


def test_the_students_train_without_dropout_unless_asked():
    """The recipe's students run at `RecipeConfig.dropout` (0), not the preset's 0.1;
    --encoder_overrides still wins."""
    teacher = {"tokenizer": "sentencepiece", "multilingual": True}

    def dropout(**changes):
        config = RecipeConfig(train_steps=10, **changes)
        return train_config(config, pathlib.Path("data"), teacher, "teacher", "sample",
                            config.objective, student_loss_weights(config), True).encoder.dropout

    assert dropout() == 0.0
    assert dropout(dropout=0.2) == 0.2
    assert dropout(encoder_overrides={"dropout": 0.05}) == 0.05


def test_the_schedule_clip_and_ams_flags_reach_the_students_config():
    from lealla_tf.cli.recipe import build_parser, config_from_args

    config = config_from_args(build_parser().parse_args(
        ["--decay_fraction=0.2", "--clip_norm=0", "--scale=50", "--margin=0.2",
         "--train_steps=100"]))
    train = train_config(config, pathlib.Path("data"), {"tokenizer": "sentencepiece",
                                                       "multilingual": True},
                         "teacher", "sample", config.objective, student_loss_weights(config))
    assert (train.optimizer.decay_fraction, train.optimizer.clip_norm) == (0.2, 0.0)
    assert (train.loss.scale, train.loss.margin) == (50.0, 0.2)
    defaults = train_config(RecipeConfig(train_steps=100), pathlib.Path("data"),
                            {"tokenizer": "sentencepiece", "multilingual": True}, "teacher",
                            "sample", "lealla+hd", student_loss_weights(RecipeConfig()))
    assert (defaults.optimizer.decay_fraction, defaults.optimizer.clip_norm) == (1.0, 1.0)
    assert (defaults.loss.scale, defaults.loss.margin) == (100.0, 0.3)
