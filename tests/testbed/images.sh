#!/usr/bin/env bash
# The container images the test bed's jobs run in (through Enroot+Pyxis and Apptainer), built
# from Debian packages and PyPI and cached by content (idempotent, seconds when cached).
#
#   base  debootstrap --variant=minbase of Debian trixie (neither the host's bookworm nor the
#         forky of the second cluster, so a test can tell it is inside the image), with bash,
#         coreutils, python3, procps and util-linux, and the site's collective probe
#         (tests/testbed/standins/collective-probe, a stand-in: the GPUs are fake) in
#         /usr/local/bin.
#   ray   base plus real Ray (RAY_REQ below) in a venv at /opt/ray, `ray` in /usr/local/bin.
#         ray[default]: plain `ray` refuses the batch script's --ray-client-server-port. Kept
#         apart because every job hashes and copies its image: 157 MB of squashfs against 40.
# Both carry /etc/slurmjob-testbed-image, "slurmjob-testbed-image name=NAME key=KEY ...", which
# the tests read (with /etc/os-release) from inside the container.
#
# What a build leaves, under $CACHE/images:
#   rootfs-<key>/root          the debootstrap tree (its own key: a change of the probe or of
#                              Ray does not redo debootstrap)
#   raylayer-<key>/root        that tree plus the Ray venv (pip install is the slow step)
#   <name>-<key>/image.sqsh    squashfs (zstd, all files root's, no xattrs, timestamps 0; /dev
#                              empty: unsquashfs as an unprivileged user cannot create nodes)
#   <name>-<key>/image.sif     a SIF holding that same squashfs as its root partition (made by
#                              `apptainer sif`, no container run)
#   <name>-<key>/*.sha256      sha256sum lines of both
#   <name>-<key>/.complete     written last; a directory without it is removed and rebuilt
# Every key is the first 16 hex digits of a sha256 over what decides the content.
#
# Usage: images.sh    prints one line per image on stdout, NAME=DIRECTORY, e.g.
#   base=/var/cache/slurmjob-testbed/images/base-0123456789abcdef
# Environment: SLURMJOB_TESTBED_MIRROR (Debian mirror, default http://deb.debian.org/debian;
# not part of any key: every mirror serves the same trixie), SLURMJOB_TESTBED_CACHE (instead of
# /var/cache/slurmjob-testbed, e.g. to time a cold build beside a cache in use),
# SLURMJOB_TESTBED_APPTAINER (default /opt/slurmjob-apptainer/bin/apptainer; the SIF needs it,
# built by runtimes.sh).
set -euo pipefail

CACHE="${SLURMJOB_TESTBED_CACHE:-/var/cache/slurmjob-testbed}"
IMAGES="$CACHE/images"
HERE="$(cd "$(dirname "$0")" && pwd)"
MIRROR="${SLURMJOB_TESTBED_MIRROR:-http://deb.debian.org/debian}"
APPTAINER="${SLURMJOB_TESTBED_APPTAINER:-/opt/slurmjob-apptainer/bin/apptainer}"
PROBE="$HERE/standins/collective-probe"
# torchrun stays a stand-in (docs/development.md): PyPI's torch for Linux pulls 2.3 GB of
# CUDA wheels and does not import without them, and the CPU-only index is out of reach here.
TORCHRUN="$HERE/standins/torchrun"

# The recipe. Bump TREE_RECIPE when a command that makes the trees (debootstrap, pip, pruning)
# changes, IMAGE_RECIPE when one that makes the images from them (marker, squashfs, SIF) does;
# an edit elsewhere in this script must not cost a rebuild.
TREE_RECIPE=2
IMAGE_RECIPE=2
SUITE=trixie
ROOTFS_PKGS=(python3 python3-venv procps util-linux)
RAY_VERSION=2.60.0
RAY_REQ="ray[default]==$RAY_VERSION"
# Removed from every tree: caches, docs, logs (the image stays small), and ldconfig's
# aux-cache (inode numbers and times: with it gone, two builds on one day give the same trees).
PRUNE=(var/cache/apt var/lib/apt/lists usr/share/doc usr/share/man usr/share/info
    usr/share/lintian usr/share/linda var/cache/debconf/templates.dat-old var/log
    var/cache/ldconfig/aux-cache)

log() { printf "[testbed-images] %s\n" "$*" >&2; }
die() {
    printf '[testbed-images] ERROR: %s\n' "$*" >&2
    exit 1
}
[[ $(id -u) -eq 0 ]] || die "must run as root (debootstrap, chroot, mounts)"
for tool in debootstrap mksquashfs unsquashfs chroot sha256sum flock; do
    command -v "$tool" >/dev/null || die "$tool is missing (apt-get install debootstrap squashfs-tools)"
done
[[ -r $PROBE ]] || die "the probe program $PROBE is missing"
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8

key_of() { # the arguments, one a line -> 16 hex digits
    printf '%s\n' "$@" | sha256sum | cut -c1-16
}

# ---------------------------------------------------------------- mounts
# Every mount this script makes is under a tree in $IMAGES; all are undone on exit, and a
# build checks /proc/mounts rather than trusting that.
MOUNTED_ROOTS=()
mounts_under() { # $1 = directory -> its mount points, deepest first
    awk -v d="$1" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/mounts | sort -r
}
unmount_all() { # $1 = directory
    local m
    while read -r m; do
        [[ -n $m ]] || continue
        umount "$m" 2>/dev/null || umount -l "$m" || true
    done < <(mounts_under "$1")
    [[ -z $(mounts_under "$1") ]] || die "could not unmount under $1: $(mounts_under "$1" | tr '\n' ' ')"
}
cleanup() {
    local r
    for r in "${MOUNTED_ROOTS[@]}"; do unmount_all "$r"; done
    [[ -z ${WORK:-} ]] || rm -rf --one-file-system "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- cache
install -d -m 0755 "$IMAGES"
exec 9>"$IMAGES/.lock"
flock 9 || die "cannot lock $IMAGES/.lock"
# Under the lock nothing else builds: whatever is half-made is from a run that died.
for stale in "$IMAGES"/.tmp-* "$IMAGES"/*-*; do
    [[ -e $stale ]] || continue
    [[ $stale != */.tmp-* && -f $stale/.complete ]] && continue
    log "removing the incomplete $stale"
    unmount_all "$stale"
    rm -rf --one-file-system "$stale"
done
WORK=""

# Build a cache entry: $1 = final directory, then the command that fills its argument
# (a fresh directory). The entry appears complete or not at all.
cached() {
    local out=$1 t0=$SECONDS
    shift
    if [[ -f $out/.complete ]]; then
        log "cached: $out"
        return 0
    fi
    WORK=$(mktemp -d "$IMAGES/.tmp-$(basename "$out")-XXXXXX")
    chmod 0755 "$WORK"
    "$@" "$WORK"
    [[ -z $(mounts_under "$WORK") ]] || die "a mount is left under $WORK"
    touch "$WORK/.complete"
    mv -T "$WORK" "$out"
    WORK=""
    log "built $(basename "$out") in $((SECONDS - t0)) s"
}

# Make a tree an image's (the arguments: the root, then more directories to compile): caches, docs, translations and logs out; Python's bytecode compiled
# anew as unchecked-hash .pyc (the squashfs sets every mtime to 0, which would make Debian's
# timestamp-checked .pyc stale, and a read-only image cannot rewrite them: every `ray` call would
# compile Ray again); /dev, /tmp empty; no host name, machine id or DNS of the build host.
prune_tree() {
    local root=$1 p
    shift
    for p in "${PRUNE[@]}"; do rm -rf --one-file-system "${root:?}/$p"; done
    install -d -m 0755 "$root/var/log" "$root/var/cache/apt" "$root/var/lib/apt/lists"
    find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
    find "$root" -xdev -name __pycache__ -type d -prune -exec rm -rf {} +
    chroot_up "$root"
    local -a dirs=()
    for p in "$root"/usr/lib/python3*; do dirs+=("${p#"$root"}"); done
    chroot "$root" env -i PATH=/usr/bin:/bin python3 -m compileall -q -j 2 \
        --invalidation-mode unchecked-hash "${dirs[@]}" "$@" >/dev/null ||
        die "compiling the Python files of $root failed"
    unmount_all "$root"
    find "$root/dev" "$root/tmp" "$root/var/tmp" -mindepth 1 -delete
    rm -f "$root/etc/machine-id" "$root/var/lib/dbus/machine-id"
    : >"$root/etc/resolv.conf"
    echo slurmjob-testbed >"$root/etc/hostname"
}

# A chroot where pip and compileall work: /proc, a /dev on a tmpfs with the usual nodes and
# /dev/shm, the host's DNS. unmount_all undoes it.
chroot_up() { # $1 = root
    MOUNTED_ROOTS+=("$1")
    mount -t proc proc "$1/proc"
    mount -t tmpfs -o mode=0755,size=64m testbed-images-dev "$1/dev"
    local n name major minor
    for n in null:1:3 zero:1:5 random:1:8 urandom:1:9; do
        IFS=: read -r name major minor <<<"$n"
        mknod -m 0666 "$1/dev/$name" c "$major" "$minor"
    done
    install -d -m 1777 "$1/dev/shm"
    cp -L /etc/resolv.conf "$1/etc/resolv.conf"
}

# ---------------------------------------------------------------- rootfs
ROOTFS_KEY=$(key_of "recipe=$TREE_RECIPE" "suite=$SUITE" "variant=minbase" "pkgs=${ROOTFS_PKGS[*]}")
ROOTFS="$IMAGES/rootfs-$ROOTFS_KEY"

build_rootfs() { # $1 = entry directory
    local root=$1/root t0=$SECONDS
    log "debootstrap $SUITE (minbase + ${ROOTFS_PKGS[*]}) from $MIRROR"
    MOUNTED_ROOTS+=("$root")
    local include
    include=$(
        IFS=,
        echo "${ROOTFS_PKGS[*]}"
    )
    debootstrap --variant=minbase --include="$include" "$SUITE" "$root" "$MIRROR" \
        >"$1/debootstrap.log" 2>&1 ||
        die "debootstrap of $SUITE failed: $(tail -15 "$1/debootstrap.log")"
    log "debootstrap itself took $((SECONDS - t0)) s"
    unmount_all "$root"
    chroot "$root" apt-get clean
    prune_tree "$root"
    log "rootfs made in $((SECONDS - t0)) s, tree $(du -sm "$root" | cut -f1) MB"
}
cached "$ROOTFS" build_rootfs

# ---------------------------------------------------------------- Ray layer
RAY_KEY=$(key_of "rootfs=$ROOTFS_KEY" "recipe=$TREE_RECIPE" "ray=$RAY_REQ")
RAYLAYER="$IMAGES/raylayer-$RAY_KEY"

build_raylayer() { # $1 = entry directory
    local root=$1/root t0=$SECONDS
    cp -a "$ROOTFS/root" "$root"
    chroot_up "$root"
    log "pip install $RAY_REQ into /opt/ray (the image's python3)"
    # pip runs with a clean environment (the host's PIP_* settings name host paths) and the
    # host's CA bundle (a TLS-intercepting proxy's CA may be in it), copied to the tree's /tmp,
    # which prune_tree empties.
    local -a pipenv=(env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LC_ALL=C.UTF-8
        PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_NO_INPUT=1
        PIP_DEFAULT_TIMEOUT="${PIP_DEFAULT_TIMEOUT:-180}")
    local ca=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}} v
    if [[ -f $ca ]]; then
        cp -L "$ca" "$root/tmp/host-ca.crt"
        pipenv+=(PIP_CERT=/tmp/host-ca.crt)
    fi
    for v in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST https_proxy HTTPS_PROXY; do
        [[ -z ${!v:-} ]] || pipenv+=("$v=${!v}")
    done
    (
        chroot "$root" "${pipenv[@]}" python3 -m venv /opt/ray &&
            chroot "$root" "${pipenv[@]}" /opt/ray/bin/pip install -q "$RAY_REQ"
    ) >"$1/pip.log" 2>&1 || die "pip install of $RAY_REQ failed: $(tail -15 "$1/pip.log")"
    log "pip itself took $((SECONDS - t0)) s"
    unmount_all "$root"
    ln -sfn /opt/ray/bin/ray "$root/usr/local/bin/ray"
    prune_tree "$root" /opt/ray
    log "Ray installed in $((SECONDS - t0)) s, tree $(du -sm "$root" | cut -f1) MB"
}
cached "$RAYLAYER" build_raylayer

# ---------------------------------------------------------------- images
PROBE_SHA=$(cat "$PROBE" "$TORCHRUN" | sha256sum | cut -d' ' -f1)
# Which tree each image starts from, and what else decides its content.
declare -A IMAGE_TREE=([base]="$ROOTFS/root" [ray]="$RAYLAYER/root")
declare -A IMAGE_INPUTS=([base]="rootfs=$ROOTFS_KEY" [ray]="raylayer=$RAY_KEY ray=$RAY_REQ")
IMAGE_NAMES=(base ray)

build_image() { # $1 = image name, $2 = image key, $3 = entry directory
    local name=$1 key=$2 out=$3 t0=$SECONDS root=$3/root
    [[ -x $APPTAINER ]] || die "Apptainer is missing at $APPTAINER (tests/testbed/runtimes.sh builds it;
    or set SLURMJOB_TESTBED_APPTAINER): the SIF images need its 'sif' command"
    cp -a "${IMAGE_TREE[$name]}" "$root"
    install -m 0755 "$PROBE" "$root/usr/local/bin/collective-probe"
    install -m 0755 "$TORCHRUN" "$root/usr/local/bin/torchrun"
    # The examples' working directory, as NGC's images have it: a container's working
    # directory must exist in its image (Apptainer refuses to start without it).
    install -d -m 0755 "$root/workspace"
    printf 'slurmjob-testbed-image name=%s key=%s suite=%s%s\n' "$name" "$key" "$SUITE" \
        "$([[ $name == ray ]] && printf ' ray=%s' "$RAY_VERSION")" \
        >"$root/etc/slurmjob-testbed-image"
    [[ -z $(find "$root/dev" -mindepth 1 -print -quit) ]] || die "$root/dev is not empty"
    mksquashfs "$root" "$out/image.sqsh" -noappend -comp zstd -all-root -no-xattrs \
        -mkfs-time 0 -all-time 0 -no-progress -quiet >"$out/mksquashfs.log" 2>&1 ||
        die "mksquashfs failed: $(tail -15 "$out/mksquashfs.log")"
    rm -f "$out/mksquashfs.log"
    log "$name: mksquashfs took $((SECONDS - t0)) s, tree $(du -sm "$root" | cut -f1) MB," \
        "squashfs $(du -m "$out/image.sqsh" | cut -f1) MB"
    rm -rf --one-file-system "$root"
    # The SIF: the same squashfs as its primary root partition (data type 4 = partition, fs
    # 1 = squashfs, partition type 2 = primary system, the one Apptainer runs; arch 2 = amd64),
    # in object group 1 as `apptainer build` puts it. Its header has a random UUID and the
    # time: the SIF is not byte-reproducible, its squashfs is.
    t0=$SECONDS
    "$APPTAINER" sif new "$out/image.sif" >/dev/null
    "$APPTAINER" sif add --datatype 4 --partfs 1 --parttype 2 --partarch 2 --groupid 1 \
        "$out/image.sif" "$out/image.sqsh" >/dev/null ||
        die "apptainer sif add failed for $out/image.sif"
    log "$name: SIF built in $((SECONDS - t0)) s, $(du -m "$out/image.sif" | cut -f1) MB"
    verify_image "$name" "$out"
    (cd "$out" && sha256sum image.sqsh >image.sqsh.sha256 && sha256sum image.sif >image.sif.sha256)
}

verify_image() { # $1 = name, $2 = entry directory
    local name=$1 out=$2 listing want
    listing=$(unsquashfs -l "$out/image.sqsh") || die "unsquashfs cannot list $out/image.sqsh"
    for want in etc/os-release etc/slurmjob-testbed-image usr/local/bin/collective-probe \
        usr/local/bin/torchrun workspace \
        usr/bin/python3 usr/bin/bash usr/bin/ps usr/bin/kill; do
        grep -qx "squashfs-root/$want" <<<"$listing" || die "$name: /$want is not in the squashfs"
    done
    [[ $name != ray ]] || grep -qx squashfs-root/usr/local/bin/ray <<<"$listing" ||
        die "$name: /usr/local/bin/ray is not in the squashfs"
    [[ $(unsquashfs -cat "$out/image.sqsh" etc/slurmjob-testbed-image) == \
        "slurmjob-testbed-image name=$name "* ]] || die "$name: the squashfs has a wrong marker"
    unsquashfs -cat "$out/image.sqsh" usr/lib/os-release | grep -qx "VERSION_CODENAME=$SUITE" ||
        die "$name: the squashfs's os-release is not Debian $SUITE's"
    unsquashfs -s "$out/image.sqsh" | grep -q 'Compression zstd' ||
        die "$name: the squashfs is not zstd-compressed"
    "$APPTAINER" sif list "$out/image.sif" | grep -q 'FS.*Squashfs' ||
        die "$name: the SIF has no squashfs partition: $("$APPTAINER" sif list "$out/image.sif")"
}

for name in "${IMAGE_NAMES[@]}"; do
    key=$(key_of "recipe=$IMAGE_RECIPE" "image=$name" "${IMAGE_INPUTS[$name]}" "probe=$PROBE_SHA")
    dir="$IMAGES/$name-$key"
    cached "$dir" build_image "$name" "$key"
    printf '%s=%s\n' "$name" "$dir"
done
