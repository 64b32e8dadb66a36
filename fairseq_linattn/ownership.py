"""Whether a class (or an instance of one) is this package's: what fairseq's registries hold under a name, what a
generator runs. A leaf module: models/registry.py and compat/scope.py both ask it, and neither imports the other."""
PACKAGE = __name__.split(".")[0]


def is_ours(obj) -> bool:
    cls = obj if isinstance(obj, type) else type(obj)
    return cls.__module__.split(".")[0] == PACKAGE
