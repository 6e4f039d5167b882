#!/usr/bin/env bash
# vitviz on a CUDA GPU, as one script for a lent machine (issue 8): 5 to 9 minutes on an H200, no network.
#   1. numerics: our ViT-B/16 and CvT-13 against timm / transformers on the GPU, float32 and bf16
#      autocast, and the explanation maps against the CPU's (benchmarks/gpu_numerics.py states the tolerances);
#   2. benchmark items 1-5 under bf16 autocast at batch 1 and 32, and the fraction of the GPU's bf16 peak;
#   3. the attribution duels (LeGrad, Grad-CAM; AttnLRP's lxt runs on the CPU only), region perturbation
#      against Quantus and `evaluate` against its floor, in float32.
# It installs nothing. It needs a Python with CUDA torch, timm, transformers, einops, safetensors,
# huggingface_hub, opencv-python-headless, pillow, pytest (and gradio for item 5, skipped without it):
# the repository's .venv if there is one, else $PYTHON, else python3. On a machine without them, carry
# wheels built elsewhere (`pip download -r requirements-dev.txt -d wheels` where there is network) and
# `pip install --no-index --find-links wheels -r requirements-dev.txt` before running this.
#
#   bash benchmarks/gpu_check.sh 2>&1 | tee gpu_check.log
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PYTHON" - <<'EOF' || exit 2
import importlib.util, sys
missing = [m for m in ("torch", "timm", "transformers", "einops", "safetensors", "huggingface_hub", "cv2", "PIL",
                       "pytest") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing Python packages: {', '.join(missing)} (see the top of benchmarks/gpu_check.sh)")
import torch
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA device")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}")
EOF

status=0
echo "== 1. numerics on CUDA (float32 and bf16 autocast, maps against the CPU's)"
timeout 240 "$PYTHON" -m pytest benchmarks/gpu_numerics.py -q -p no:cacheprovider || status=1

echo "== 2. benchmark on CUDA, bf16 autocast, batch 1 and 32"
items="forward cvt traced pipeline peak"
if "$PYTHON" -c "import gradio" 2>/dev/null; then items="$items request"; else echo "(no gradio: item 5 skipped)"; fi
timeout 300 "$PYTHON" benchmarks/bench.py --device cuda --autocast --batches 1 32 --repeats 20 --only $items || status=1

echo "== 3. explanation methods and faithfulness on CUDA, float32: against torchcam, grad-cam and Quantus"
timeout 240 "$PYTHON" benchmarks/bench.py --device cuda --repeats 5 --only attribution quantus evaluate || status=1
exit $status
