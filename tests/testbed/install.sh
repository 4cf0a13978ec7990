#!/usr/bin/env bash
# Install everything the integration-test clusters need (idempotent, fast when done):
#   * host packages: Debian 12's Slurm 22.05 (+ JWT plugin, headers), munge, gcc, debootstrap;
#   * users: slurmrest (runs slurmrestd) and slurmci (job owner, fixed uid/gid);
#   * a debootstrap chroot with Slurm 26.05 from Debian testing, cached under
#     /var/cache/slurmjob-testbed/<suite>-chroot and built only once;
#   * the container runtimes (Enroot, Apptainer) in both roots: runtimes.sh;
#   * the images the jobs run in: images.sh.
# Daemons are started by tests/testbed/slurm.py, not here.
set -euo pipefail

SUITE="${SLURMJOB_TESTBED_SUITE:-forky}"
MIRROR="${SLURMJOB_TESTBED_MIRROR:-http://deb.debian.org/debian}"
CACHE="/var/cache/slurmjob-testbed"
CHROOT="$CACHE/$SUITE-chroot"
MARKER="$CHROOT/.slurmjob-testbed-complete"
CHROOT_VERSION=1 # bump to force a rebuild when the package list below changes
CI_UID=2001
CI_GID=2001
TENANT_UID_BASE=2101 # team-a 2101, team-b 2102
IMAGE_CACHE_UID=2201 # slurmimg: the image cache's user (docs/images.md), its import jobs
TESTBED_ROOT=/srv/slurmjob-testbed

HOST_PKGS=(slurmctld slurmd slurmrestd slurm-client slurm-wlm-jwt-plugin munge
    libslurm-dev gcc libc6-dev debootstrap python3 util-linux acl)
CHROOT_BASE_PKGS=slurmctld,slurmd,slurmrestd,slurm-client,munge,python3,procps,ca-certificates
CHROOT_EXTRA_PKGS=(slurm-wlm-jwt-plugin libslurm-dev gcc libc6-dev)
# Accounting for the 26.05 cluster: slurmdbd on a MariaDB of its own (started by slurm.py).
# Installed into an existing chroot too, without rebuilding it.
CHROOT_ACCOUNTING_PKGS=(slurmdbd slurm-wlm-mysql-plugin mariadb-server-core mariadb-client-core)

log() { printf '[testbed-install] %s\n' "$*"; }
die() {
    printf '[testbed-install] ERROR: %s\n' "$*" >&2
    exit 1
}

[[ $(id -u) -eq 0 ]] || die "must run as root (installs packages, creates users, builds a chroot)"
export DEBIAN_FRONTEND=noninteractive

# ---------------------------------------------------------------- host packages
missing=()
for p in "${HOST_PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
if ((${#missing[@]})); then
    log "installing host packages: ${missing[*]}"
    t0=$SECONDS
    apt-get update -q || die "apt-get update failed"
    apt-get install -y -q --no-install-recommends "${missing[@]}" ||
        die "apt-get install failed for: ${missing[*]}"
    log "host packages installed in $((SECONDS - t0)) s"
else
    log "host packages: all present"
fi

# ---------------------------------------------------------------- users and directories
ensure_users() { # $1 = root dir ("" for the host)
    local root=$1
    local -a ch=()
    [[ -n $root ]] && ch=(chroot "$root")
    if ! "${ch[@]}" getent group slurmci >/dev/null; then
        "${ch[@]}" groupadd --gid "$CI_GID" slurmci
    fi
    if ! "${ch[@]}" getent passwd slurmci >/dev/null; then
        "${ch[@]}" useradd --uid "$CI_UID" --gid "$CI_GID" --no-create-home \
            --home-dir "$TESTBED_ROOT/storage" --shell /bin/bash slurmci
    fi
    local uid gid
    uid=$("${ch[@]}" id -u slurmci)
    gid=$("${ch[@]}" id -g slurmci)
    [[ $uid == "$CI_UID" && $gid == "$CI_GID" ]] ||
        die "user slurmci in '${root:-/}' has uid:gid $uid:$gid, expected $CI_UID:$CI_GID"
    if ! "${ch[@]}" getent passwd slurmrest >/dev/null; then
        "${ch[@]}" useradd --system --no-create-home --user-group --shell /usr/sbin/nologin slurmrest
    fi
    # Two tenants' Unix users (the tenancy tests run jobs as each), fixed ids like slurmci's.
    local name id
    for name in team-a team-b; do
        id=$TENANT_UID_BASE
        [[ $name == team-b ]] && id=$((TENANT_UID_BASE + 1))
        if ! "${ch[@]}" getent group "$name" >/dev/null; then
            "${ch[@]}" groupadd --gid "$id" "$name"
        fi
        if ! "${ch[@]}" getent passwd "$name" >/dev/null; then
            "${ch[@]}" useradd --uid "$id" --gid "$id" --no-create-home \
                --home-dir "$TESTBED_ROOT/storage" --shell /bin/bash "$name"
        fi
        [[ $("${ch[@]}" id -u "$name") == "$id" ]] ||
            die "user $name in '${root:-/}' does not have uid $id"
    done
    if ! "${ch[@]}" getent group slurmimg >/dev/null; then
        "${ch[@]}" groupadd --gid "$IMAGE_CACHE_UID" slurmimg
    fi
    if ! "${ch[@]}" getent passwd slurmimg >/dev/null; then
        "${ch[@]}" useradd --uid "$IMAGE_CACHE_UID" --gid "$IMAGE_CACHE_UID" --no-create-home \
            --home-dir "$TESTBED_ROOT/imagecache" --shell /bin/bash slurmimg
    fi
    [[ $("${ch[@]}" id -u slurmimg) == "$IMAGE_CACHE_UID" ]] ||
        die "user slurmimg in '${root:-/}' does not have uid $IMAGE_CACHE_UID"
}
ensure_users ""
# The test clusters' node names, n1 and n2 (both 127.0.0.1: one machine), must resolve on the
# host, in the chroot (slurm.py copies /etc/hosts there) and in the containers (Enroot and
# Apptainer bind /etc/hosts): a Ray worker or a torchrun rendezvous connects to the first
# node by its name. A line of its own, added once and left (it names nothing else).
if ! grep -q ' # slurmjob-testbed nodes$' /etc/hosts; then
    printf '127.0.0.1 n1 n2 # slurmjob-testbed nodes\n' >>/etc/hosts
fi
install -d -m 0755 "$TESTBED_ROOT"
install -d -m 0755 -o "$CI_UID" -g "$CI_GID" "$TESTBED_ROOT/storage" "$TESTBED_ROOT/records"
# The image cache: its user's alone; Slurm opens an import job's output in logs/ first.
install -d -m 0755 -o "$IMAGE_CACHE_UID" -g "$IMAGE_CACHE_UID" "$TESTBED_ROOT/imagecache" \
    "$TESTBED_ROOT/imagecache/logs"
install -d -m 0755 "$TESTBED_ROOT/bin" "$CACHE"

# ---------------------------------------------------------------- chroot with Slurm 26.05
unmount_under() { # unmount everything mounted below $1 (deepest first)
    local m
    while read -r m; do
        umount -l "$m" || true
    done < <(awk -v p="$1/" 'index($2, p) == 1 { print $2 }' /proc/mounts | sort -r)
}

if [[ -f $MARKER ]] && [[ $(cat "$MARKER") == "$CHROOT_VERSION" ]]; then
    log "chroot $CHROOT: complete (marker present)"
else
    log "building chroot $CHROOT (suite $SUITE, mirror $MIRROR)"
    t0=$SECONDS
    if [[ -e $CHROOT ]]; then
        log "removing incomplete chroot"
        unmount_under "$CHROOT"
        if awk -v p="$CHROOT/" 'index($2, p) == 1 { f = 1 } END { exit !f }' /proc/mounts; then
            die "cannot unmount everything below $CHROOT; refusing to delete it"
        fi
        rm -rf --one-file-system "$CHROOT"
    fi
    script_args=()
    if [[ ! -e /usr/share/debootstrap/scripts/$SUITE ]]; then
        # Older debootstraps do not know the newest testing codename; its layout is sid's.
        log "debootstrap has no script for $SUITE; using the sid script"
        script_args=(/usr/share/debootstrap/scripts/sid)
    fi
    debootstrap --variant=minbase --include="$CHROOT_BASE_PKGS" \
        "$SUITE" "$CHROOT" "$MIRROR" "${script_args[@]}" ||
        die "debootstrap of $SUITE failed (see $CHROOT/debootstrap/debootstrap.log)"
    log "debootstrap done after $((SECONDS - t0)) s"
    printf '#!/bin/sh\nexit 101\n' >"$CHROOT/usr/sbin/policy-rc.d"
    chmod 0755 "$CHROOT/usr/sbin/policy-rc.d"
    cp /etc/resolv.conf /etc/hosts "$CHROOT/etc/"
    mountpoint -q "$CHROOT/proc" || mount -t proc proc "$CHROOT/proc"
    chroot "$CHROOT" apt-get install -y -q --no-install-recommends "${CHROOT_EXTRA_PKGS[@]}" ||
        die "apt-get install in the chroot failed"
    chroot "$CHROOT" apt-get clean
    umount -l "$CHROOT/proc" || true
    ensure_users "$CHROOT"
    chroot "$CHROOT" test -f /usr/include/slurm/spank.h || die "spank.h missing in the chroot"
    # shellcheck disable=SC2016 # dpkg-query format, not a shell expansion
    ver=$(chroot "$CHROOT" dpkg-query -W -f='${Version}' slurmctld)
    log "chroot has slurmctld $ver"
    echo "$CHROOT_VERSION" >"$MARKER"
    log "chroot built in $((SECONDS - t0)) s"
fi
ensure_users "$CHROOT"
missing=()
for p in "${CHROOT_ACCOUNTING_PKGS[@]}"; do
    if ! chroot "$CHROOT" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
if ((${#missing[@]})); then
    log "installing accounting packages in the chroot: ${missing[*]}"
    t0=$SECONDS
    # No package may start a daemon inside the chroot (mariadb's postinst would).
    printf '#!/bin/sh\nexit 101\n' >"$CHROOT/usr/sbin/policy-rc.d"
    chmod 0755 "$CHROOT/usr/sbin/policy-rc.d"
    mounted_proc=0
    if ! mountpoint -q "$CHROOT/proc"; then
        mount -t proc proc "$CHROOT/proc"
        mounted_proc=1
    fi
    # A snapshot mirror may serve a Release whose Valid-Until has passed.
    chroot "$CHROOT" apt-get -o Acquire::Check-Valid-Until=false update -q ||
        die "apt-get update in the chroot failed"
    chroot "$CHROOT" apt-get install -y -q --no-install-recommends "${missing[@]}" ||
        die "apt-get install of ${missing[*]} in the chroot failed"
    chroot "$CHROOT" apt-get clean
    ((mounted_proc)) && { umount -l "$CHROOT/proc" || true; }
    log "accounting packages installed in $((SECONDS - t0)) s"
else
    log "chroot accounting packages: all present"
fi
# slurmdbd 26.05 cannot use forky's MariaDB client library (Connector/C 3.4): its first query
# fails with "Number of columns in result (=1) set execeeds maxmimum allowed number of columns
# (=0)" and slurmdbd exits. Debian 12's (3.3, the host's release) works: slurm.py starts
# slurmdbd with it first on the library path. The server stays forky's.
OLD_CLIENT_DIR="$CHROOT/opt/slurmjob-libmariadb"
if [[ ! -f $OLD_CLIENT_DIR/libmariadb.so.3 ]]; then
    log "fetching Debian 12's libmariadb3 for slurmdbd"
    work=$(mktemp -d)
    chmod 0755 "$work" # apt's download user must be able to write there
    (cd "$work" && apt-get download -q libmariadb3) || die "apt-get download libmariadb3 failed"
    dpkg-deb -x "$work"/libmariadb3_*.deb "$work/x"
    install -d -m 0755 "$OLD_CLIENT_DIR"
    install -m 0644 "$work/x/usr/lib/x86_64-linux-gnu/libmariadb.so.3" "$OLD_CLIENT_DIR/"
    rm -rf "$work"
fi
install -d -m 0755 "$CHROOT$TESTBED_ROOT"

# ---------------------------------------------------------------- container runtimes
# Enroot and Apptainer from their pinned upstream sources, on the host and in the chroot
# (cached by source hash; Pyxis is built per cluster by slurm.py).
bash "$(dirname "$0")/runtimes.sh" "$CHROOT"
# The images the jobs run in (cached by content); images/current names them for the tests
# (tests/testbed/images.py).
install -d -m 0755 "$CACHE/images"
bash "$(dirname "$0")/images.sh" >"$CACHE/images/current.tmp"
mv "$CACHE/images/current.tmp" "$CACHE/images/current"
log "done"
