#!/usr/bin/env bash
# The agent's GPU checks, for a machine with one or more CUDA GPUs (a few minutes):
# NCCL + CUDA device placement, CUDA-event profiling, no host synchronization per step
# beyond plain DDP's, fp16 autocast with GradScaler, noise scale on the GPU, and the
# per-step overhead against plain DDP with NCCL (one replica per GPU), and the memory
# bound predicted from the CUDA allocator's peaks (tests/torch/test_gpu.py).
set -euo pipefail
cd "$(dirname "$0")/.."
python - <<'PY'
import torch
assert torch.cuda.is_available(), "no CUDA GPU visible"
print("GPU:", torch.cuda.get_device_name(0), "count:", torch.cuda.device_count(),
      "torch", torch.__version__)
PY
python -m pytest tests/torch/test_gpu.py -q -rA -p no:cacheprovider
gpus=$(python -c "import torch; print(torch.cuda.device_count())")
python bench/agent.py --part overhead --backend auto --replicas "$gpus" --steps 100 --rounds 5
