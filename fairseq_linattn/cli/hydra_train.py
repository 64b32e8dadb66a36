"""``fairseq-linattn-hydra-train``: fairseq-hydra-train with this plugin loaded first.

Plain fairseq-hydra-train composes its config before it imports ``common.user_dir``, so it cannot know our
models at composition time. This wrapper imports the plugin, then:

* turns ``model=<one of our archs>`` into ``++model._name=<arch>`` (a config's own ``model._name`` would
  otherwise win over the group selection, and our archs have no YAML in fairseq's config folder);
* adds ``common.user_dir=<this package>`` unless given, so checkpoints and fairseq's spawned workers
  import the plugin too;
* finds the package's shipped configs: ``--config-name pretraining/linformer_base`` works without
  ``--config-dir``.
"""
import os
import sys
from typing import List

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(PACKAGE_DIR, "config")


def our_archs() -> List[str]:
    from fairseq.models import ARCH_MODEL_REGISTRY

    return sorted(a for a, m in ARCH_MODEL_REGISTRY.items() if m.__module__.startswith("fairseq_linattn."))


def rewrite_overrides(argv: List[str]) -> List[str]:
    archs = set(our_archs())
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key.lstrip("+") == "model" and value in archs:
            arg = f"++model._name={value}"
        out.append(arg)
    if not any(a.lstrip("+").startswith("common.user_dir=") for a in out):
        out.append(f"common.user_dir={PACKAGE_DIR}")
    return use_shipped_configs(out)


def use_shipped_configs(argv: List[str]) -> List[str]:
    """``--config-name pretraining/linformer_base`` without ``--config-dir`` means our shipped config.

    fairseq attaches its config schema by config *name*, so the folder must go into ``--config-dir``."""
    if any(a in ("--config-dir", "-cd") or a.startswith("--config-dir=") for a in argv):
        return argv
    for flag in ("--config-name", "-cn"):
        if flag in argv and argv.index(flag) + 1 < len(argv):
            i = argv.index(flag)
            folder, name = os.path.split(argv[i + 1])
            if os.path.exists(os.path.join(CONFIG_DIR, folder, name + ".yaml")):
                return argv[:i] + ["--config-dir", os.path.join(CONFIG_DIR, folder), flag, name] + argv[i + 2 :]
    return argv


def shipped_configs() -> List[str]:
    return sorted(os.path.relpath(os.path.join(folder, name), CONFIG_DIR)[: -len(".yaml")]
                  for folder, _, names in os.walk(CONFIG_DIR) for name in names if name.endswith(".yaml"))


def missing_config(argv: List[str]):
    """The ``--config-name`` that names no config (hydra then fails on the first override, "Could not override
    'task.data'", which hides the cause), or None. Only without ``--config-dir``: the shipped configs (after
    :func:`use_shipped_configs`) and fairseq's own."""
    if any(a in ("--config-dir", "-cd") or a.startswith("--config-dir=") for a in argv):
        return None
    import fairseq

    fairseq_configs = os.path.join(os.path.dirname(fairseq.__file__), "config")
    for flag in ("--config-name", "-cn"):
        if flag in argv and argv.index(flag) + 1 < len(argv):
            name = argv[argv.index(flag) + 1]
            if not os.path.exists(os.path.join(fairseq_configs, name + ".yaml")):
                return name
    return None


def config_file(argv: List[str]):
    """The YAML file that ``--config-dir`` and ``--config-name`` name, or None."""
    keys = {"--config-dir": "dir", "-cd": "dir", "--config-name": "name", "-cn": "name"}
    values = {}
    for i, arg in enumerate(argv):
        flag, sep, value = arg.partition("=")
        if flag in keys:
            if sep:
                values[keys[flag]] = value
            elif i + 1 < len(argv):
                values[keys[flag]] = argv[i + 1]
    if "dir" not in values or "name" not in values:
        return None
    path = os.path.join(values["dir"], values["name"] + ".yaml")
    return path if os.path.isfile(path) else None


def fp16_without_cuda(argv: List[str]):
    """A config that trains in fp16 (the shipped GLUE and pretraining ones, as fairseq's) on a machine where torch
    sees no CUDA GPU, with no override of it: fairseq ended in "AssertionError: Torch not compiled with CUDA enabled"
    after loading the data. The overrides that run it on the CPU, or None."""
    overridden = {arg.split("=", 1)[0].lstrip("+") for arg in argv if "=" in arg and not arg.startswith("-")}
    if overridden & {"common.fp16", "common.memory_efficient_fp16"}:
        return None
    path = config_file(argv)
    if path is None:
        return None
    from omegaconf import OmegaConf

    common = OmegaConf.load(path).get("common") or {}
    if not (common.get("fp16") or common.get("memory_efficient_fp16")):
        return None
    import torch

    if torch.cuda.is_available():
        return None
    return (f"{os.path.basename(path)} trains in fp16 on a CUDA GPU and torch sees none on this machine: add "
            f"common.fp16=false common.cpu=true (or common.bf16=true common.cpu=true for 16-bit training on the CPU)")


def cli_main():
    from fairseq_cli import hydra_train

    import fairseq_linattn  # noqa: F401  (registers our models before hydra composes)

    argv = rewrite_overrides(sys.argv[1:])
    name = missing_config(argv)
    if name is not None:
        print(f"{os.path.basename(sys.argv[0])}: error: no config named {name!r}: the shipped ones are "
              f"{', '.join(shipped_configs())} (or pass --config-dir with your own)", file=sys.stderr)
        sys.exit(2)
    problem = fp16_without_cuda(argv)
    if problem is not None:
        print(f"{os.path.basename(sys.argv[0])}: error: {problem}", file=sys.stderr)
        sys.exit(2)
    sys.argv = [sys.argv[0]] + argv
    hydra_train.cli_main()


if __name__ == "__main__":
    cli_main()
