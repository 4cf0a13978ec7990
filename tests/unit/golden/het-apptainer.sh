#!/bin/bash
# Batch script of one SlurmJob attempt, rendered by slurmjob-operator.
#
# There are no #SBATCH lines, on purpose: slurmrestd ignores them. Every scheduler option
# (nodes, CPUs, memory, GPUs, constraints, partition, account, QOS, time limit, output files)
# is set in the JSON job description submitted together with this script.
#
# Exit codes of this script itself; any other code is the user command's own:
#   94  the staging directory or its job.env cannot be read on this node
#   95  rendezvous failed: the first node is unknown, or the Ray head never became healthy
#   96  secrets.env is expected but gone (an earlier run of this attempt consumed it)
#   97  the runtime artifact failed verification (missing, wrong magic or wrong sha256)
set -euo pipefail

staging_dir=/lustre/slurmjob/team-a/resnet-3f2a9c1e/attempt-1
artifact=/lustre/slurmjob/runtimes/custom-test.sif
artifact_sha256=913ae15b9bb73b8d90c813d7518bc42943b1c63fedfc13d0bf583fa148687eae
artifact_magic=SIF_MAGIC
artifact_magic_offset=32
readonly staging_dir artifact artifact_sha256 artifact_magic artifact_magic_offset

# The user's command, one word per line, exactly as in spec.command.
user_command=(
  python
  train.py
  --epochs
  3
)

fail() {
  local code=$1
  shift
  printf 'slurmjob: %s\n' "$*" >&2
  exit "$code"
}

# secrets.env lives on shared storage: delete it as soon as it has been read, and on any exit.
# shred is best effort (a parallel filesystem may not overwrite in place); unlinking is what
# counts, so rm is the fallback.
remove_secrets() {
  local file=$staging_dir/secrets.env
  if [[ -e $file ]]; then
    shred -u -- "$file" 2>/dev/null || rm -f -- "$file" ||
      printf 'slurmjob: could not delete %s\n' "$file" >&2
  fi
}

# Background steps (the Ray head and workers): stopped when the command ends or the script
# exits. srun forwards SIGTERM to its tasks; whatever is still there after ~30 s is killed.
background_pids=()
stop_background() {
  local pid alive try
  if ((${#background_pids[@]} == 0)); then
    return 0
  fi
  kill -TERM "${background_pids[@]}" 2>/dev/null || true
  for ((try = 0; try < 150; try++)); do
    alive=0
    for pid in "${background_pids[@]}"; do
      if kill -0 "$pid" 2>/dev/null; then
        alive=1
      fi
    done
    if ((alive == 0)); then
      break
    fi
    sleep 0.2
  done
  kill -KILL "${background_pids[@]}" 2>/dev/null || true
  wait "${background_pids[@]}" 2>/dev/null || true
  background_pids=()
}

on_exit() {
  remove_secrets
  stop_background
}
trap on_exit EXIT
# Turn the signals Slurm sends (scancel, time limit) into an exit, so the EXIT trap runs.
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

cd -- "$staging_dir" || fail 94 "cannot enter the staging directory $staging_dir"
[[ -r job.env ]] || fail 94 "cannot read $staging_dir/job.env"
# The attempt's immutable environment (spec.env values, one export per line).
# shellcheck source=/dev/null
source ./job.env

# Secret environment variables: read once into this shell (srun passes them on to every step),
# then deleted right away, so they neither stay on shared storage while the job runs nor show
# through the staging mount inside the container.
[[ -r secrets.env ]] || fail 96 "$staging_dir/secrets.env is gone: this attempt already ran once"
set -a
# shellcheck source=/dev/null
source ./secrets.env
set +a
remove_secrets

# Verify the runtime artifact on this node before anything starts: it exists, carries the
# format's magic bytes, and has the registry's sha256.
verify_artifact() {
  local magic actual
  [[ -f $artifact && -r $artifact ]] ||
    fail 97 "runtime artifact $artifact is missing or unreadable"
  magic=$(dd if="$artifact" bs=1 skip="$artifact_magic_offset" count="${#artifact_magic}" \
    2>/dev/null | tr -d '\000') || fail 97 "cannot read runtime artifact $artifact"
  [[ $magic == "$artifact_magic" ]] ||
    fail 97 "runtime artifact $artifact has no $artifact_magic magic at byte $artifact_magic_offset"
  actual=$(sha256sum <"$artifact") || fail 97 "cannot hash runtime artifact $artifact"
  actual=${actual%% *}
  [[ $actual == "$artifact_sha256" ]] ||
    fail 97 "runtime artifact $artifact has sha256 $actual, expected $artifact_sha256"
}
verify_artifact

# Rendezvous for multi-node launchers: the first node of the whole job is the master.
# WORLD_SIZE is the node count (TAO's meaning), not a process count.
first_nodes=()
mapfile -t first_nodes < <(scontrol show hostnames "${SLURM_JOB_NODELIST_HET_GROUP_0:-}")
head_node=${first_nodes[0]:-}
[[ -n $head_node ]] || fail 95 "cannot tell the job's first node from Slurm's node list"
export MASTER_ADDR=$head_node
export MASTER_PORT=29500
export WORLD_SIZE=5
export NUM_GPU_PER_NODE=8
# The command runs on the first node: rank 0. Ray workers compute their own rank.
export NODE_RANK=0

# How a step enters the container (apptainer): srun runs `apptainer exec` on the SIF. Bind
# sources are paths under the cluster's storage root; the attempt's directory is bound
# read-only at the same path.
in_container=(
  apptainer exec --nv
  --bind /lustre/slurmjob/datasets/imagenet:/data:ro
  --bind /lustre/slurmjob/results/run-1:/results
  --bind /lustre/slurmjob/team-a/resnet-3f2a9c1e/attempt-1:/lustre/slurmjob/team-a/resnet-3f2a9c1e/attempt-1:ro
  --pwd /workspace
  /lustre/slurmjob/runtimes/custom-test.sif
)
# APPTAINERENV_<NAME> makes spec.env win over values the image sets itself.
user_env_names=(EPOCHS GREETING HF_TOKEN)
for name in "${user_env_names[@]}"; do
  export "APPTAINERENV_$name=${!name}"
done

# GPU job: a Ray cluster over every node of the job. The head runs on the first node, a worker
# on every other node; then the command runs on the head. Ray runs inside the container.
# --overlap on every step: the steps share the allocation's CPUs, memory and GPUs.
# Ray's own steps write to ray.log in the staging directory, so that stdout and stderr hold the
# command's output (and not srun's notices when the Ray steps are stopped at the end).
ray_address=$head_node:6379
ray_log=$staging_dir/ray.log

srun --overlap --het-group=0 --nodes=1 --ntasks=1 --nodelist="$head_node" "${in_container[@]}" \
  ray start --head --port=6379 --num-gpus=8 --block \
  >>"$ray_log" 2>&1 &
head_pid=$!
background_pids+=("$head_pid")

# Wait up to 300 s for the head to answer.
ray_ready=0
for ((try = 0; try < 150; try++)); do
  kill -0 "$head_pid" 2>/dev/null ||
    fail 95 "the Ray head step on $head_node ended before it became healthy"
  if srun --overlap --het-group=0 --nodes=1 --ntasks=1 --nodelist="$head_node" \
    "${in_container[@]}" ray health-check --address "$ray_address" >/dev/null 2>&1; then
    ray_ready=1
    break
  fi
  sleep 2
done
((ray_ready == 1)) || fail 95 "the Ray head on $head_node did not become healthy in 300 s"

# Each worker exports NODE_RANK = the step's rank offset + its node's index in the step.
# shellcheck disable=SC2016 # expanded by sh inside the container, not here
node_rank_wrapper='NODE_RANK=$(($1 + ${SLURM_NODEID:-0})); export NODE_RANK; shift; exec "$@"'

# Workers on the other nodes of the first pool.
srun --overlap --het-group=0 --nodes=1 --ntasks=1 --ntasks-per-node=1 \
  --exclude="$head_node" "${in_container[@]}" \
  sh -c "$node_rank_wrapper" sh 1 \
  ray start --address="$ray_address" --num-gpus=8 --block \
  >>"$ray_log" 2>&1 &
background_pids+=("$!")

# Workers on every node of the next heterogeneous component.
srun --overlap --het-group=1 --nodes=3 --ntasks=3 --ntasks-per-node=1 \
  "${in_container[@]}" \
  sh -c "$node_rank_wrapper" sh 2 \
  ray start --address="$ray_address" --num-gpus=4 --block \
  >>"$ray_log" 2>&1 &
background_pids+=("$!")

# The command, on the head, inside the container.
export RAY_ADDRESS=$ray_address
status=0
srun --overlap --het-group=0 --nodes=1 --ntasks=1 --nodelist="$head_node" "${in_container[@]}" \
  "${user_command[@]}" || status=$?
stop_background
exit "$status"
