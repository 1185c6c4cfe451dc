#!/bin/bash
# Multi-node DDP training under SLURM: one task per GPU, Lightning reads the SLURM environment.
#
#   sbatch --nodes 2 tools/slurm_train.sh configs/detr/detr_r50_coco.yaml [extra CLI overrides...]
#   sbatch --nodes 1 --gres gpu:4 --ntasks-per-node 4 tools/slurm_train.sh configs/vit/deit_small_imagenet.yaml
#
# Resubmitting the same command resumes from <default_root_dir>/checkpoints/last.ckpt when it exists.
#SBATCH --job-name=visiontf
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8          # = GPUs per node: Lightning needs one task per GPU
#SBATCH --gres=gpu:8
#SBATCH --cpus-per-task=10           # data loader workers + 1
#SBATCH --time=72:00:00
#SBATCH --signal=SIGUSR1@120         # Lightning saves a checkpoint and requeues on this signal
#SBATCH --requeue
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail

CONFIG=${1:?usage: sbatch tools/slurm_train.sh CONFIG.yaml [overrides...]}
shift

cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
PYTHON=${PYTHON:-.venv/bin/python}
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
# NCCL talks over the fastest interface it finds; set NCCL_SOCKET_IFNAME if nodes have several.
export NCCL_ASYNC_ERROR_HANDLING=1

# Resume when this run already wrote a last.ckpt (requeue after preemption or a time limit).
ROOT_DIR=$("$PYTHON" tools/train.py fit --config "$CONFIG" "$@" --print_config | "$PYTHON" -c \
  "import sys, yaml; print(yaml.safe_load(sys.stdin)['trainer'].get('default_root_dir') or 'outputs')")
RESUME=()
if [[ -f "$ROOT_DIR/checkpoints/last.ckpt" ]]; then
  RESUME=(--ckpt_path last)
  echo "resuming from $ROOT_DIR/checkpoints/last.ckpt"
fi

srun "$PYTHON" tools/train.py fit --config "$CONFIG" \
  --trainer.accelerator gpu \
  --trainer.strategy ddp \
  --trainer.num_nodes "$SLURM_NNODES" \
  --trainer.devices "$SLURM_NTASKS_PER_NODE" \
  "${RESUME[@]}" "$@"
