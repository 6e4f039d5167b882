"""`python tests/zerogpu_app.py ARGS`: app.py as a ZeroGPU Space runs it, on a machine without a GPU.

Only the three CUDA-bound steps of `spaces.zero.torch` are made harmless, right after `import spaces`
(as app.py imports it first): its CUDA emulation is lifted once in this process (`unpatch`; a second
call would fail, so it becomes a no-op for the workers), and a worker's `init` (CUDA on the GPU the
scheduler names) and `move` (the packed weights onto it) do nothing. Everything else — the fork of a
worker per decorated function, pickling arguments and results, reusing warm workers, relaying
progress and errors — is spaces' own code, driven by the scheduler stand-in that SPACES_ZERO_DEVICE_API_URL
names (tests/zerogpu.py). This depends on spaces' internals (pinned in requirements-dev.txt).

VITVIZ_TEST_SLOW_FILE: while that file exists, each faithfulness call first sleeps 5 s in its worker, so a
test can kill the worker during a call.
"""
import os
import runpy
import sys
import time
from pathlib import Path

import spaces  # noqa: F401  (first, as app.py has it)
import spaces.zero.torch as zero_torch

zero_torch.unpatch()
zero_torch.unpatch = lambda: None
zero_torch.init = lambda *args, **kwargs: None
zero_torch.move = lambda *args, **kwargs: None

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

slow = os.environ.get("VITVIZ_TEST_SLOW_FILE")
if slow:
    from vitviz.ui import gpu

    scores = gpu.maps.faithfulness_scores

    def slow_scores(*args, **kwargs):
        if Path(slow).exists():
            time.sleep(5)
        return scores(*args, **kwargs)

    gpu.maps.faithfulness_scores = slow_scores

sys.argv = [str(ROOT / "app.py"), *sys.argv[1:]]
runpy.run_path(str(ROOT / "app.py"), run_name="__main__")
