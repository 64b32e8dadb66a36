"""The README's "Install by hand" block installs what scripts/bootstrap.sh installs (the README's two commands
run bootstrap.sh on every call): the same packages and pins, in the same order, with the same pip flags."""
import re
from pathlib import Path

from tests.pages import code_blocks

ROOT = Path(__file__).resolve().parents[1]


def pip_installs(lines):
    """Each ``pip install ...`` line's arguments, with the plugin's own path written as "."."""
    found = []
    for line in lines:
        match = re.search(r"(?:^|\s)install (.*?)\s*(?:#.*)?$", line)
        if match and "pip" in line and "--upgrade pip" not in line:
            found.append(re.sub(r'"\$root(\[dev\])?"', ".", match.group(1)).split())
    return found


def test_the_readmes_install_block_is_what_bootstrap_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8").split("## Install by hand", 1)[1]
    block = code_blocks(readme, "bash")[0].splitlines()
    bootstrap = (ROOT / "scripts" / "bootstrap.sh").read_text(encoding="utf-8").splitlines()
    by_hand, scripted = pip_installs(block), pip_installs(bootstrap)
    assert by_hand and block[0].startswith("python3.11 -m venv .venv") and 'py="${PYTHON:-python3.11}"' in bootstrap
    # bootstrap also re-installs the build tools fairseq's build needs before it; the README's torch line has them
    scripted = [args for args in scripted if args != ["cython", "numpy", "setuptools", "wheel"]]
    assert by_hand == scripted, f"README: {by_hand}\nbootstrap.sh: {scripted}"
