"""The main job's data stages: the students' vocabulary (`vocabulary_stage`), the
language-balanced training sample (`sample_stage`) and the held-out news set
(`news_set_stage`), each a library call that returns a dict."""

import os
import shutil

from lealla_tf.evaluation.news import held_out_sentences, write_news_set
from lealla_tf.parallel_corpus import CorpusCounts, find_parallel_files, sample_pairs
from lealla_tf.recipe.settings import DEFAULT_WORDPIECE_SIZE, RecipeConfig
from lealla_tf.teachers.conversion import SENTENCEPIECE_FILE
from lealla_tf.tokenizers.pruning import prune_teacher_vocabulary
from lealla_tf.tokenizers.vocabulary import build_vocabulary, vocabulary_report
from lealla_tf.train.decontamination import evaluation_sentences


def vocabulary_stage(config: RecipeConfig, data_dir, teacher_dir: str, work: str) -> dict:
    parallel = [str(data_dir / "parallel")]
    if config.vocabulary == "teacher_pruned":
        teacher_model = os.path.join(teacher_dir, SENTENCEPIECE_FILE)
        if not os.path.exists(teacher_model):
            raise ValueError(f"--vocabulary=teacher_pruned needs a SentencePiece teacher; "
                             f"{config.teacher} has none (use --vocabulary=wordpiece)")
        summary = prune_teacher_vocabulary(teacher_model, parallel,
                                           os.path.join(work, "vocab.model"),
                                           max_pieces=config.vocab_size or None)
        print(f"{summary['pieces']:,} of the teacher's {summary['teacher_pieces']:,} pieces "
              f"({summary['characters_added']:,} characters added), covering "
              f"{100 * summary['weighted_token_coverage']:.2f}% of the corpus' tokens")
    else:
        summary = build_vocabulary(parallel, config.vocab_size or DEFAULT_WORDPIECE_SIZE,
                                   os.path.join(work, "vocab.txt"))
        summary["pieces"] = summary["vocab_size"]
    report = vocabulary_report(summary["output"], str(data_dir / "tatoeba_dev"))
    summary["tatoeba_dev_unk_rate"] = report["average"]["unk_rate"]
    summary["tatoeba_dev_tokens_per_sentence"] = report["average"]["tokens_per_sentence"]
    return summary


def sample_stage(config: RecipeConfig, data_dir, path: str) -> dict:
    excluded = set(evaluation_sentences([str(data_dir / "tatoeba_dev")]))
    if (data_dir / "parallel" / "ntrex").is_dir():  # the held-out news set
        excluded |= held_out_sentences(str(data_dir / "parallel" / "ntrex"))
    lines = CorpusCounts()
    counts = sample_pairs(find_parallel_files([str(data_dir / "parallel")]), config.sample_pairs,
                          path, alpha=config.language_alpha, seed=config.seed,
                          exclude=excluded, line_counts=lines)
    summary = {"pairs": sum(counts.values()), "languages": len(counts), "per_language": counts,
               "lines": lines.as_dict()}
    print(f"{summary['pairs']:,} pairs in {summary['languages']} languages")
    print(lines.describe())
    return summary


def news_set_stage(config: RecipeConfig, data_dir, path: str) -> dict:
    if os.path.exists(path):
        shutil.rmtree(path)
    if not (data_dir / "parallel" / "ntrex").is_dir():
        print(f"no {data_dir / 'parallel' / 'ntrex'}: the news evaluation is skipped")
        return {"languages": [], "pairs": {}, "gold": {}, "missing": list(config.news_languages)}
    summary = write_news_set(str(data_dir / "parallel" / "ntrex"), path, config.news_languages,
                             config.seed)
    print(f"{len(summary['languages'])} languages, "
          f"{sum(summary['pairs'].values()):,} held-out pairs; mining gold "
          + ", ".join(f"{lang} {g['test']}" for lang, g in summary["gold"].items()))
    if summary["missing"]:
        print(f"not in NTREX, skipped: {', '.join(summary['missing'])}")
    return summary
