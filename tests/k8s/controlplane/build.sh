#!/usr/bin/env bash
# Builds the real Kubernetes control plane the tests under tests/tasks/backends/gke/real/ run:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the JobSet controller (the README's minimum and
# the newest served), kwok and Kueue's controller, each from its own Go module in this folder
# (go.mod/go.sum pin every version; see docs/k8s-control-plane.md).
#
#   tests/k8s/controlplane/build.sh            build into .cache/k8s-bin/<hash>/ (repo root)
#   tests/k8s/controlplane/build.sh --hash     print <hash> only
#   tests/k8s/controlplane/build.sh --out DIR  build into DIR/<hash>/ (e.g. ../shared/k8s-bin)
#
# <hash> is taken over this script and every go.mod, go.sum and main.go below this folder, so a
# changed pin is a new folder. A finished folder holds a file COMPLETE; components already built
# there are kept (a failed or interrupted build resumes). The manifests the harness applies
# (CRDs, RBAC, webhook configurations) are copied from each controller's module, as pinned, to
# <name>-config/ beside its binary. Kueue is optional: when it does not
# build, the folder is still complete and KUEUE_FAILED says why.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"

# component name (the binary), its folder, the main package, version ldflags (may be empty)
KUBE_VERSION=v1.36.3
KUBE_LDFLAGS="-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36 -X k8s.io/component-base/version.gitTreeState=clean"
COMPONENTS=(
	"etcd|etcd|.|"
	"kube-apiserver|kube-apiserver|k8s.io/kubernetes/cmd/kube-apiserver|$KUBE_LDFLAGS"
	"kube-controller-manager|kube-controller-manager|k8s.io/kubernetes/cmd/kube-controller-manager|$KUBE_LDFLAGS"
	"kube-scheduler|kube-scheduler|k8s.io/kubernetes/cmd/kube-scheduler|$KUBE_LDFLAGS"
	"jobset-v0.10.1|jobset-v0.10.1|sigs.k8s.io/jobset|"
	"jobset-v0.12.0|jobset-v0.12.0|sigs.k8s.io/jobset|"
	"kwok|kwok|sigs.k8s.io/kwok/cmd/kwok|"
	"kueue|kueue|sigs.k8s.io/kueue/cmd/kueue|"
)
OPTIONAL=" kueue "

pins_hash() {
	(
		cd "$here"
		{
			echo build.sh
			find . -mindepth 2 -maxdepth 2 \( -name go.mod -o -name go.sum -o -name main.go \) |
				sed 's|^\./||' | LC_ALL=C sort
		} | while read -r f; do
			printf '%s %s\n' "$f" "$(sha256sum <"$f" | cut -c1-64)"
		done | sha256sum | cut -c1-16
	)
}

out_root="$root/.cache/k8s-bin"
case "${1:-}" in
--hash)
	pins_hash
	exit 0
	;;
--out)
	out_root="$(mkdir -p "$2" && cd "$2" && pwd)"
	;;
"") ;;
*)
	echo "usage: $0 [--hash | --out DIR]" >&2
	exit 2
	;;
esac

command -v go >/dev/null || PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || {
	echo "build.sh: no go command (Go 1.26 or newer needed; see docs/k8s-control-plane.md)" >&2
	exit 1
}

hash="$(pins_hash)"
out="$out_root/$hash"
mkdir -p "$out"
if [ -e "$out/COMPLETE" ]; then
	echo "$out"
	exit 0
fi
times="$out/build-times.txt"
echo "# $(date -u +%FT%TZ) $(go env GOVERSION) $(uname -m); seconds per component" >>"$times"
total_start=$(date +%s)
for spec in "${COMPONENTS[@]}"; do
	IFS='|' read -r name dir pkg ldflags <<<"$spec"
	if [ -x "$out/$name" ]; then
		echo "build.sh: $name: already built" >&2
		continue
	fi
	echo "build.sh: building $name ($dir: $pkg)" >&2
	start=$(date +%s)
	if (cd "$here/$dir" && go build -mod=readonly -trimpath -ldflags="-s -w $ldflags" \
		-o "$out/.$name.tmp" "$pkg") 2>"$out/.$name.log"; then
		mv "$out/.$name.tmp" "$out/$name"
		rm -f "$out/.$name.log"
		echo "$name $(($(date +%s) - start))" >>"$times"
	else
		rm -f "$out/.$name.tmp"
		if [[ "$OPTIONAL" == *" $name "* ]]; then
			echo "build.sh: $name did not build (optional; see ${name^^}_FAILED)" >&2
			mv "$out/.$name.log" "$out/${name^^}_FAILED"
			echo "$name failed $(($(date +%s) - start))" >>"$times"
		else
			echo "build.sh: $name did not build:" >&2
			tail -n 30 "$out/.$name.log" >&2
			exit 1
		fi
	fi
done
echo "total $(($(date +%s) - total_start))" >>"$times"
# jobset-v0.9.1-crd is not built: its CRD (older than the minimum, v0.10) is for the tests of
# the version gate.
for spec in "jobset-v0.10.1|sigs.k8s.io/jobset" "jobset-v0.12.0|sigs.k8s.io/jobset" \
	"kueue|sigs.k8s.io/kueue" "jobset-v0.9.1-crd|sigs.k8s.io/jobset"; do
	IFS='|' read -r name mod <<<"$spec"
	[ -x "$out/$name" ] || [[ "$name" == *-crd ]] || continue
	(cd "$here/$name" && go mod download "$mod")
	src="$(cd "$here/$name" && go list -m -f '{{.Dir}}' "$mod")/config/components"
	rm -rf "$out/${name%-crd}-config"
	cp -r "$src" "$out/${name%-crd}-config"
	chmod -R u+w "$out/${name%-crd}-config"
done
{
	echo "go $(go env GOVERSION)"
	for spec in "${COMPONENTS[@]}"; do
		IFS='|' read -r name dir pkg _ <<<"$spec"
		case "$name" in
		etcd) mod=go.etcd.io/etcd/server/v3 ;;
		kube-*) mod=k8s.io/kubernetes ;;
		jobset-*) mod=sigs.k8s.io/jobset ;;
		*) mod="sigs.k8s.io/$name" ;;
		esac
		mod="$(cd "$here/$dir" && go list -m -f '{{.Path}} {{.Version}}' "$mod")"
		echo "$name $mod"
	done
} >"$out/VERSIONS"
touch "$out/COMPLETE"
echo "$out"
