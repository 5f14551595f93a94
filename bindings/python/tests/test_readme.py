"""The README's "Use from Python" snippets run as they are written: each ```python block
under that heading is a whole program (it launches its own local cluster)."""

import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"


def snippets():
    text = README.read_text()
    start = text.index("\n## Use from Python\n")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end != -1 else len(text)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


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
