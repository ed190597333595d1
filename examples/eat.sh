#!/usr/bin/env bash
# Signed attestation results (docs/EAT.md): verify NVIDIA's bundled H100 sample, sign the
# result as an ES384 EAT with your own P-384 key, and check it as a relying party would, with
# `gpucc token verify` and with the library; a tampered token and a wrong nonce are refused.
# Offline, no GPU needed. Runs in a temporary directory, which it removes.
set -euo pipefail

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

# The signing key: an unencrypted P-384 PEM file, mode 0600; its public half for checkers.
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-384 -out eat-key.pem
chmod 600 eat-key.pem
openssl pkey -in eat-key.pem -pubout -out eat-pub.pem

# The sample verifies as of 2024-01-01; its nonce is the one the result must answer (in
# production: the nonce you chose).
at=2024-01-01T00:00:00Z
gpucc attest -q --sample --offline --at "$at" --sign-eat eat-key.pem -o result.eat.json \
    | grep -E "^(TRUSTED|REFUSED|UNDECIDED):"
nonce=$(gpucc attest -q --sample --offline --at "$at" -f json \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["nonce"])')

echo "== the signed result, checked (10 minutes later)"
gpucc token verify result.eat.json --signer-pub eat-pub.pem --nonce "$nonce" --at 2024-01-01T00:10:00Z

echo "== the same with the library"
python3 - result.eat.json eat-pub.pem "$nonce" <<'PY'
import datetime as dt
import sys
from pathlib import Path

from cryptography.hazmat.primitives.serialization import load_pem_public_key

from gpucc.gpuattest.eat import verify_eat

token, key_file, nonce = Path(sys.argv[1]).read_text(), Path(sys.argv[2]), sys.argv[3]
key = load_pem_public_key(key_file.read_bytes())
when = dt.datetime(2024, 1, 1, 0, 10, tzinfo=dt.UTC)
verified = verify_eat(token, key, nonce=bytes.fromhex(nonce), now=when)  # type: ignore[arg-type]
print("overall result:", verified.overall_result, "| devices:", ", ".join(verified.devices))
PY

echo "== a token with one character changed is refused (exit 1)"
python3 -c 'import sys; t = open(sys.argv[1]).read(); i = t.index(".") + 5
open(sys.argv[2], "w").write(t[:i] + ("A" if t[i] != "A" else "B") + t[i + 1:])' result.eat.json tampered.eat.json
status=0
gpucc token verify tampered.eat.json --signer-pub eat-pub.pem --nonce "$nonce" \
    --at 2024-01-01T00:10:00Z 2> refused.txt || status=$?
tail -n 1 refused.txt
echo "exit $status"

echo "== another nonce (a replayed result) is refused (exit 1)"
other=$(python3 -c 'import os; print(os.urandom(32).hex())')
status=0
gpucc token verify result.eat.json --signer-pub eat-pub.pem --nonce "$other" \
    --at 2024-01-01T00:10:00Z 2> refused.txt || status=$?
tail -n 1 refused.txt
echo "exit $status"
