#!/usr/bin/env bash
# The wheels a lent GPU machine lacks for benchmarks/gpu_check.sh, fetched here (where PyPI is reachable) into
# .whl/ for that machine's Python (CPython 3.12, x86-64 Linux), at the versions this repository's .venv runs.
# Its image already has torch, timm, transformers, einops, safetensors, huggingface_hub, OpenCV, scipy,
# scikit-learn, scikit-image, pandas, matplotlib and pytest (../shared/GPU.md). gradio (31 MB with more to come)
# and PyAV (about 35 MB) are left out: they would not fit beside the repository in the 64 MiB a call carries,
# so gpu_check.sh skips the app request and the video areas.
#
#   bash benchmarks/gpu_wheels.sh          # then carry .whl (git ignores it) with the call that runs gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
grep -qxF "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
rm -rf .whl && mkdir -p .whl

# distribution names, each pinned to the version installed here (the pins of requirements-dev.txt)
names="torchcam ttach quantus cachetools overcomplete isal pytorch-cka open_clip_torch ftfy wcwidth"
pins=$("$PYTHON" - $names <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
for name in sys.argv[1:]:
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        sys.exit(f"{name} is not installed here: install requirements-dev.txt first")
EOF
)
platforms=""
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms="$platforms --platform $p"
done
# shellcheck disable=SC2086
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms \
  -d .whl $pins
# grad-cam is published as a source distribution only: its wheel is pure Python, built here
"$PYTHON" -m pip wheel -q --no-deps -w .whl "grad-cam==$("$PYTHON" -c 'from importlib.metadata import version; print(version("grad-cam"))')"
ls -la .whl
du -sh .whl
