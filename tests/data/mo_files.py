"""Write gettext .mo catalogs (GNU's binary format, as msgfmt writes them) so that the translation pipeline can be
tested on catalogs whose content the test knows, on any machine."""
import struct
from pathlib import Path
from typing import Dict

HEADER = "Content-Type: text/plain; charset=UTF-8\n"


def write_mo(path: Path, messages: Dict[str, str]):
    """``messages``: msgid -> msgstr (a msgid may carry a context, "ctx\\x04msgid")."""
    entries = sorted({"": HEADER, **messages}.items())
    ids = [k.encode() for k, _ in entries]
    strs = [v.encode() for _, v in entries]
    n = len(entries)
    originals_at, translations_at = 28, 28 + 8 * n
    data_at = translations_at + 8 * n
    table, data = [], b""
    for blob in ids + strs:
        table.append((len(blob), data_at + len(data)))
        data += blob + b"\0"
    header = struct.pack("<7I", 0x950412DE, 0, n, originals_at, translations_at, 0, data_at)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + b"".join(struct.pack("<2I", *entry) for entry in table) + data)


def numbered_catalogs(root: Path, catalogs: int = 12, per_catalog: int = 60, language: str = "de") -> Path:
    """``root/<language>/LC_MESSAGES/prog<i>.mo``: real-looking messages (placeholders, numbers, a context)."""
    words = [("file", "Datei"), ("folder", "Ordner"), ("user", "Benutzer"), ("package", "Paket"),
             ("branch", "Zweig"), ("option", "Option"), ("window", "Fenster"), ("device", "Gerät")]
    for c in range(catalogs):
        messages = {}
        for m in range(per_catalog):
            en, de = words[(c + m) % len(words)]
            messages[f"cannot open {en} %s ({c}.{m})"] = f"{de} %s kann nicht geöffnet werden ({c}.{m})"
        messages["menu\x04Open"] = "Öffnen"  # a context, dropped from the source
        messages["untranslated copy"] = "untranslated copy"  # msgstr == msgid: dropped
        messages["shared message"] = "gemeinsame Meldung"  # in every catalog: kept once
        write_mo(root / language / "LC_MESSAGES" / f"prog{c}.mo", messages)
    return root
