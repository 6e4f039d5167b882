#!/usr/bin/env bash
# vitviz on a CUDA GPU, as one script for a lent machine: under 5 minutes on an H200, no network.
#   1. numerics: our ViT-B/16 and CvT-13 against timm / transformers on the GPU, float32 and bf16
#      autocast, and the explanation maps against the CPU's (benchmarks/gpu_numerics.py states the tolerances);
#   2. under bf16 autocast at batch 1 and 32: forwards (ViT, CvT, Swin, ResNet, ConvNeXt) and traces against
#      their peers, the explain pipeline with where its time goes, the fraction of the GPU's bf16 peak;
#   3. in float32: the attribution duels (LeGrad, Grad-CAM; AttnLRP's lxt runs on the CPU only), region
#      perturbation against Quantus, `evaluate` and activation patching against their floors, direct logit
#      attribution, receptive fields, Swin rollout, and concept dictionaries (caching, training against
#      Overcomplete).
# An area whose packages this machine lacks is skipped with a line naming them; an area that fails prints one
# line and the others still run. The exit status is 1 if anything failed.
#
# A lent machine has torch, timm, transformers, einops, safetensors, huggingface_hub, OpenCV, scipy and pytest
# but not the references of section 3 nor isal (../shared/GPU.md). Fetch their wheels here first and carry them:
#
#   bash benchmarks/gpu_wheels.sh                      # here: .whl/ (ignored by git), a few MB
#   bash benchmarks/gpu_check.sh 2>&1 | tee gpu_check.log   # there, with .whl carried: installed into /tmp/site
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || echo "the carried wheels in .whl/ did not install"
fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
# which areas can run: each needs its packages; the missing ones are named with the way to carry them
areas=$("$PYTHON" - <<'EOF'
import importlib.util, sys
def missing(*modules):
    return [m for m in modules if importlib.util.find_spec(m) is None]
core = missing("torch", "timm", "transformers", "einops", "safetensors", "huggingface_hub", "cv2", "PIL", "pytest",
               "isal", "tqdm", "scipy")
if core:
    sys.exit(f"missing Python packages: {', '.join(core)} (fetch them with benchmarks/gpu_wheels.sh where PyPI is "
             f"reachable and carry .whl; see the top of benchmarks/gpu_check.sh)")
import torch
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA device")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}", file=sys.stderr)
needs = {"attribution": ("torchcam", "pytorch_grad_cam", "ttach"), "quantus": ("quantus", "cachetools"),
         "concepts": ("overcomplete",), "request": ("gradio", "gradio_client"), "video": ("av",)}
asked = ["forward", "cvt", "traced", "pipeline", "peak", "swin", "cnn", "attribution", "quantus", "evaluate",
         "decide", "concepts"]
for area, modules in needs.items():
    if area in asked and (lacking := missing(*modules)):
        print(f"{area}: skipped, this machine lacks {', '.join(lacking)} (benchmarks/gpu_wheels.sh fetches them)",
              file=sys.stderr)
        asked.remove(area)
print(" ".join(asked))
EOF
) || exit 2
bf16=$(echo "$areas" | tr ' ' '\n' | grep -xE 'forward|cvt|traced|pipeline|peak|swin|cnn' | tr '\n' ' ')
fp32=$(echo "$areas" | tr ' ' '\n' | grep -xE 'attribution|quantus|evaluate|decide|concepts' | tr '\n' ' ')

status=0
echo "== 1. numerics on CUDA (float32 and bf16 autocast, maps against the CPU's)"
timeout 120 "$PYTHON" -m pytest benchmarks/gpu_numerics.py -q -p no:cacheprovider || status=1

echo "== 2. on CUDA, bf16 autocast, batch 1 and 32: $bf16"
# shellcheck disable=SC2086
timeout 90 "$PYTHON" benchmarks/bench.py --device cuda --autocast --batches 1 32 --repeats 10 --only $bf16 || status=1

echo "== 3. on CUDA, float32: $fp32"
# shellcheck disable=SC2086
timeout 90 "$PYTHON" benchmarks/bench.py --device cuda --repeats 5 --only $fp32 || status=1
exit $status
