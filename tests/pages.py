"""The code blocks of the project's pages (README, docs/, examples/): what the tests run as written."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def code_blocks(text: str, language: str) -> list:
    """The bodies of the ```<language> blocks of a markdown ``text``, in order."""
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def page_blocks(page: str, language: str) -> list:
    """The ```<language> blocks of ``page`` (a path from the repository's root)."""
    return code_blocks((ROOT / page).read_text(encoding="utf-8"), language)
