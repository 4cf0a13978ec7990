#!/usr/bin/env bash
# The container runtimes of the test bed: Enroot, Pyxis and Apptainer, built from their
# upstream sources and cached by the hash of those sources (idempotent, fast when done).
#
# None of the three is in a registry this machine reaches (Apptainer's Go module is refused by
# the proxy), so their source archives come from a directory: $SLURMJOB_TESTBED_VENDOR, else
# ../shared/vendor beside the checkout when it exists, else the verified copies this script
# kept in its cache. Elsewhere, pack the same trees (see docs/development.md, "Container
# runtimes"): `git archive --prefix=NAME-VERSION/ TAG` of each upstream repository (Enroot's
# three submodules extracted the same way under deps/, Apptainer with a VERSION file), which
# gives the same uncompressed tar streams whatever the gzip.
#
# What each build leaves in $CACHE/runtimes:
#   enroot-<v>-<h>/root      a tree to copy over / (prefix /usr/local, config /etc/enroot)
#   apptainer-<v>-<h>/root   a tree to copy over / (prefix /opt/slurmjob-apptainer)
# Pyxis is built per cluster against its own spank.h by tests/testbed/slurm.py (seconds), from
# the verified archive this script leaves in $CACHE/vendor.
#
# Usage: runtimes.sh [CHROOT]   installs the runtimes on the host and, given, in the chroot.
set -euo pipefail

CACHE="/var/cache/slurmjob-testbed"
HERE="$(cd "$(dirname "$0")" && pwd)"
CHECKOUT="$(cd "$HERE/../.." && pwd)"
CHROOT="${1:-}"

# Upstream pins: the commit each archive was packed from, and the sha256 of its uncompressed
# tar stream (independent of how it was gzipped).
ENROOT_VERSION=4.1.2
ENROOT_COMMIT="v4.1.2 (submodules makeself 5742be6, musl 0784374, linux-headers c79004a)"
ENROOT_TAR_SHA256=9a45e7198989ea8fd8abad40d17424d2ad23b56109f0e19412c7a1dfeca6d658
PYXIS_VERSION=0.24.0
PYXIS_COMMIT="v0.24.0 (1075199)"
PYXIS_TAR_SHA256=ba31b7042bb541636eab9416e69800a6f6e1e6c4ed4f1b72cb7cf030f943c9d4
APPTAINER_VERSION=1.5.3
APPTAINER_COMMIT="v1.5.3 (6a76317), plus a VERSION file reading 1.5.3"
APPTAINER_TAR_SHA256=fe690cde558edb829800348243089632689b084f61696442c8634ec64a6723a0
APPTAINER_PREFIX=/opt/slurmjob-apptainer

# What the runtimes need where a slurmd runs (host and chroot), and what Apptainer's build needs.
RUNTIME_PKGS=(squashfs-tools squashfuse fuse3 jq parallel curl pigz zstd libcap2-bin
    fuse-overlayfs uidmap libseccomp2 fuse2fs cryptsetup-bin ca-certificates
    procps util-linux acl)
BUILD_PKGS=(libseccomp-dev libtalloc-dev libattr1-dev libprotobuf-c-dev pkg-config fakeroot
    make gcc libc6-dev)

log() { printf "[testbed-runtimes] %s\n" "$*" >&2; }
die() {
    printf '[testbed-runtimes] ERROR: %s\n' "$*" >&2
    exit 1
}
[[ $(id -u) -eq 0 ]] || die "must run as root (installs packages and runtimes)"
export DEBIAN_FRONTEND=noninteractive

apt_missing() { # $1 = root ("" for the host), then packages; prints the missing ones
    local root=$1 p
    shift
    local -a ch=()
    [[ -n $root ]] && ch=(chroot "$root")
    for p in "$@"; do
        "${ch[@]}" dpkg-query -W -f='${Status}' "$p" 2>/dev/null |
            grep -q 'install ok installed' || printf '%s\n' "$p"
    done
}

apt_ensure() { # $1 = root ("" for the host), then packages
    local root=$1
    shift
    local -a missing ch=()
    mapfile -t missing < <(apt_missing "$root" "$@")
    ((${#missing[@]})) || return 0
    [[ -n $root ]] && ch=(chroot "$root")
    log "installing in '${root:-/}': ${missing[*]}"
    local mounted=0
    if [[ -n $root ]] && ! mountpoint -q "$root/proc"; then
        mount -t proc proc "$root/proc"
        mounted=1
    fi
    "${ch[@]}" apt-get -o Acquire::Check-Valid-Until=false update -q >/dev/null ||
        die "apt-get update in '${root:-/}' failed"
    "${ch[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
        die "apt-get install in '${root:-/}' failed for: ${missing[*]}"
    "${ch[@]}" apt-get clean
    if ((mounted)); then umount -l "$root/proc" || true; fi
}

# ---------------------------------------------------------------- sources
vendor_dir() {
    if [[ -n ${SLURMJOB_TESTBED_VENDOR:-} ]]; then
        printf '%s\n' "$SLURMJOB_TESTBED_VENDOR"
    elif [[ -d $CHECKOUT/../shared/vendor ]]; then
        printf '%s\n' "$CHECKOUT/../shared/vendor"
    else
        printf '%s\n' "$CACHE/vendor"
    fi
}
VENDOR="$(vendor_dir)"
install -d -m 0755 "$CACHE/vendor" "$CACHE/runtimes"

# Verify an archive against its pin and keep a copy in the cache; prints the cached path.
source_archive() { # $1 = file name, $2 = expected sha256 of the tar stream, $3 = upstream
    local name=$1 want=$2 upstream=$3 src have
    src="$VENDOR/$name"
    if [[ ! -f $src ]]; then
        src="$CACHE/vendor/$name"
        [[ -f $src ]] || die "source archive $name is missing from $VENDOR (and from the cache):
    set SLURMJOB_TESTBED_VENDOR to a directory holding it, packed from $upstream as
    docs/development.md ('Container runtimes') says"
    fi
    have=$(gzip -dc "$src" | sha256sum | cut -d' ' -f1)
    [[ $have == "$want" ]] || die "source archive $src differs from the pinned $upstream:
    its tar stream has sha256 $have, expected $want"
    if [[ $src != "$CACHE/vendor/$name" ]]; then
        cp "$src" "$CACHE/vendor/$name.tmp" && mv "$CACHE/vendor/$name.tmp" "$CACHE/vendor/$name"
    fi
    printf '%s\n' "$CACHE/vendor/$name"
}

ENROOT_SRC=$(source_archive "enroot-$ENROOT_VERSION.tar.gz" "$ENROOT_TAR_SHA256" \
    "github.com/NVIDIA/enroot $ENROOT_COMMIT")
source_archive "pyxis-$PYXIS_VERSION.tar.gz" "$PYXIS_TAR_SHA256" \
    "github.com/NVIDIA/pyxis $PYXIS_COMMIT" >/dev/null
APPTAINER_SRC=$(source_archive "apptainer-$APPTAINER_VERSION.tar.gz" "$APPTAINER_TAR_SHA256" \
    "github.com/apptainer/apptainer $APPTAINER_COMMIT")

# A build's cache key: the source's tar stream and the recipe's version (bump RECIPE when a
# build command below changes; an edit elsewhere in this script must not cost a rebuild).
ENROOT_RECIPE=2
APPTAINER_RECIPE=2
recipe_hash() { # $1 = tar sha256, $2 = recipe version
    printf '%s recipe-%s\n' "$1" "$2" | sha256sum | cut -c1-16
}

# ---------------------------------------------------------------- builds
apt_ensure "" "${RUNTIME_PKGS[@]}" "${BUILD_PKGS[@]}"

build_enroot() {
    local out=$CACHE/runtimes/enroot-$ENROOT_VERSION-$(recipe_hash "$ENROOT_TAR_SHA256" "$ENROOT_RECIPE")
    if [[ ! -f $out/.complete ]]; then
        log "building Enroot $ENROOT_VERSION"
        local t0=$SECONDS work
        work=$(mktemp -d)
        tar -xzf "$ENROOT_SRC" -C "$work"
        rm -rf "$out"
        # Helpers statically linked against the bundled musl; prefix /usr/local so that
        # enroot is on slurmd's PATH in both roots.
        make -C "$work/enroot-$ENROOT_VERSION" -j2 install prefix=/usr/local \
            sysconfdir=/etc DESTDIR="$out/root" >"$work/build.log" 2>&1 ||
            die "Enroot build failed: $(tail -20 "$work/build.log")"
        # The install wrote the staging directory into enroot's paths; take it out, as
        # enroot's own `make dist` does. Its file capabilities are set where it is installed
        # (install_into: the image cache's imports run as a user).
        sed -i "s;$out/root;;" "$out/root/usr/local/bin/enroot" "$out/root/etc/enroot/enroot.conf"
        rm -rf "$work"
        touch "$out/.complete"
        log "Enroot built in $((SECONDS - t0)) s"
    fi
    printf '%s\n' "$out"
}

build_apptainer() {
    local out=$CACHE/runtimes/apptainer-$APPTAINER_VERSION-$(recipe_hash "$APPTAINER_TAR_SHA256" "$APPTAINER_RECIPE")
    if [[ ! -f $out/.complete ]]; then
        log "building Apptainer $APPTAINER_VERSION (8-17 minutes on two cores, once)"
        local t0=$SECONDS work
        work=$(mktemp -d)
        tar -xzf "$APPTAINER_SRC" -C "$work"
        rm -rf "$out"
        (
            cd "$work/apptainer-$APPTAINER_VERSION"
            # Without libsubid: the one library of the host's (Debian 12's libsubid.so.4) that
            # the chroot's newer release lacks (it has .so.6), so that one build runs in both
            # roots. libsubid serves only --fakeroot's id ranges, which no job here uses.
            ./mconfig --without-suid --without-libsubid -p "$APPTAINER_PREFIX" &&
                make -C builddir &&
                make -C builddir install DESTDIR="$out/root"
        ) >"$work/build.log" 2>&1 || die "Apptainer build failed: $(tail -30 "$work/build.log")"
        rm -rf "$work"
        touch "$out/.complete"
        log "Apptainer built in $((SECONDS - t0)) s"
    fi
    printf '%s\n' "$out"
}

ENROOT_BUILD=$(build_enroot)
APPTAINER_BUILD=$(build_apptainer)

# ---------------------------------------------------------------- install into a root
# Enroot's per-user paths: a directory per job user, made by root and owned by that user, in
# each root (the host's and the chroot's are separate trees), so that no user can prepare or
# read another's runtime, cache or data directory. The users are install.sh's.
ENROOT_USERS=(slurmci team-a team-b)
ENROOT_DIR=/var/lib/slurmjob-enroot
# The CA bundle Enroot's curl verifies registries with: Debian's bundle plus the CA of the
# test bed's registries, written by tests/testbed/registry.py when it starts them. Under
# /srv/slurmjob-testbed, which slurm.py binds into the chroot at the same path: one file for
# both roots. Until the registries first start, a copy of the root's own bundle.
REGISTRY_CA_BUNDLE=/srv/slurmjob-testbed/registry/ca-bundle.crt

install_into() { # $1 = root ("" for the host)
    local root=$1 user uid gid
    local -a ch=()
    [[ -n $root ]] && ch=(chroot "$root")
    # make: tests/testbed/slurm.py builds Pyxis against each root's own spank.h.
    [[ -n $root ]] && apt_ensure "$root" "${RUNTIME_PKGS[@]}" make
    # --remove-destination: a binary a leftover container still runs (Apptainer's starter) is
    # "Text file busy" to overwrite; unlinked, it keeps running from its old inode.
    cp -a --remove-destination "$ENROOT_BUILD/root/." "${root:-/}"
    cp -a --remove-destination "$APPTAINER_BUILD/root/." "${root:-/}"
    ln -sfn "$APPTAINER_PREFIX/bin/apptainer" "$root/usr/local/bin/apptainer"
    # The image cache's import jobs (docs/images.md) run `enroot import` as the cache user:
    # Enroot's own file capabilities (its `make setcap`) on the two helpers that turn layers
    # into a squashfs, else "failed to set capabilities: Operation not permitted". Set after
    # every copy (a copy may not keep them); a site installs Enroot's package, which sets them.
    "${ch[@]}" setcap cap_sys_admin+pe /usr/local/bin/enroot-mksquashovlfs
    "${ch[@]}" setcap cap_sys_admin,cap_mknod+pe /usr/local/bin/enroot-aufs2ovlfs
    # Earlier recipes' wrappers of squashfuse and enroot (they did not keep a Pyxis
    # container's image mounted through Slurm's signals: docs/development.md).
    rm -f "$root/usr/local/bin/squashfuse" "$root/usr/local/sbin/enroot"
    # Unprivileged Apptainer mounts a SIF with squashfuse_ll, a process of the step: Slurm's
    # step signal (a walltime warning, USR1 or USR2) reaches it too and its default action
    # ends it, after which every page the program has not read yet is a SIGBUS. Apptainer
    # looks in its own libexec bin first; libfuse keeps a disposition it finds ignored.
    cat >"$root$APPTAINER_PREFIX/libexec/apptainer/bin/squashfuse_ll" <<'EOF'
#!/bin/sh
# Written by tests/testbed/runtimes.sh: a step's warning signal must not end the image's mount.
trap '' USR1 USR2
exec /usr/bin/squashfuse_ll "$@"
EOF
    chmod 0755 "$root$APPTAINER_PREFIX/libexec/apptainer/bin/squashfuse_ll"
    install -d -m 0755 "$root/etc/enroot/enroot.conf.d" "$root$ENROOT_DIR"
    cat >"$root/etc/enroot/enroot.conf.d/50-slurmjob-testbed.conf" <<EOF
# Written by tests/testbed/runtimes.sh: per-user paths made by root (see there).
ENROOT_RUNTIME_PATH $ENROOT_DIR/\${UID}/run
ENROOT_CACHE_PATH   $ENROOT_DIR/\${UID}/cache
ENROOT_DATA_PATH    $ENROOT_DIR/\${UID}/data
ENROOT_TEMP_PATH    $ENROOT_DIR/\${UID}/tmp
ENROOT_MOUNT_HOME   no
# The test bed's registries (tests/testbed/registry.py): Debian's CAs plus theirs.
SSL_CERT_FILE       $REGISTRY_CA_BUNDLE
# The image cache's imports (docs/images.md) make uncompressed squashfs here: compressing
# is most of an import's CPU, which the suite's other lanes need more than disk space.
ENROOT_SQUASH_OPTIONS -noI -noD -noF -noX -exit-on-error
EOF
    if [[ ! -s $root$REGISTRY_CA_BUNDLE ]]; then
        install -d -m 0755 "$(dirname "$root$REGISTRY_CA_BUNDLE")"
        install -m 0644 "$root/etc/ssl/certs/ca-certificates.crt" "$root$REGISTRY_CA_BUNDLE"
    fi
    for user in "${ENROOT_USERS[@]}"; do
        uid=$("${ch[@]}" id -u "$user") || die "user $user missing in '${root:-/}' (install.sh)"
        gid=$("${ch[@]}" id -g "$user")
        # Enroot makes the runtime, cache and data directories itself, not ENROOT_TEMP_PATH,
        # which `enroot import` needs (a job that imports from the test bed's registries).
        install -d -m 0700 -o "$uid" -g "$gid" "$root$ENROOT_DIR/$uid" "$root$ENROOT_DIR/$uid/tmp"
    done
    log "runtimes installed in '${root:-/}'"
}
install_into ""
[[ -n $CHROOT ]] && install_into "$CHROOT"

# Unprivileged squashfuse mounts (Pyxis' use_squashfuse=1, Apptainer's SIF) need /dev/fuse
# readable and writable by the job user: 0666, the usual distribution default (Debian's udev
# rule sets it; this machine has no udev). The chroot binds the host's /dev. It is a device
# node on devtmpfs: the change lasts until the next boot, and the test bed does not undo it.
chmod 0666 /dev/fuse
log "done"
