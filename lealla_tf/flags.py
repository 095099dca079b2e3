"""The command lines' shared parsing: one-line flag errors, defaults in --help,
`name=value,...` flags.

May import: lealla_tf.configs.
"""

import argparse
import dataclasses


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose flag mistakes are one line on stderr, `error: ...`, exit 2
    (argparse's own prints the whole usage first), and that takes no abbreviated
    flag: argparse's default would run `--time_budget_minute=5` (a typo) as
    `--time_budget_minutes=5`, or a prefix shared by two flags as an error only
    until a third is added."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter,
                    argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every flag's default in --help."""


def parse_assignments(text: str, flag: str) -> dict:
    """`a=1,b=x` -> {"a": "1", "b": "x"}; ValueError naming the flag otherwise."""
    values = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{flag} item {item!r} is not name=value")
        values[name.strip()] = value.strip()
    return values


def parse_weights(text: str) -> dict:
    """--loss_weights: term=float pairs."""
    weights = {}
    for name, value in parse_assignments(text, "--loss_weights").items():
        try:
            weights[name] = float(value)
        except ValueError:
            raise ValueError(f"--loss_weights: {name}={value!r} is not a number") from None
    return weights


def parse_overrides(text: str) -> dict:
    """--encoder_overrides: `a=1,b=none` -> {"a": 1, "b": None} (ints, floats, none, strings)."""
    from lealla_tf.configs import EncoderConfig

    def convert(value):
        if value.lower() == "none":
            return None
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
        return value

    overrides = {name: convert(value)
                 for name, value in parse_assignments(text, "--encoder_overrides").items()}
    fields = {f.name for f in dataclasses.fields(EncoderConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"--encoder_overrides: unknown fields {unknown}; valid: "
                         f"{', '.join(sorted(fields - {'vocabulary_size'}))}")
    return overrides
