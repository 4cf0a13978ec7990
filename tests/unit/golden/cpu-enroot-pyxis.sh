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
artifact=/lustre/slurmjob/runtimes/custom-test.sqsh
artifact_sha256=daa027346509e02364cb663d34b172fdadcf366c63c354adf3e827ccce7c03d1
artifact_magic=hsqs
artifact_magic_offset=0
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

# How a step enters the container (enroot-pyxis): Pyxis options of srun, before its `--`; Pyxis
# starts the command itself, so nothing comes between `--` and the command. Mount sources are
# paths under the cluster's storage root; the attempt's directory is mounted read-only at the
# same path. Pyxis takes the values of --container-env from the step's environment (where
# step_srun puts spec.env, under the variables' own names) and makes them win over the image's.
# The user's home directory is not mounted (Pyxis mounts it unless told not to, or unless the
# site's enroot.conf says ENROOT_MOUNT_HOME no): a job sees only its declared mounts.
# shellcheck disable=SC2054 # the commas separate Pyxis mounts (env names) inside one word
container_options=(
  --container-image=/lustre/slurmjob/runtimes/custom-test.sqsh
  --no-container-mount-home
  --container-mounts=/lustre/slurmjob/datasets/imagenet:/data:ro,/lustre/slurmjob/results/run-1:/results,/lustre/slurmjob/team-a/resnet-3f2a9c1e/attempt-1:/lustre/slurmjob/team-a/resnet-3f2a9c1e/attempt-1:ro
  --container-env=EPOCHS,GREETING,HF_TOKEN
  --container-workdir=/workspace
)
container_launcher=()
user_env_prefix=''

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
step_srun=(env -- "${step_env[@]}" "$srun_bin" --export=PATH,SLURMJOB_NAMESPACE,SLURMJOB_NAME,SLURMJOB_UID,SLURMJOB_ATTEMPT,SLURMJOB_STAGING_DIR,SLURMJOB_NODE_COUNT,SLURMJOB_ARRAY_INDEX,MASTER_ADDR,MASTER_PORT,WORLD_SIZE,NODE_RANK,NUM_GPU_PER_NODE,RAY_ADDRESS,RAY_AUTH_MODE,RAY_AUTH_TOKEN,EPOCHS,GREETING,HF_TOKEN)

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
mapfile -t job_ports < <(free_ports 1 "$port_low" "$port_high")
((${#job_ports[@]} == 1)) ||
  fail 95 "no free port on $head_node for the rendezvous"
master_port=${job_ports[0]}
export MASTER_PORT=$master_port
export WORLD_SIZE=1
export SLURMJOB_NODE_COUNT=1
export NUM_GPU_PER_NODE=0
# The command runs on the first node: rank 0. Ray workers and the per-node shapes' tasks
# compute their own rank.
export NODE_RANK=0

# Settings the steps of the command run with: none, unless the collective probe (or a fresh
# cache entry) chose a rung of the site's ladder. They are set inside the container, each
# word exported as given (the site's names and values), then the command's words follow.
rung_env=()

# CPU-only job: one plain step on the one node, no GPUs, no Ray.
status=0
"${step_srun[@]}" --overlap --nodes=1 --ntasks=1 "${container_options[@]}" -- \
  "${container_launcher[@]}" "${rung_env[@]}" "${user_command[@]}" || status=$?
exit "$status"
