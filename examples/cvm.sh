#!/usr/bin/env bash
# Composite attestation (docs/CVM.md) on real evidence from the checkout: NVIDIA's H100
# sample beside an AWS SEV-SNP report, judged as one platform; the CVM's measurement pinned
# into a policy; and an Azure TDX CVM's evidence without Intel's collateral. Offline, no GPU or CVM needed.
# Runs in a temporary directory, which it removes.
set -euo pipefail

data=$(cd "$(dirname "$0")/../tests/data/cloud-cvm" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

# The SEV-SNP report and its VLEK; the report data it was made over (in production: the
# value gpucc derives from your nonce). Both samples are valid as of mid-2025.
snp=(--cvm-evidence "$data/snp-vlek/report.bin" --cvm-collateral "$data/snp-vlek/vlek.der"
     --cvm-report-data 819770b7e6ea6df8dd8fd4dd146b073c0bf4f3ce5b0977ecac486e3a05ed1bd54e2a7ac1f5d1ca02e7d7d5ef9f73b8574fd9359e3a480d741a4478e8a7bc27ca)
at=(--at 2025-06-01T00:00:00Z --offline)

echo "== 1. the GPU and the CVM, one verdict (no measurement pinned yet: a relaxation)"
gpucc attest --sample "${snp[@]}" "${at[@]}" -f json > result.json
python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print("trusted:", r["trusted"], "| cvm:", r["cvm"]["kind"], r["cvm"]["verdict"])' result.json

echo "== 2. pin the CVM's measurement into the GPU policy, and verify again under it"
# The sample is verified offline: NVIDIA's OCSP answers for it are not stored.
printf 'version: 1\nocsp:\n  require: false\n' > gpu-policy.yaml
gpucc cvm pin result.json --base gpu-policy.yaml -o policy.yaml
grep -A3 "measurements:" policy.yaml
gpucc attest -q --sample "${snp[@]}" "${at[@]}" --policy policy.yaml | grep -E "^(TRUSTED|REFUSED|UNDECIDED):"

echo "== 3. a policy pinning another image refuses the same CVM (exit 1)"
sed -E 's/(measurement: *)[0-9a-f]{96}/\1'"$(printf 'ab%.0s' $(seq 48))"'/' policy.yaml > other.yaml
status=0
gpucc attest -q --sample "${snp[@]}" "${at[@]}" --policy other.yaml > refused.txt || status=$?
grep "^REFUSED:" refused.txt
echo "exit $status"

echo "== 4. an Azure TDX CVM (vTPM evidence, its TD quote inside): offline, without Intel's"
echo "      collateral, every check that needs none passes and the verdict is undecided (exit 3)"
status=0
gpucc attest -q --cvm-only --offline "${at[0]}" "${at[1]}" \
    --cvm-evidence "$data/azure-tdx-vtpm/evidence-v1.json" \
    --cvm-report-data 6368616c6c656e6765 -f json > tdx.json || status=$?
python3 - tdx.json <<'PY'
import json
import sys

cvm = json.load(open(sys.argv[1]))["cvm"]
print("verdict:", cvm["verdict"])
for check in cvm["checks"]:
    print(f"  {check['status']:<12} {check['title']}")
PY
echo "exit $status"
