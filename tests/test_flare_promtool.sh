#!/bin/sh
# test_flare_promtool.sh - `curl -s localhost:PORT/metrics | promtool check
# metrics` exits 0, with nothing to say, on a live `flare run` with both
# host tiers after plain, streamed, branched (n 3) and stopped requests,
# so every family has samples, the histograms too (issue 14 item 5); with
# copy speculation, so the speculative families have them too (issue 19).
# promtool comes from Debian's prometheus (scripts/install-deps); without
# it the test is skipped (exit 77).
set -eu
command -v promtool >/dev/null 2>&1 || { echo "skip: promtool not installed (Debian prometheus)"; exit 77; }
command -v curl >/dev/null 2>&1 || { echo "skip: curl not installed"; exit 77; }
flare=${SELENE_BUILD:-build}/flare
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/promtool.XXXXXX")
pid=
cleanup() {
	rc=$?
	if [ -n "$pid" ]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
	exit $rc
}
trap cleanup EXIT

: >"$tmp/err" # before the server starts: the loop below reads it at once
"$flare" run --port 0 --dashboard off --prefix-cache-memory 8MiB \
	--prefix-cache-disk "$tmp/pc" --speculate copy --draft-tokens 3 2>"$tmp/err" &
pid=$!
# The listening line, within a deadline.
port=
i=0
while [ $i -lt 300 ]; do
	port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/err" || true)
	[ -n "$port" ] && break
	kill -0 "$pid" 2>/dev/null || { cat "$tmp/err"; exit 1; }
	sleep 0.1
	i=$((i + 1))
done
[ -n "$port" ] || { echo "no listening line:"; cat "$tmp/err"; exit 1; }
url=http://127.0.0.1:$port

post() {
	curl -sf "$url$1" -H 'Content-Type: application/json' -d "$2" >/dev/null
}
post /v1/chat/completions '{"messages":[{"role":"user","content":"Tell me about the tides."}],"max_tokens":12,"temperature":0}'
post /v1/chat/completions '{"messages":[{"role":"user","content":"Tell me about the tides."}],"max_tokens":12,"n":3,"stop":["e"]}'
post /v1/completions '{"prompt":["Once upon","a time"],"max_tokens":8,"stream":true}'

curl -s "$url/metrics" >"$tmp/metrics"
out=$(promtool check metrics <"$tmp/metrics" 2>&1) || { echo "promtool check metrics failed:"; echo "$out"; exit 1; }
[ -z "$out" ] || { echo "promtool has something to say:"; echo "$out"; exit 1; }
# The page is the one asked for: histograms with samples, branching counted.
for want in '^flare_time_to_first_token_seconds_count [1-9]' \
	'^flare_host_cache_restore_time_seconds_bucket{tier="dram",le="+Inf"} ' \
	'^flare_branched_requests_total [1-9]' '^# TYPE flare_host_cache_slots_capacity gauge' \
	'^flare_spec_rounds_total{mode="copy"} [1-9]' \
	'^flare_spec_round_time_seconds_count{mode="copy"} [1-9]'; do
	grep -q "$want" "$tmp/metrics" || { echo "/metrics lacks $want"; exit 1; }
done
if grep '^# TYPE .*_total gauge' "$tmp/metrics"; then
	echo "a gauge named like a counter"
	exit 1
fi
echo "promtool check metrics: ok ($(grep -c '^# TYPE' "$tmp/metrics") families)"
kill "$pid"
wait "$pid" || { echo "flare exited $?"; cat "$tmp/err"; exit 1; }
pid=
echo ok
