#!/usr/bin/env bash
# Download, on a machine with a package registry, the wheels that a registry-less CUDA host (Python 3.12, x86_64; an
# image with torch, JAX, flax, optax, orbax and numpy) needs to run this project's GPU tests and benchmarks, into
# .whl/ of this checkout (git ignores it). scripts/gpu_check.sh installs them there with
# `pip install --no-index --no-deps --target /tmp/site .whl/*.whl`.
#
# Usage: bash scripts/gpu_wheels.sh [PYTHON_VERSION]   (default 3.12)
# PyCUDA has no binary wheel on PyPI: put one built on the host itself into .whl/ as well (with its pure-Python
# needs pytools, platformdirs, mako, siphash24).
set -euo pipefail
top=$(git rev-parse --show-toplevel)
py=${1:-3.12}
mkdir -p "$top/.whl"
grep -qx '/.whl/' "$top/.git/info/exclude" 2>/dev/null || echo '/.whl/' >> "$top/.git/info/exclude"
# The CLI, config, metrics and test libraries, none of which the H200 image is listed with (a wheel of one it has
# only shadows its copy under /tmp/site).
pkgs=(pyzmq omegaconf antlr4-python3-runtime typer click shellingham rich markdown-it-py mdurl pygments
      annotated-doc tensorboardX prometheus-client hdrhistogram pbr nvidia-ml-py isal pytest-timeout hypothesis
      sortedcontainers psutil msgpack)
plat=(--only-binary=:all: --python-version "$py" --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$top/.whl" "${pkgs[@]}"
# typer needs pydantic: resolved with its own needs so that pydantic and pydantic-core match
python3 -m pip download -q "${plat[@]}" -d "$top/.whl" pydantic
echo "$(ls "$top/.whl" | wc -l) wheels in .whl/ ($(du -sh "$top/.whl" | cut -f1)); name .whl in the device call's carry"
