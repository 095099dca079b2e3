"""The command lines' shared parsing: one-line flag errors, defaults in --help,
`name=value,...` flags.

May import: lealla_tf.configs.
"""

import argparse
import dataclasses

from lealla_tf.configs import EncoderConfig


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose flag mistakes are one line on stderr, `error: ...`, exit 2
    (argparse's own prints the whole usage first), and that takes no abbreviated
    flag: argparse's default would run `--time_budget_minute=5` (a typo) as
    `--time_budget_minutes=5`, or a prefix shared by two flags as an error only
    until a third is added."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        if _program_name:  # run as a console script: its usage names the script
            kwargs["prog"] = _program_name
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        """A flag without help still shows its default (or that it is required)
        in --help: argparse lists a flag with no help text bare."""
        if args and args[0].startswith("-") and not kwargs.get("help") and \
                kwargs.get("action") not in ("help", "version"):
            kwargs["help"] = "(required)" if kwargs.get("required") else "(default: %(default)s)"
        return super().add_argument(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


_program_name = None


def use_program_name(name) -> None:
    """Command lines parsed from now on name themselves `name` in usage and
    errors (the console script that runs them); None: their own names."""
    global _program_name
    _program_name = name


class HelpFormatter(argparse.RawDescriptionHelpFormatter,
                    argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every flag's default in --help
    (once: a help text that states its default already keeps its own words)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.required:
            return text if "required" in text.lower() else f"{text} (required)"
        if "default" in text.lower():
            return text
        return super()._get_help_string(action)


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
