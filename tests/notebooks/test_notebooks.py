"""Every notebook in notebooks/ runs headless (nbclient) without an error output, and the
cells that print figures print them (a notebook that silently printed nothing would pass
otherwise)."""
from __future__ import annotations

import pathlib

import pytest

nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[test]' installs it")
nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[test]' installs it")

NOTEBOOKS = sorted((pathlib.Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 1


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_without_errors(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, f"{path.name}: {errors[0].ename}: {errors[0].evalue}"
    silent = [c.source.splitlines()[0] for c in nb.cells if c.cell_type == "code"
              and "print(" in c.source and not c.get("outputs")]
    assert not silent, f"{path.name}: cells that print nothing: {silent}"
