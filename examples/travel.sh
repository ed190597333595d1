#!/usr/bin/env bash
# GPU travelling on the simulator (docs/TRAVEL.md): two data holders, alice and bob, each
# serve their sealed dataset's key; one simulated GPU visits both, and the signed hand-over
# log is verified. Runs in a temporary directory, which it removes; no GPU needed.
set -euo pipefail

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
cd "$work"

free_port() {  # a port nothing listens on now
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_healthy() {  # URL PID: until the holder answers, or fail if it died
  for _ in $(seq 100); do
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' "$1" \
      2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || { echo "the holder at $1 exited" >&2; return 1; }
    sleep 0.2
  done
  echo "the holder at $1 did not start" >&2
  return 1
}

# The simulation: a simulated H100's trust anchors and RIMs in sim/. Every party names it
# with --simulate: the holders trust those anchors, the orchestrator's simulated GPU uses them.
mkdir -p sim && gpucc session offer --challenge "$(gpucc session challenge)" \
    -o sim/offer.json --host-key sim/host.key --simulate sim

# Each holder: a dataset sealed under its own key, a long-term signing key, a service.
for h in alice bob; do
  mkdir -p $h/data
  head -c 1000000 /dev/urandom > $h/train.bin
  gpucc seal $h/train.bin -o $h/data/$h-train.gcc --data-key $h/data.key --chunk-size 64KiB
  gpucc holder keygen --holder-key $h/holder.key --holder-pub $h/holder.pub.pem > $h/pin
  port=$(free_port)
  echo "$port" > $h/port
  gpucc holder serve --datasets $h/data --data-key $h/data.key --holder-key $h/holder.key \
      --listen 127.0.0.1:"$port" --state $h/state.sqlite3 --simulate sim \
      2> $h/service.log &
  pids+=($!)
  wait_healthy "http://127.0.0.1:$port/healthz" $!
done

# The orchestrator's key and its plan: whom to visit, their pinned keys and datasets.
gpucc travel keygen --orchestrator-key orchestrator.key --orchestrator-pub orchestrator.pub.pem > /dev/null
cat > plan.yaml <<YAML
version: 1
orchestrator: {key: orchestrator.key, log: travel-log.jsonl}
holders:
  - id: alice
    url: http://127.0.0.1:$(cat alice/port)
    public_key: $(cat alice/pin)
    datasets:
$(gpucc holder datasets --datasets alice/data | sed 's/^/      /')
  - id: bob
    url: http://127.0.0.1:$(cat bob/port)
    public_key: $(cat bob/pin)
    datasets:
$(gpucc holder datasets --datasets bob/data | sed 's/^/      /')
YAML

gpucc travel run plan.yaml --simulate sim
gpucc travel verify-log travel-log.jsonl --orchestrator-pub orchestrator.pub.pem
# Alice's audit records: what she released, to whom, under which relaxations.
gpucc holder receipts --state alice/state.sqlite3 --decision released
