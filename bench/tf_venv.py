"""TensorFlow's virtual environment for the side-by-side scripts (tf_compare.py, e2e_digits.py).

PyPI's tensorflow-cpu, pinned, in a virtual environment under ~/.cache/mirrored/ ($XDG_CACHE_HOME
if set), made the first time it is needed (a download of a few hundred MB). Python 3 standard
library only.
"""
import os
import subprocess
import sys
from pathlib import Path

TF_PACKAGE = "tensorflow-cpu==2.21.0"


def default_venv():
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "mirrored" / ("tf-venv-" + TF_PACKAGE.split("==")[1])


def ensure_venv(venv, log=lambda *a: print(*a, file=sys.stderr, flush=True)):
    """The venv's python, after making the venv with TF_PACKAGE unless it already imports TensorFlow."""
    venv = Path(venv)
    py = venv / "bin" / "python"
    ok = py.exists() and subprocess.run(
        [str(py), "-c", "import tensorflow"], capture_output=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    ).returncode == 0
    if ok:
        return py
    log(f"making the virtual environment {venv} with {TF_PACKAGE} (once; a few hundred MB)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", TF_PACKAGE],
                   check=True)
    return py
