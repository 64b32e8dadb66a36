"""Name -> class tables for the swappable pieces (feature maps, sequence projections), fairseq-style."""
from typing import Callable, Dict, Tuple, Type


def make_registry(kind: str) -> Tuple[Dict[str, Type], Callable[[str], Callable[[Type], Type]]]:
    """An empty table and the decorator that fills it; each class learns its name as ``cls.kind``."""
    table: Dict[str, Type] = {}

    def register(name: str):
        def add(cls):
            if name in table:
                raise ValueError(f"{kind} {name!r} is already registered (by {table[name].__qualname__})")
            table[name] = cls
            cls.kind = name
            return cls

        return add

    return table, register
