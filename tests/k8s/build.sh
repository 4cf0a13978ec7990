#!/usr/bin/env bash
# Build the Kubernetes test-bed binaries from the Go module proxy (idempotent, fast when done):
#   * kube-apiserver and kubectl from k8s.io/kubernetes (wrapper module gomod/kube, whose go.mod
#     sends every staging module k8s.io/X to its published v0.X.Y release);
#   * etcd from go.etcd.io/etcd/server/v3 (wrapper module gomod/etcd);
#   * helm from helm.sh/helm/v3 (wrapper module gomod/helm);
#   * Kueue's manager from sigs.k8s.io/kueue (wrapper module gomod/kueue), with its CRDs copied
#     from the module next to the binary (crds/);
#   * the OCI registry from github.com/distribution/distribution/v3 (wrapper module
#     gomod/registry) and crane from github.com/google/go-containerregistry (gomod/crane),
#     for the test bed's registries (tests/testbed/registry.py).
# Versions come from the wrapper go.mod files; each binary is cached once under
#   /var/cache/slurmjob-testbed/k8s/<component>-<version>/<component>
# and skipped when present. Daemons are started by tests/k8s/kube.py and
# tests/testbed/registry.py, not here. Bump a version: see tests/k8s/pin.sh.
# Usage: build.sh [COMPONENT...]   all components, or only those named (e.g. registry crane).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
GOMOD="$HERE/gomod"
CACHE="${SLURMJOB_TESTBED_K8S_CACHE:-/var/cache/slurmjob-testbed/k8s}"

log() { printf '[k8s-build] %s\n' "$*"; }
die() {
    printf '[k8s-build] ERROR: %s\n' "$*" >&2
    exit 1
}

command -v go >/dev/null || die "go is not on PATH (needs Go >= 1.26 and the Go module proxy)"
install -d -m 0755 "$CACHE" 2>/dev/null || die "cannot create $CACHE (run as root?)"
[[ -w $CACHE ]] || die "$CACHE is not writable (run as root?)"

# One build at a time (make test and a developer shell may race).
exec 9>"$CACHE/.build.lock"
flock -w 3600 9 || die "timed out waiting for the build lock $CACHE/.build.lock"

# The machine's own settings (GOPROXY, GOFLAGS=-buildvcs=false, ...) plus -mod=mod, so a go.sum
# that lacks a checksum for some platform-specific dependency is completed instead of failing.
GOFLAGS="$(go env GOFLAGS) -mod=mod"
export GOFLAGS CGO_ENABLED=0
# Keep the toolchain from switching itself (Kubernetes >= 1.38 would need Go 1.27).
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

modver() { # $1 = wrapper dir, $2 = module path -> version from that go.mod's require block
    local v
    v=$(awk -v m="$2" '$1 == m { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' \
        "$GOMOD/$1/go.mod")
    [[ -n $v ]] || die "no require line for $2 in $GOMOD/$1/go.mod"
    printf '%s' "$v"
}

K8S_VERSION=$(modver kube k8s.io/kubernetes)
ETCD_VERSION=$(modver etcd go.etcd.io/etcd/server/v3)
HELM_VERSION=$(modver helm helm.sh/helm/v3)
HELM_CLIENT_GO=$(modver helm k8s.io/client-go)
KUEUE_VERSION=$(modver kueue sigs.k8s.io/kueue)
REGISTRY_VERSION=$(modver registry github.com/distribution/distribution/v3)
CRANE_VERSION=$(modver crane github.com/google/go-containerregistry)

COMPONENTS=(etcd kube-apiserver kubectl helm kueue registry crane)
WANTED=("$@")
for c in "${WANTED[@]}"; do
    [[ " ${COMPONENTS[*]} " == *" $c "* ]] || die "unknown component $c (${COMPONENTS[*]})"
done
wanted() { # $1 = component: named on the command line, or none named
    ((${#WANTED[@]} == 0)) || [[ " ${WANTED[*]} " == *" $1 "* ]]
}

# build <component> <version> <wrapper dir> <package> <go build args...>
build() {
    local comp=$1 ver=$2 mod=$3 pkg=$4
    shift 4
    wanted "$comp" || return 0
    local dir="$CACHE/$comp-$ver"
    local bin="$dir/$comp"
    if [[ -x $bin ]]; then
        log "$comp $ver: cached ($bin)"
        return
    fi
    log "$comp $ver: building $pkg (cold builds take minutes) ..."
    local t0=$SECONDS tmp="$dir.tmp.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    if ! (cd "$GOMOD/$mod" && go build -trimpath "$@" -o "$tmp/$comp" "$pkg") \
        >"$tmp/build.log" 2>&1; then
        tail -n 40 "$tmp/build.log" >&2
        die "building $comp $ver failed (log: $tmp/build.log)"
    fi
    local -a vargs=(--version)
    case $comp in
    kubectl) vargs=(version --client) ;;
    helm) vargs=(version) ;;
    kueue) vargs=(-help) ;; # no version flag; its flag set answers -help with status 0
    crane) vargs=(version) ;;
    esac
    "$tmp/$comp" "${vargs[@]}" >"$tmp/version.txt" 2>&1 ||
        die "$tmp/$comp ${vargs[*]} failed: $(cat "$tmp/version.txt")"
    rm -f "$tmp/build.log"
    rm -rf "$dir"
    mv "$tmp" "$dir"
    log "$comp $ver: built in $((SECONDS - t0)) s: $(head -n 1 "$dir/version.txt")"
}

t_all=$SECONDS
go version | sed 's/^/[k8s-build] /'

build etcd "$ETCD_VERSION" etcd go.etcd.io/etcd/server/v3 -ldflags "-s -w"

# Version stamps as Kubernetes' hack/lib/version.sh sets them: without them /version reports
# v0.0.0-master and helm/kubectl version checks misbehave.
k8s_minor=${K8S_VERSION#v1.}
k8s_minor=${k8s_minor%%.*}
k8s_date=""
if wanted kube-apiserver || wanted kubectl; then
    k8s_date=$(cd "$GOMOD/kube" && go list -m -f '{{.Time}}' k8s.io/kubernetes 2>/dev/null |
        awk '{ print $1 "T" $2 "Z" }')
fi
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    k8s_ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
    k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=${k8s_date:-1970-01-01T00:00:00Z}"
done
k8s_tags=selinux,notest,grpcnotrace
build kube-apiserver "$K8S_VERSION" kube k8s.io/kubernetes/cmd/kube-apiserver \
    -tags "$k8s_tags" -ldflags "$k8s_ldflags"
build kubectl "$K8S_VERSION" kube k8s.io/kubernetes/cmd/kubectl \
    -tags "$k8s_tags" -ldflags "$k8s_ldflags"

# helm's Makefile: default Capabilities.KubeVersion = its client-go minor + 1.x.
helm_minor=${HELM_CLIENT_GO#v0.}
helm_minor=${helm_minor%%.*}
helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
helm_ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    helm_ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$helm_minor"
done
build helm "$HELM_VERSION" helm helm.sh/helm/v3/cmd/helm -ldflags "$helm_ldflags"

build kueue "$KUEUE_VERSION" kueue sigs.k8s.io/kueue/cmd/kueue -ldflags "-s -w"
kueue_crds="$CACHE/kueue-$KUEUE_VERSION/crds"
if wanted kueue && [[ ! -f $kueue_crds/kueue.x-k8s.io_workloads.yaml ]]; then
    src="$(cd "$GOMOD/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)/config/components/crd/bases"
    [[ -d $src ]] || die "Kueue's CRDs are not in the module ($src)"
    rm -rf "$kueue_crds.tmp" && mkdir -p "$kueue_crds.tmp"
    cp "$src"/*.yaml "$kueue_crds.tmp/" && chmod 0644 "$kueue_crds.tmp"/*.yaml
    mv "$kueue_crds.tmp" "$kueue_crds"
    log "kueue $KUEUE_VERSION: CRDs copied from $src"
fi

# The registry reports the version its Makefile stamps (the default reads v3.x.y+unknown).
build registry "$REGISTRY_VERSION" registry github.com/distribution/distribution/v3/cmd/registry \
    -ldflags "-s -w -X github.com/distribution/distribution/v3/version.version=$REGISTRY_VERSION"
# crane's `version` prints this stamp (else the wrapper module's "(devel)").
build crane "$CRANE_VERSION" crane github.com/google/go-containerregistry/cmd/crane \
    -ldflags "-s -w -X github.com/google/go-containerregistry/cmd/crane/cmd.Version=$CRANE_VERSION"

log "${WANTED[*]:-all binaries} ready in $((SECONDS - t_all)) s under $CACHE"
