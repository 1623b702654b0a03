"""mm-ds: mini-model adaptation of pretrained MLMs to new languages, on DeepSpeed.

Install order matters on CPU machines: torch first (pinned; an unpinned range pulls CUDA wheels), then
deepspeed with --no-build-isolation (its build imports torch), then this package. `make test` does it, with
the exact versions the tests ran with (constraints.txt).

torch and deepspeed are pinned to the tested releases: what mm-ds relies on differs between releases (which
ZeRO/bf16 optimizers skip a non-finite update by themselves, the checkpoint layouts
`mm_ds/runtime/checkpointing/checkpoint.py` reads, the CPU accelerator's bf16 and FusedAdam). The other ranges start at
the tested versions.
"""

from glob import glob

from setuptools import find_packages, setup

setup(
    name="mm-ds",
    version="0.1.0",
    description="Mini-model adaptation of masked language models to new languages, on DeepSpeed",
    packages=find_packages(include=["mm_ds", "mm_ds.*"]),
    package_data={"mm_ds": ["presets/*/*.yaml"]},  # includes recipes/
    data_files=[("share/mm-ds/ds_configs", glob("ds_configs/*.json"))],
    python_requires=">=3.10",
    install_requires=[
        "torch==2.13.0",
        "deepspeed==0.19.8",
        "sentencepiece>=0.2.3,<0.3",  # offset_mapping encode for QA windows
        "protobuf>=7.36,<8",  # sentencepiece_model_pb2: tokenizer conversion on import, tokenizer files on export
        "numpy>=2.4,<3",
        "datasets>=5.2,<6",
        "mpi4py>=4.1,<5",
        "pyyaml>=6.0,<7",  # presets and run configs are YAML
        "safetensors>=0.8,<0.9",  # stage hand-off and imported weights without unpickling
        "tqdm>=4.70,<5",
        "matplotlib>=3.11,<4",  # training-curve and speedup plots of `mm-ds report`
    ],
    extras_require={
        "test": ["pytest>=9.2,<10", "pytest-xdist>=3.8,<4", "transformers>=5.23,<6", "tensorboard>=2.21,<3",
                 "wandb>=0.31,<0.32"],
        "bench": ["transformers>=5.23,<6"],
        "monitor": ["tensorboard>=2.21,<3", "wandb>=0.31,<0.32"],
    },
    entry_points={"console_scripts": ["mm-ds=mm_ds.cli:main"]},
)
