"""fairseq_linattn: linear-complexity self-attention (Linformer, kernelized linear attention) for fairseq."""
from setuptools import find_namespace_packages, setup

setup(
    name="fairseq_linattn",
    version="0.2.0",
    description="Linformer and linear-transformer attention as a fairseq plugin",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # namespace packages: the config folders hold only YAML (hydra configs), no __init__.py
    packages=find_namespace_packages(include=["fairseq_linattn", "fairseq_linattn.*"], exclude=["*.__pycache__"]),
    package_data={"": ["*.yaml"]},
    include_package_data=True,
    install_requires=[
        # fairseq 0.12.2 does not install on Python 3.11; this is its 3.11 build. Its own build needs
        # torch: install torch first and this with --no-build-isolation (scripts/bootstrap.sh does).
        "fairseq-fixed==0.12.3.1",
        "torch>=2.0",
        "sentencepiece",
        "sacrebleu",
        "omegaconf>=2.3",
        "hydra-core>=1.3",
    ],
    extras_require={
        # FSDP (--ddp-backend fully_sharded, GPUs only): fairscale 0.4.13 is its last release and installs with
        # torch 2.13; our layers are wrapped one by one like fairseq's own
        "fsdp": ["fairscale==0.4.13"],
        # the GPU fast path: flash-linear-attention's Triton kernels behind the causal ops (CUDA only; the CPU path and
        # every test without a GPU need none of it)
        "gpu": ["fla-core==0.6.0"],
        "dev": ["pytest", "pytest-xdist", "matplotlib", "fairscale==0.4.13", "ruff==0.17.6"],
    },
    entry_points={
        "console_scripts": [
            "fairseq-linattn-hydra-train = fairseq_linattn.cli.hydra_train:cli_main",
            # the tools behind scripts/*.py, for installs without a checkout (they appear on the next pip install)
            "fairseq-linattn-stdlib-corpus = fairseq_linattn.data.stdlib_corpus:main",
            "fairseq-linattn-prepare-lm-data = fairseq_linattn.data.lm_data:main",
            "fairseq-linattn-preprocess-glue = fairseq_linattn.data.glue:main",
            "fairseq-linattn-prepare-translation-data = fairseq_linattn.data.translation_data:main",
            "fairseq-linattn-warm-start = fairseq_linattn.cli.tools:warm_start",
            "fairseq-linattn-spectrum = fairseq_linattn.cli.tools:spectrum",
        ]
    },
)
