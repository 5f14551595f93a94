"""The book's "Use from Python" snippets (docs/src/python/python.md) run as they are written:
each ```python block of that chapter is a whole program (it launches its own local cluster)."""

import pathlib
import re
import subprocess
import sys

import pytest

CHAPTER = pathlib.Path(__file__).resolve().parents[3] / "docs" / "src" / "python" / "python.md"


def snippets():
    text = CHAPTER.read_text()
    assert text.startswith("# Use from Python\n"), f"{CHAPTER} is not the Python chapter"
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_section_has_snippets():
    assert len(snippets()) >= 2


@pytest.mark.parametrize("index", range(len(snippets())))
def test_snippet_runs(tmp_path, index):
    script = tmp_path / f"snippet_{index}.py"
    script.write_text(snippets()[index])
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "[worker 0]" in run.stdout, run.stdout
