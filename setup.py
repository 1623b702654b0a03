"""mm-ds: mini-model adaptation of pretrained MLMs to new languages, on DeepSpeed.

Install order matters on CPU machines: torch first (pinned; an unpinned range pulls CUDA wheels), then
deepspeed with --no-build-isolation (its build imports torch), then this package. launchers/setup.sh does it.
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
        "torch>=2.3,<=2.13.0",
        "deepspeed>=0.16",
        "sentencepiece>=0.2.3",  # offset_mapping encode for QA windows
        "numpy",
        "datasets",
        "mpi4py>=4",
        "pyyaml",  # presets and run configs are YAML
        "safetensors",  # stage hand-off and imported weights without unpickling
        "tqdm",
        "matplotlib",  # training-curve and speedup plots of `mm-ds report`
    ],
    extras_require={
        "test": ["pytest", "transformers"],
        "bench": ["transformers"],
    },
    entry_points={"console_scripts": ["mm-ds=mm_ds.cli:main"]},
)
