"""The command lines' shared parsing (`lealla_tf.flags`): a flag mistake is one line,
no flag is taken by an abbreviation, every flag shows its default, and the
`name=value,...` flags are parsed or refused naming the flag."""

import pytest

from lealla_tf.flags import (
    ArgumentParser,
    HelpFormatter,
    parse_overrides,
    parse_weights,
    use_program_name,
)


def parser():
    built = ArgumentParser(prog="tool", description="Does things.\n  kept as written",
                           formatter_class=HelpFormatter)
    built.add_argument("--time_budget_minutes", type=float, default=38.0)
    built.add_argument("--steps", type=int, default=0, help="0: planned (default: planned)")
    built.add_argument("--model_dir", required=True)
    return built


def test_a_flag_mistake_is_one_line_and_no_abbreviation_is_a_flag(capsys):
    for argv in (["--model_dir=m", "--time_budget_minute=5"], ["--model_dir=m", "--steps=x"]):
        with pytest.raises(SystemExit) as exited:
            parser().parse_args(argv)
        assert exited.value.code == 2
        error = capsys.readouterr().err
        assert error.startswith("error: ") and error.endswith("(see tool --help)\n")
        assert len(error.splitlines()) == 1
    assert parser().parse_args(["--model_dir=m"]).time_budget_minutes == 38.0


def test_help_gives_every_default_once_and_the_description_as_written():
    text = parser().format_help()
    assert "  kept as written" in text
    assert "(default: 38.0)" in text  # a flag without help text
    assert text.count("default: planned") == 1  # a help text that states its own
    assert "--model_dir MODEL_DIR\n" in text and "(required)" in text


def test_a_console_script_names_itself_in_usage():
    use_program_name("lealla-train")
    try:
        assert parser().prog == "lealla-train"
    finally:
        use_program_name(None)
    assert parser().prog == "tool"


def test_loss_weights_are_numbers_by_term():
    assert parse_weights("fd=1, ld=1e4,") == {"fd": 1.0, "ld": 1e4}
    assert parse_weights("") == {}
    with pytest.raises(ValueError, match=r"--loss_weights: fd='heavy' is not a number"):
        parse_weights("fd=heavy")
    with pytest.raises(ValueError, match=r"--loss_weights item 'fd' is not name=value"):
        parse_weights("fd")


def test_encoder_overrides_are_typed_and_only_encoder_fields():
    assert parse_overrides("num_layers=4,dropout=0.2,embedding_dim=None,pooling=mean") == {
        "num_layers": 4, "dropout": 0.2, "embedding_dim": None, "pooling": "mean"}
    with pytest.raises(ValueError, match=r"unknown fields \['layers'\]; valid: .*num_layers"):
        parse_overrides("layers=4")
