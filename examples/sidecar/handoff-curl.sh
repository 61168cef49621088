#!/usr/bin/env bash
# A prefill-to-decode handoff through te-sidecar, driven with curl: what a
# serving system in another language (or an operator debugging one) sends.
# te's libraries (te_handoff_*, te.kvcache, kvcache/handoff) do the same and
# move the bytes between the two engines in between; here nobody moves
# anything, so prefill simply reports success.
#
#   examples/sidecar/handoff-curl.sh [path/to/te-sidecar]
#
# It starts te-sidecar on a free loopback port with a random cluster secret,
# derives the bearer token from the secret (HMAC-SHA256 of "te-sidecar-token
# v1", as te-sidecar -h says), then:
#   decode:  POST /handoff/expect   where the KV must go (its capability back)
#   prefill: POST /handoff/ready    the KV is ready (decode's blocks back: it moves)
#   prefill: POST /handoff/complete the bytes are there
#   decode:  GET  /handoff/wait     returns once the transfer is done
# and checks each answer. Needs curl and openssl.
set -euo pipefail
sidecar=${1:-${TE_SIDECAR:-build/te-sidecar}}
[ -x "$sidecar" ] || { echo "te-sidecar not found at $sidecar (run make, or pass its path)" >&2; exit 2; }
work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT

secret=$(head -c 32 /dev/urandom | base64)
printf '%s\n' "$secret" >"$work/secret"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
TE_AUTH_SECRET_FILE="$work/secret" "$sidecar" -addr "127.0.0.1:$port" >"$work/sidecar.log" 2>&1 &
pid=$!
base="http://127.0.0.1:$port"
for _ in $(seq 100); do
  curl -fsS "$base/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS "$base/healthz" >/dev/null || { cat "$work/sidecar.log" >&2; exit 1; }

token=$(printf '%s' "te-sidecar-token v1" | openssl dgst -sha256 -hmac "$secret" -r | cut -d' ' -f1)
auth=(-H "Authorization: Bearer $token" -H "Content-Type: application/json")

# field NAME JSON: the value of a top-level string, number or boolean field.
field() { sed -n "s/.*\"$1\":\"\{0,1\}\([^\",}]*\)\"\{0,1\}[,}].*/\1/p" <<<"$2" | head -1; }

# One Llama-shaped layer of 4 blocks on each side; the addresses are the
# engines' registered KV tensors and each side's "window" is the key of the
# engine window it granted over its blocks (engine.GrantWindow; te's handoff
# clients grant it for you): the mover presents it, and revoking it ends this
# transfer's access alone. Both are made up here: nothing moves.
layout='{"format":"vllm","dtype":"bf16","num_blocks":4,"block_size":16,"num_heads":8,"head_dim":128,"bases":[1048576]}'
id="req-$RANDOM"

echo "decode:  POST /handoff/expect id=$id blocks [2,3]"
r=$(curl -fsS "${auth[@]}" -H "X-Te-Client: decode-0" -d \
  "{\"id\":\"$id\",\"segment\":\"127.0.0.1:7002\",\"layout\":$layout,\"blocks\":[2,3],\"mode\":\"push\",\"window\":7002}" "$base/handoff/expect")
echo "         -> state $(field state "$r")"
dcap=$(field capability "$r")
[ "$(field state "$r")" = waiting ] && [ -n "$dcap" ]

echo "prefill: POST /handoff/ready  id=$id blocks [0,1]"
r=$(curl -fsS "${auth[@]}" -H "X-Te-Client: prefill-0" -d \
  "{\"id\":\"$id\",\"segment\":\"127.0.0.1:7001\",\"layout\":$layout,\"blocks\":[0,1],\"window\":7001}" "$base/handoff/ready")
echo "         -> state $(field state "$r"), mode $(field mode "$r"); prefill moves the bytes to $(field segment "$r")"
pcap=$(field capability "$r")
[ "$(field state "$r")" = transferring ] && [ "$(field mode "$r")" = push ] && [ -n "$pcap" ]

# Here prefill's engine WRITEs blocks 0,1 into decode's blocks 2,3.
echo "prefill: POST /handoff/complete (ok, 131072 bytes)"
r=$(curl -fsS "${auth[@]}" -H "X-Te-Capability: $pcap" -d "{\"id\":\"$id\",\"ok\":true,\"bytes\":131072}" "$base/handoff/complete")
echo "         -> state $(field state "$r")"

echo "decode:  GET  /handoff/wait"
r=$(curl -fsS "${auth[@]}" -H "X-Te-Capability: $dcap" "$base/handoff/wait?id=$id&since=0&timeout_ms=5000&role=decode")
echo "         -> state $(field state "$r"), bytes $(field bytes "$r")"
[ "$(field state "$r")" = done ] && [ "$(field bytes "$r")" = 131072 ]

# Without the token, or with the other side's capability, it is refused.
code=$(curl -s -o /dev/null -w '%{http_code}' "$base/handoff/status?id=$id")
[ "$code" = 401 ] || { echo "no token: HTTP $code, want 401" >&2; exit 1; }
code=$(curl -s -o /dev/null -w '%{http_code}' "${auth[@]}" -H "X-Te-Capability: $pcap" "$base/handoff/status?id=$id&role=decode")
[ "$code" = 403 ] || [ "$code" = 404 ] || { echo "prefill's capability as decode: HTTP $code, want 403/404" >&2; exit 1; }
echo "handoff-curl: ok"
