#!/bin/bash
# Batch script of one SlurmJob attempt, rendered by slurmjob-operator.
#
# There are no #SBATCH lines, on purpose: slurmrestd ignores them. Every scheduler option
# (nodes, CPUs, memory, GPUs, constraints, partition, account, QOS, time limit, output files)
# is set in the JSON job description submitted together with this script.
#
# Nothing of the manifest runs or lands in this shell: the command and spec.env are data,
# handed to the containerised steps only (after srun's `--`, and in the environment of those
# srun calls alone). Every tool of the script runs under the site's PATH, set first.
#
# Exit codes of this script itself; any other code is the user command's own:
#   94  the staging directory cannot be read on this node, or its job.env or secrets.env is
#       not the file this attempt staged
#   95  rendezvous failed: the first node is unknown, no free port could be picked on it, or
#       the Ray head never became healthy
#   96  secrets.env is expected but gone (an earlier run of this attempt consumed it)
#   97  the runtime artifact failed verification (missing, wrong magic, wrong sha256, or an
#       image-cache entry that is not the file its import recorded)
# A collective probe that failed on every rung ends the script with 1: the operator tells it
# apart by probe.record (which this script writes), never by that code.
set -euo pipefail
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH

staging_dir=/lustre/slurmjob/team-a/resnet-3f2a9c1e/attempt-1
artifact=/lustre/slurmjob/runtimes/custom-test.sif
artifact_sha256=913ae15b9bb73b8d90c813d7518bc42943b1c63fedfc13d0bf583fa148687eae
artifact_magic=SIF_MAGIC
artifact_magic_offset=32
artifact_recorded=''
readonly staging_dir artifact artifact_sha256 artifact_magic artifact_magic_offset
readonly artifact_recorded

# The user's command, one word per line, exactly as in spec.command.
# shellcheck disable=SC2054 # a word of the command may itself contain a comma
user_command=(
  python
  train.py
  --epochs
  3
)
# The names of spec.env, in the order of job.env (plain values) and secrets.env (secret ones).
plain_env_names=(EPOCHS GREETING)
secret_env_names=(HF_TOKEN)

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

# Node-local directories the script made (the Ray head's session directory): removed on exit,
# once the steps that used them have stopped.
cleanup_dirs=()
on_exit() {
  remove_secrets
  stop_background
  if ((${#cleanup_dirs[@]} > 0)); then
    rm -rf -- "${cleanup_dirs[@]}" || true
  fi
}
trap on_exit EXIT
# Turn the signals Slurm sends (scancel, time limit) into an exit, so the EXIT trap runs.
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

# srun by absolute path: `env` (in step_srun, below) looks its command up in the environment it
# builds, and that environment holds the user's variables.
srun_bin=$(type -P srun) || fail 127 "srun is not on PATH ($PATH)"
readonly srun_bin

cd -- "$staging_dir" || fail 94 "cannot enter the staging directory $staging_dir"
[[ -r job.env ]] || fail 94 "cannot read $staging_dir/job.env"
[[ -r secrets.env ]] || fail 96 "$staging_dir/secrets.env is gone: this attempt already ran once"

# Verify the runtime artifact on this node before anything starts: it exists, carries the
# format's magic bytes, and has the registry's sha256 or, for an image-cache entry, is still
# the file its import job hashed (type, owner, mode, size, inode, ctime: the same cost for any
# size, so no GPU time goes to hashing the image).
verify_artifact() {
  local magic actual
  [[ -f $artifact && -r $artifact ]] ||
    fail 97 "runtime artifact $artifact is missing or unreadable"
  magic=$(dd if="$artifact" bs=1 skip="$artifact_magic_offset" count="${#artifact_magic}" \
    2>/dev/null | tr -d '\000') || fail 97 "cannot read runtime artifact $artifact"
  [[ $magic == "$artifact_magic" ]] ||
    fail 97 "runtime artifact $artifact has no $artifact_magic magic at byte $artifact_magic_offset"
  if [[ -n $artifact_recorded ]]; then
    actual=$(stat -c '%F %u %a %s %i %.9Z' -- "$artifact") ||
      fail 97 "cannot stat image $artifact"
    [[ $actual == "$artifact_recorded" ]] ||
      fail 97 "image $artifact is not the file its import recorded: $actual, expected $artifact_recorded"
    return 0
  fi
  actual=$(sha256sum <"$artifact") || fail 97 "cannot hash runtime artifact $artifact"
  actual=${actual%% *}
  [[ $actual == "$artifact_sha256" ]] ||
    fail 97 "runtime artifact $artifact has sha256 $actual, expected $artifact_sha256"
}
verify_artifact

# How a step enters the container (apptainer): after srun's `--`, `apptainer exec` on the SIF.
# apptainer reads its own options only up to the image: the words after it are the command, so
# none of them is ever an apptainer option. Bind sources are paths under the cluster's storage
# root; the attempt's directory is bound read-only at the same path. --no-home and --contain:
# neither the user's home nor the node's /tmp, /var/tmp and /dev are shared with the container
# (only its declared mounts are), whatever the site's apptainer.conf binds by default.
# --quiet: Apptainer's own notes (INFO, WARNING) stay out of the job's stderr, where the
# spec's log patterns read; its errors still show.
container_options=()
container_runtime=(
  apptainer --quiet exec --no-home --contain --nv
  --bind /lustre/slurmjob/datasets/imagenet:/data:ro
  --bind /lustre/slurmjob/results/run-1:/results
  --bind /lustre/slurmjob/team-a/resnet-3f2a9c1e/attempt-1:/lustre/slurmjob/team-a/resnet-3f2a9c1e/attempt-1:ro
  --pwd /workspace
)
container_launcher=("${container_runtime[@]}" "$artifact")
# shared_dir_step DIR: the options and launcher of a step that also binds the node-local
# directory DIR read-write at the same path (the Ray head's session directory, which the
# command's step on that node must reach: each step is a container of its own).
shared_dir_step() {
  shared_options=()
  shared_launcher=("${container_runtime[@]}" --bind "$1:$1" "$artifact")
}
# spec.env travels as APPTAINERENV_<NAME>: apptainer sets NAME inside the container (over the
# image's own value), and srun and apptainer on the host never see it under its own name.
user_env_prefix=APPTAINERENV_

# spec.env, as data: env files hold NAME=value records, each ending in NUL. Nothing in them is
# evaluated, and each record must carry the next name rendered above, so a file changed on the
# shared storage can neither add a variable nor rename one. The records go into step_env, with
# the runtime's prefix, and from there only into the environment of the srun calls of step_srun.
step_env=()
read_env_file() {
  local file=$1 name record i=0
  shift
  local -a records=()
  [[ -f $file && ! -L $file ]] || return 1
  mapfile -d '' -t records <"$file" || return 1
  ((${#records[@]} == $#)) || return 1
  for name in "$@"; do
    record=${records[i]}
    [[ $record == "$name="* ]] || return 1
    step_env+=("$user_env_prefix$record")
    i=$((i + 1))
  done
}
read_env_file job.env "${plain_env_names[@]}" ||
  fail 94 "$staging_dir/job.env does not hold the variables this attempt staged"
# Secret values: read once, then deleted right away, so they neither stay on shared storage
# while the job runs nor show through the staging mount inside the container.
read_env_file secrets.env "${secret_env_names[@]}" ||
  fail 94 "$staging_dir/secrets.env does not hold the variables this attempt staged"
remove_secrets
# Every containerised step starts with this srun: the user's variables are in its environment
# (and so in the step's) and nowhere else. srun hands the step only what --export names (the
# site's PATH, the operator's and the launch's variables, the user's) with Slurm's own
# SLURM_*: nothing else of the batch environment reaches a container (core.containerenv).
# shellcheck disable=SC2054 # the commas separate srun's --export names inside one word
step_srun=(env -- "${step_env[@]}" "$srun_bin" --export=PATH,SLURMJOB_NAMESPACE,SLURMJOB_NAME,SLURMJOB_UID,SLURMJOB_ATTEMPT,SLURMJOB_STAGING_DIR,SLURMJOB_NODE_COUNT,SLURMJOB_ARRAY_INDEX,MASTER_ADDR,MASTER_PORT,WORLD_SIZE,NODE_RANK,NUM_GPU_PER_NODE,RAY_ADDRESS,RAY_AUTH_MODE,RAY_AUTH_TOKEN,APPTAINERENV_EPOCHS,APPTAINERENV_GREETING,APPTAINERENV_HF_TOKEN)

# Rendezvous for multi-node launchers: the first node of the whole job is the master.
# WORLD_SIZE is the node count (TAO's meaning), not a process count.
first_nodes=()
mapfile -t first_nodes < <(scontrol show hostnames "${SLURM_JOB_NODELIST:-}")
head_node=${first_nodes[0]:-}
[[ -n $head_node ]] || fail 95 "cannot tell the job's first node from Slurm's node list"
export MASTER_ADDR=$head_node
# Rendezvous ports, picked for this job on the first node (where this script runs) just before
# the steps start, never fixed: a fixed port is one a job sharing the node can take first (the
# ranks or Ray workers would then join that job) and one two jobs on a node collide on. They
# reach the other nodes only through this script (srun's arguments and environment).
# free_ports COUNT LOW HIGH: COUNT distinct ports drawn at random between LOW and HIGH, none
# bound by any socket of any user (TCP or UDP, IPv4 or IPv6, listening or not: /proc/net) or
# reserved by the kernel. Only bash, /proc and coreutils (od, cut, sort, as sha256sum above)
# are used: a Slurm node is sure to have them, not python3, perl or nc. Between the pick and the
# launcher's bind another process could still take the port: the launcher then fails to
# bind, and the job fails (docs/security.md, "Rendezvous ports on shared nodes").
free_ports() {
  local count=$1 low=$2 high=$3 file port draw entry
  local -a used=() draws=() picked=() reserved=()
  for file in /proc/net/tcp /proc/net/tcp6 /proc/net/udp /proc/net/udp6; do
    [[ -r $file ]] || continue
    # Each line's local port (the 4 hex digits after the second ':'), each once: cut and
    # sort do the node's many thousand sockets in C; bash then sees only distinct ports.
    while read -r port; do
      if [[ $port =~ ^[0-9A-Fa-f]{4}$ ]]; then
        used[16#$port]=1
      fi
    done < <(cut -s -d: -f3 "$file" | cut -c1-4 | sort -u)
  done
  if [[ -r /proc/sys/net/ipv4/ip_local_reserved_ports ]]; then
    IFS=, read -r -a reserved </proc/sys/net/ipv4/ip_local_reserved_ports || true
  fi
  read -r -d '' -a draws < <(od -An -v -tu4 -N1024 /dev/urandom) || true
  for draw in "${draws[@]}"; do
    ((${#picked[@]} < count)) || break
    port=$((low + draw % (high - low + 1)))
    [[ -z ${used[port]:-} ]] || continue
    for entry in "${reserved[@]}"; do
      [[ $entry =~ ^([0-9]+)(-([0-9]+))?$ ]] || continue
      if ((port >= BASH_REMATCH[1] && port <= ${BASH_REMATCH[3]:-${BASH_REMATCH[1]}})); then
        continue 2
      fi
    done
    used[port]=1
    picked+=("$port")
  done
  ((${#picked[@]} == count)) || return 1
  printf '%s\n' "${picked[@]}"
}
[[ ${SLURMD_NODENAME:-} == "$head_node" ]] ||
  fail 95 "this script runs on ${SLURMD_NODENAME:-an unnamed node}, not on the job's first node $head_node, so it cannot pick a free port there"
# The kernel's ephemeral range: where it would put a socket bound to port 0.
read -r port_low port_high </proc/sys/net/ipv4/ip_local_port_range ||
  fail 95 "cannot read the kernel's port range"
job_ports=()
mapfile -t job_ports < <(free_ports 5 "$port_low" "$port_high")
((${#job_ports[@]} == 5)) ||
  fail 95 "no free port on $head_node for the rendezvous"
master_port=${job_ports[0]}
ray_port=${job_ports[1]}
ray_client_port=${job_ports[2]}
ray_dashboard_port=${job_ports[3]}
ray_agent_port=${job_ports[4]}
export MASTER_PORT=$master_port
export WORLD_SIZE=2
export SLURMJOB_NODE_COUNT=2
export NUM_GPU_PER_NODE=8
# The command runs on the first node: rank 0. Ray workers and the per-node shapes' tasks
# compute their own rank.
export NODE_RANK=0

# Settings the steps of the command run with: none, unless the collective probe (or a fresh
# cache entry) chose a rung of the site's ladder. They are set inside the container, each
# word exported as given (the site's names and values), then the command's words follow.
rung_env=()
# shellcheck disable=SC2016 # expanded by sh inside the container, not here
rung_wrapper='while [ "$1" != -- ]; do export "$1"; shift; done; shift; exec "$@"'
probe_record=$staging_dir/probe.record
set_rung() {
  local -a vars=()
  case $1 in
    0) vars=() ;;
    1) vars=('NCCL_P2P_DISABLE=1') ;;
    2) vars=('NCCL_IB_DISABLE=1' 'NCCL_P2P_DISABLE=1') ;;
  esac
  rung_env=()
  if ((${#vars[@]} > 0)); then
    rung_env=(sh -c "$rung_wrapper" sh "${vars[@]}" --)
  fi
}

# The collective probe is skipped: the cache names rung 1 for
# this job's tenant, cluster, partition, runtime and GPU series.
set_rung 1
printf 'result skipped %s\n' 1 >"$probe_record"

# GPU job: a Ray cluster over every node of the job. The head runs on the first node, a worker
# on every other node; then the command runs on the head. Ray runs inside the container.
# --overlap on every step: the steps share the allocation's CPUs, memory and GPUs. Every srun's
# options end with `--`: what follows is the container launcher and the command, never options.
# Ray's own steps write to ray.log in the staging directory, so that stdout and stderr hold the
# command's output (and not srun's notices when the Ray steps are stopped at the end).
# Every port Ray opens is this job's: the head's GCS, client server, dashboard and dashboard
# agent ports were picked free on the first node (rendezvous.sh.j2); the node manager, object
# manager and workers bind port 0 (the kernel chooses; Ray reports the port it got), and the
# runtime-env agent, metrics export and agent gRPC ports are Ray's own random picks. Each
# node's object store is 30% of the memory Slurm gave the job there (Ray's default would take
# 30% of the whole machine's).
# On the other nodes the dashboard agent takes the head's number: drawn at random, not checked
# there (Ray keeps an agent whose HTTP port is taken, without that service).
ray_address=$head_node:$ray_port
ray_log=$staging_dir/ray.log
ray_node_ports=(--dashboard-agent-listen-port="$ray_agent_port" --node-manager-port=0
  --object-manager-port=0 --min-worker-port=0 --max-worker-port=0)

# Ray 2.52 and later authenticate every call with a token when RAY_AUTH_MODE=token: this job's
# own, made here and handed to the Ray steps and the command only through srun's environment
# (never a file), so that no other job's process can join or drive this cluster. Earlier
# versions ignore both variables.
ray_token=$(od -An -v -tx1 -N32 /dev/urandom) || fail 95 "cannot read /dev/urandom"
ray_token=${ray_token//[!0-9a-f]/}
((${#ray_token} == 64)) || fail 95 "cannot make the Ray cluster's token"
export RAY_AUTH_MODE=token
export RAY_AUTH_TOKEN=$ray_token
# Whatever Ray prints about its cluster stays the job user's: ray.log is not world-readable.
(umask 077 && : >>"$ray_log") || fail 95 "cannot create $ray_log"

# Ray's session directory (--temp-dir): node-local, made here on the first node, where the
# head and the command run. Both their steps mount it (shared_dir_step): each step is a
# container of its own, and the command's driver reaches the head's raylet through a socket
# in it. The other nodes' raylets keep theirs inside their own containers.
ray_tmp=$(mktemp -d /tmp/slurmjob-ray.XXXXXXXX) || fail 95 "cannot make Ray's session directory in /tmp"
cleanup_dirs+=("$ray_tmp")
shared_dir_step "$ray_tmp"

# The head's step asks its own head for health, inside its container, and marks it ready in
# the session directory: one container for the head, however long it takes. (A health check
# per probe was a container per probe: with Pyxis' use_squashfuse=0, an unpacked image each.)
# shellcheck disable=SC2016 # expanded by sh inside the container, not here
head_wrapper='ready=$1 address=$2; shift 2; "$@" & head=$!
until ray health-check --address "$address" >/dev/null 2>&1; do
  kill -0 "$head" 2>/dev/null || { wait "$head"; exit; }
  sleep 1
done
: >"$ready"; wait "$head"'
ray_ready_file=$ray_tmp/head-ready
"${step_srun[@]}" --overlap --nodes=1 --ntasks=1 --nodelist="$head_node" \
  "${shared_options[@]}" -- "${shared_launcher[@]}" \
  sh -c "$head_wrapper" sh "$ray_ready_file" "$ray_address" "${rung_env[@]}" \
  ray start --head --port="$ray_port" --ray-client-server-port="$ray_client_port" \
  --dashboard-port="$ray_dashboard_port" "${ray_node_ports[@]}" --temp-dir="$ray_tmp" \
  --object-store-memory=164926744166 \
  --num-gpus=8 --block \
  >>"$ray_log" 2>&1 &
head_pid=$!
background_pids+=("$head_pid")

# Wait up to 300 s for the head's step to say its head answers.
ray_ready=0
for ((try = 0; try < 300; try++)); do
  if [[ -e $ray_ready_file ]]; then
    ray_ready=1
    break
  fi
  kill -0 "$head_pid" 2>/dev/null ||
    fail 95 "the Ray head step on $head_node ended before it became healthy"
  sleep 1
done
((ray_ready == 1)) || fail 95 "the Ray head on $head_node did not become healthy in 300 s"

# Each worker exports NODE_RANK = the step's rank offset + its node's index in the step.
# shellcheck disable=SC2016 # expanded by sh inside the container, not here
node_rank_wrapper='NODE_RANK=$(($1 + ${SLURM_NODEID:-0})); export NODE_RANK; shift; exec "$@"'

# Workers on the other nodes of the first pool.
"${step_srun[@]}" --overlap --nodes=1 --ntasks=1 --ntasks-per-node=1 \
  --exclude="$head_node" "${container_options[@]}" -- "${container_launcher[@]}" "${rung_env[@]}" \
  sh -c "$node_rank_wrapper" sh 1 \
  ray start --address="$ray_address" "${ray_node_ports[@]}" \
  --object-store-memory=164926744166 --num-gpus=8 --block \
  >>"$ray_log" 2>&1 &
background_pids+=("$!")

# The command, on the head, inside the container.
export RAY_ADDRESS=$ray_address
status=0
"${step_srun[@]}" --overlap --nodes=1 --ntasks=1 --nodelist="$head_node" \
  "${shared_options[@]}" -- "${shared_launcher[@]}" "${rung_env[@]}" "${user_command[@]}" || status=$?
stop_background
exit "$status"
