"""The notebooks execute top to bottom and produce their plots, on every branch they
take: a notebook that looks for the student `make main` exported (through
NOTEBOOK_TRAINED_EXPORT, default runs/recipe/export/lealla_small) runs once without
one and once with one (a tiny real export made here), so what it needs to import
does not depend on what the user ran before."""

import json
import pathlib
import re

import pytest

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
EXPECTED = {"01_quickstart.ipynb": "01_similarity_heatmap.png",
            "02_train_a_student.ipynb": "02_training_curve.png",
            "03_mine_bitext.ipynb": "03_mining_curve.png"}
TRAINED_EXPORT_VARIABLE = "NOTEBOOK_TRAINED_EXPORT"


def notebook_code(name: str) -> str:
    cells = json.loads((NOTEBOOKS / name).read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")


def reads_trained_export(name: str) -> bool:
    return TRAINED_EXPORT_VARIABLE in notebook_code(name)


def cases():
    """(notebook, with a trained export?): both for a notebook that looks for one."""
    for name in sorted(EXPECTED):
        if not reads_trained_export(name):
            yield pytest.param(name, False, id=name)
            continue
        for trained in (False, True):
            yield pytest.param(name, trained,
                               id=f"{name}-{'' if trained else 'no_'}trained_export")


def test_notebooks_find_earlier_runs_only_through_the_variable():
    """A notebook that looks in runs/ (what `make main` wrote) does so through
    NOTEBOOK_TRAINED_EXPORT, so the test below runs it on both branches."""
    for name in EXPECTED:
        code = notebook_code(name)
        if '"runs"' in code or "runs/" in code:
            assert reads_trained_export(name), name
    assert {name for name in EXPECTED if reads_trained_export(name)} == {
        "01_quickstart.ipynb", "03_mine_bitext.ipynb"}


@pytest.mark.slow
@pytest.mark.parametrize("name,trained", list(cases()))
def test_notebook_runs_and_plots(name, trained, request, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    # Without a trained export: a path that is not one, whatever runs/ holds.
    export = request.getfixturevalue("sentencepiece_export") if trained else str(tmp_path / "none")
    monkeypatch.setenv(TRAINED_EXPORT_VARIABLE, export)
    monkeypatch.setenv("NOTEBOOK_OUTPUT_DIR", str(tmp_path))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as error:
        plain = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # the traceback's colours
        pytest.fail(f"{name} failed in a cell: {plain[-1500:]}")
    outputs = [o for cell in notebook.cells for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    plot = tmp_path / EXPECTED[name]
    assert plot.exists() and plot.stat().st_size > 10_000
    assert any(o.get("output_type") == "display_data" for o in outputs)
    if reads_trained_export(name):  # the branch it was meant to take
        printed = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
        assert (f"model: {export} (trained)" in printed) == trained, printed[-2000:]
