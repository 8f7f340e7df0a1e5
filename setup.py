"""Install megatron-gamma.

Install torch first (``pip install torch==2.13.0`` on CPU machines), then
``pip install --no-build-isolation -e .``: the C++/CUDA kernels in ``csrc/`` are compiled against
the torch that is already installed, as apex and Transformer Engine do.
"""

from setuptools import find_packages, setup

setup(
    name="megatron-gamma",
    version="0.1.0",
    description="Megatron-core pretraining with small (gamma) initialization, small-eps RMSNorm "
    "and gated attention",
    python_requires=">=3.10",
    packages=find_packages(include=["megatron_gamma", "megatron_gamma.*"]),
    package_data={"megatron_gamma": ["data/demo/*", "configs/*.yaml"]},
    install_requires=[
        "torch>=2.4",
        "megatron-core>=0.15,<0.20",
        "numpy",
        "tokenizers>=0.19",
        "PyYAML",
        "tqdm",
        "tensorboard",
        "psutil",
        "matplotlib",
    ],
    extras_require={"test": ["pytest>=8", "pytest-timeout"]},
    entry_points={"console_scripts": ["megatron-gamma=megatron_gamma.cli:main"]},
)
