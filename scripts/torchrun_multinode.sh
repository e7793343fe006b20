#!/usr/bin/env bash
# Multi-node launcher for `emarule run`: one copy of this script per node, the same arguments
# everywhere; torchrun starts NPROC_PER_NODE processes on each node and they rendezvous at
# MASTER_ADDR:MASTER_PORT. Everything after the options is passed to `python -m emarule run`.
#
#   scripts/torchrun_multinode.sh [--nnodes N] [--node-rank R] [--master-addr HOST] \
#       [--master-port PORT] [--nproc-per-node G] -- EXPERIMENT [emarule run options...]
#
# Each option falls back to an environment variable, then to a default:
#   --nnodes          NNODES          (SLURM_NNODES, else 1)
#   --node-rank       NODE_RANK       (SLURM_NODEID, else 0)
#   --master-addr     MASTER_ADDR     (first host of SLURM_JOB_NODELIST, else 127.0.0.1)
#   --master-port     MASTER_PORT     (29500)
#   --nproc-per-node  NPROC_PER_NODE  (number of visible GPUs, else 1)
#   PYTHON            the interpreter (default: .venv/bin/python if present, else python3)
#   RDZV_ID           rendezvous id shared by the nodes (SLURM_JOB_ID, else "emarule")
#   TORCH_ELASTIC_SHUTDOWN_TIMEOUT  seconds torchrun gives the ranks from SIGTERM to SIGKILL (default
#                     here 110, torch's 30): a rank checkpoints after its step in progress, then exits
#
# Example, two 8-GPU nodes, BYOL ViT-B/16 at κ=6 (batch 24,576 = 4096 × 6):
#   node 0:  NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 scripts/torchrun_multinode.sh -- \
#              byol-vit --kappa 6 --data /datasets/imagenet --out runs/byol-vit/k6-rule-s0
#   node 1:  NNODES=2 NODE_RANK=1 MASTER_ADDR=node0 scripts/torchrun_multinode.sh -- \
#              byol-vit --kappa 6 --data /datasets/imagenet --out runs/byol-vit/k6-rule-s0
# Give every node the same --out on a shared file system (only rank 0 writes) and add
# --max-device-batch if κB / (nodes × GPUs) samples do not fit on one GPU: the rest is
# accumulated, the optimizer still sees the κB-sample mean gradient.
# Rendezvous is c10d at MASTER_ADDR:MASTER_PORT (torchrun --rdzv-backend c10d), so node ranks
# are assigned by torchrun and --node-rank only matters with RDZV=static.
set -euo pipefail

nnodes="${NNODES:-${SLURM_NNODES:-1}}"
node_rank="${NODE_RANK:-${SLURM_NODEID:-0}}"
master_addr="${MASTER_ADDR:-}"
master_port="${MASTER_PORT:-29500}"
nproc="${NPROC_PER_NODE:-}"
rdzv="${RDZV:-c10d}"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --nnodes) nnodes="$2"; shift 2 ;;
    --node-rank) node_rank="$2"; shift 2 ;;
    --master-addr) master_addr="$2"; shift 2 ;;
    --master-port) master_port="$2"; shift 2 ;;
    --nproc-per-node) nproc="$2"; shift 2 ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    --) shift; break ;;
    *) break ;;
  esac
done

if [[ $# -eq 0 ]]; then
  echo "error: nothing to run; pass the experiment and its options after --, e.g. -- byol-r18 --kappa 4 --data DIR" >&2
  exit 2
fi

if [[ -z "$master_addr" ]]; then
  if [[ -n "${SLURM_JOB_NODELIST:-}" ]] && command -v scontrol >/dev/null; then
    master_addr="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
  else
    master_addr="127.0.0.1"
  fi
fi

if [[ -z "$nproc" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    nproc="$(nvidia-smi --list-gpus 2>/dev/null | wc -l)"
  fi
  [[ -z "$nproc" || "$nproc" -lt 1 ]] && nproc=1
fi

export TORCH_ELASTIC_SHUTDOWN_TIMEOUT="${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-110}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  if [[ -x "$here/.venv/bin/python" ]]; then python="$here/.venv/bin/python"; else python=python3; fi
fi

if [[ "$rdzv" == "static" ]]; then
  rdzv_args=(--node-rank "$node_rank" --master-addr "$master_addr" --master-port "$master_port")
else
  rdzv_args=(--rdzv-backend c10d --rdzv-endpoint "$master_addr:$master_port" --rdzv-id "${RDZV_ID:-${SLURM_JOB_ID:-emarule}}")
fi

echo "torchrun: $nnodes node(s) × $nproc process(es), this node rank $node_rank, rendezvous $master_addr:$master_port" >&2
exec "$python" -m torch.distributed.run --nnodes "$nnodes" --nproc-per-node "$nproc" "${rdzv_args[@]}" \
  -m emarule run "$@"
