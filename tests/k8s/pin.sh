#!/usr/bin/env bash
# Re-pin the wrapper modules under tests/k8s/gomod (run by hand; commit go.mod + go.sum after).
#   bash tests/k8s/pin.sh kube v1.36.3    # k8s.io/kubernetes; staging modules at v0.36.3
#   bash tests/k8s/pin.sh etcd v3.6.16    # go.etcd.io/etcd/server/v3
#   bash tests/k8s/pin.sh helm v3.22.0    # helm.sh/helm/v3
#   bash tests/k8s/pin.sh registry v3.1.2 # github.com/distribution/distribution/v3 (cmd/registry)
#   bash tests/k8s/pin.sh crane v0.22.1   # github.com/google/go-containerregistry (cmd/crane)
# The staging list is read from the .mod file the proxy serves for that k8s.io/kubernetes
# version (it grows: 1.36 added k8s.io/streaming and k8s.io/cri-streaming). Kubernetes >= 1.38
# needs Go 1.27. Then run tests/k8s/build.sh (new versions go into new cache directories).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
die() {
    printf '[k8s-pin] ERROR: %s\n' "$*" >&2
    exit 1
}
(($# == 2)) || die "usage: $0 kube|etcd|helm|registry|crane VERSION"
what=$1 ver=$2
dir="$HERE/gomod/$what"
GOFLAGS="$(go env GOFLAGS) -mod=mod"
export GOFLAGS GOTOOLCHAIN=local

new_gomod() { # $1 = module path suffix
    mkdir -p "$dir"
    printf 'module slurmjob.io/testbed/k8s/%s\n\ngo 1.26.0\n' "$1" >"$dir/go.mod"
    : >"$dir/go.sum"
}

case $what in
kube)
    [[ $ver =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "expected v1.X.Y, got $ver"
    staging="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
    modfile=$(go mod download -json "k8s.io/kubernetes@$ver" |
        sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
    [[ -f $modfile ]] || die "cannot download k8s.io/kubernetes@$ver"
    new_gomod kube
    # Same GODEBUG defaults as the release binaries.
    godebug=$(awk '$1 == "godebug" { print; exit }' "$modfile")
    [[ -n $godebug ]] && printf '\n%s\n' "$godebug" >>"$dir/go.mod"
    mapfile -t mods < <(awk '$2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "$modfile")
    ((${#mods[@]})) || die "no staging replaces found in $modfile"
    for m in "${mods[@]}"; do
        (cd "$dir" && go mod edit -replace="$m=$m@$staging")
    done
    (cd "$dir" && go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$ver" \
        "k8s.io/kubernetes/cmd/kubectl@$ver")
    ;;
etcd)
    new_gomod etcd
    (cd "$dir" && go get -tool "go.etcd.io/etcd/server/v3@$ver")
    ;;
helm)
    new_gomod helm
    (cd "$dir" && go get -tool "helm.sh/helm/v3/cmd/helm@$ver")
    ;;
registry)
    new_gomod registry
    (cd "$dir" && go get -tool "github.com/distribution/distribution/v3/cmd/registry@$ver")
    ;;
crane)
    new_gomod crane
    (cd "$dir" && go get -tool "github.com/google/go-containerregistry/cmd/crane@$ver")
    ;;
*) die "unknown wrapper $what (kube, etcd, helm, registry or crane)" ;;
esac
(cd "$dir" && go mod tidy)
printf '[k8s-pin] %s pinned at %s in %s\n' "$what" "$ver" "$dir/go.mod"
