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

wait_serving() {  # HOLDER PID: until the holder writes the address it serves on
  for _ in $(seq 100); do
    [ -s "$1/address" ] && return 0
    kill -0 "$2" 2>/dev/null || { echo "the holder $1 exited" >&2; return 1; }
    sleep 0.2
  done
  echo "the holder $1 did not start" >&2
  return 1
}

# The simulation: a simulated H100's trust anchors and RIMs in sim/. Every party names it
# with --simulate: the holders trust those anchors, the orchestrator's simulated GPU uses them.
mkdir -p sim && gpucc session offer --challenge "$(gpucc session challenge)" \
    -o sim/offer.json --host-key sim/host.key --simulate sim

# Each holder: a dataset sealed under its own key, a long-term signing key, a service on a
# port the system chooses (port 0), whose address it writes to $h/address once it serves.
for h in alice bob; do
  mkdir -p $h/data
  head -c 1000000 /dev/urandom > $h/train.bin
  gpucc seal $h/train.bin -o $h/data/$h-train.gcc --data-key $h/data.key --chunk-size 64KiB
  gpucc holder keygen --holder-key $h/holder.key --holder-pub $h/holder.pub.pem > $h/pin
  gpucc holder serve --datasets $h/data --data-key $h/data.key --holder-key $h/holder.key \
      --listen 127.0.0.1:0 --address-file $h/address --state $h/state.sqlite3 --simulate sim \
      2> $h/service.log &
  pids+=($!)
  wait_serving $h $!
done

# The orchestrator's key and its plan: whom to visit, their pinned keys and datasets.
gpucc travel keygen --orchestrator-key orchestrator.key --orchestrator-pub orchestrator.pub.pem > /dev/null
cat > plan.yaml <<YAML
version: 1
orchestrator: {key: orchestrator.key, log: travel-log.jsonl}
holders:
  - id: alice
    url: http://$(cat alice/address)
    public_key: $(cat alice/pin)
    datasets:
$(gpucc holder datasets --datasets alice/data | sed 's/^/      /')
  - id: bob
    url: http://$(cat bob/address)
    public_key: $(cat bob/pin)
    datasets:
$(gpucc holder datasets --datasets bob/data | sed 's/^/      /')
YAML

gpucc travel run plan.yaml --simulate sim
gpucc travel verify-log travel-log.jsonl --orchestrator-pub orchestrator.pub.pem
# Alice's audit records: what she released, to whom, under which relaxations.
gpucc holder receipts --state alice/state.sqlite3 --decision released
