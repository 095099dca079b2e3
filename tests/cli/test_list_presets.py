"""`lealla-presets` (`lealla_tf.cli.list_presets`): the preset table on stdout."""

import pytest

from lealla_tf.cli.list_presets import main
from lealla_tf.models.presets import PRESETS, count_parameters

RELEASED = {"lealla_small": 68_988_672, "lealla_base": 107_034_240,
            "lealla_large": 147_447_296, "labse": 470_926_848}


def test_every_preset_is_printed_with_its_exact_count(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for name in PRESETS:
        assert name in out
    for count in RELEASED.values():
        assert f"{count:,}" in out
    assert main(["--vocabulary_size", "64000"]) == 0
    out = capsys.readouterr().out
    small = PRESETS["lealla_small"].encoder.replace(vocabulary_size=64000)
    assert "64,000-token vocabulary" in out and f"{count_parameters(small):,}" in out


@pytest.mark.parametrize("size", ["0", "-5"])
def test_a_vocabulary_size_below_one_is_one_line(size, capsys):
    with pytest.raises(SystemExit) as exited:
        main([f"--vocabulary_size={size}"])
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "--vocabulary_size must be positive" in error
