"""The main job's stages after training (`lealla_tf.recipe.evaluations`): the
export's check sentences; Tatoeba dev of each model, a model embedded once for all
its pairs and its first pairs; the news set and mining skip what they have no
languages for."""

from conftest import TINY_PAIRS, OracleEmbedder

from lealla_tf.recipe.evaluations import check_sentences, evaluate_stage, mine_stage, news_stage
from lealla_tf.recipe.settings import RecipeConfig


def test_evaluation_embeds_a_model_once_for_all_its_pairs_and_its_first_pairs(
        tiny_tatoeba_dir):
    pairs = [p for ps in TINY_PAIRS.values() for p in ps]
    embedded = {"student": [], "teacher": []}

    def counting(name, embed):
        def run(strings):
            embedded[name].append(len(strings))
            return embed(strings)
        return run

    models = {"student": counting("student", OracleEmbedder(pairs, noise=1.2, seed=4)),
              "teacher": counting("teacher", OracleEmbedder(pairs))}
    loaded = type("Loaded", (), {"get": lambda self, path: models[path]})()
    results = evaluate_stage({"student": ("student", 0), "teacher": ("teacher", 2),
                              "student_first": ("student", 2)}, tiny_tatoeba_dir, loaded)
    assert list(results) == ["student", "teacher", "student_first"]
    # One pass each, each different text once: 20 and 16 sentences, whose English
    # sides repeat across the four languages.
    assert sum(embedded["student"]) == 13 and sum(embedded["teacher"]) == 10
    assert results["student_first"]["max_pairs"] == 2
    assert results["student_first"]["tatoeba/sentences"] == 16
    assert results["student"]["tatoeba/sentences"] == 20
    # The cut entry reports the speed of the pass it was cut from.
    assert (results["student_first"]["sentences_per_second"]
            == results["student"]["sentences_per_second"])


def test_without_languages_news_and_mining_load_no_model(tmp_path, tiny_vocab_file, capsys):
    class NoModels:
        def get(self, path):
            raise AssertionError(f"{path} loaded with nothing to evaluate")

    assert news_stage({"student": "export"}, str(tmp_path), [], tiny_vocab_file,
                      NoModels()) == {}
    data_dir = tmp_path / "data"
    (data_dir / "parallel").mkdir(parents=True)
    (data_dir / "parallel" / "deu-eng.tsv").write_text("Hund\tdog\n", encoding="utf-8")
    result = mine_stage(RecipeConfig(bucc_languages=["xho"]), data_dir, str(tmp_path / "sample"),
                        str(tmp_path / "bucc"), {"student": "export"}, str(tmp_path),
                        NoModels())
    assert result["languages"] == [] and result["results"] == {}
    assert "skipping xho: no xho-eng pairs" in capsys.readouterr().out
    assert not (tmp_path / "mined_examples.tsv").exists()


def test_the_export_is_checked_on_tatoeba_sentences_or_two_fixed_ones(tiny_tatoeba_dir,
                                                                      tmp_path):
    sentences = check_sentences(tiny_tatoeba_dir)  # no kab: deu, rus, cmn, fra, both sides
    assert len(sentences) == 2 * (3 + 2 + 2 + 3)
    assert "Der Hund ist nett." in sentences and "Собака хорошая." in sentences
    assert check_sentences(str(tmp_path)) == ["The dog is nice.", "Der Hund ist nett."]
