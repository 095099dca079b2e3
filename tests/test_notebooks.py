"""The notebooks execute top to bottom and produce their plots."""

import pathlib

import pytest

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
EXPECTED = {"01_quickstart.ipynb": "01_similarity_heatmap.png",
            "02_train_a_student.ipynb": "02_training_curve.png",
            "03_mine_bitext.ipynb": "03_mining_curve.png"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebook_runs_and_plots(name, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("NOTEBOOK_OUTPUT_DIR", str(tmp_path))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()
    errors = [o for cell in notebook.cells for o in cell.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    plot = tmp_path / EXPECTED[name]
    assert plot.exists() and plot.stat().st_size > 10_000
    assert any(o.get("output_type") == "display_data" for cell in notebook.cells
               for o in cell.get("outputs", []))
