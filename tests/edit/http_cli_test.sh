#!/usr/bin/env bash
# `dray serve --http-port` as its users call it, over HTTPS with a client
# token: curl, OpenAI's official Node.js client and its page in a headless
# Chromium (Selenium) edit an image through it;
# health, readiness and the model list answer; bad input (no image, not an
# image, a 200 MB upload, a malformed multipart body, a wrong token) gets its
# 4xx with a JSON error naming the field and the request id; /metrics passes
# promtool and a real Prometheus server scrapes it and answers queries of
# dray's metrics; SIGTERM stops the server and its worker.
set -euo pipefail

root="$TEST_SRCDIR/$TEST_WORKSPACE"
dray="$root/cli/dray"
image="$root/docs/scene.png"
out="$TEST_TMPDIR"
clients=/usr/local/lib/dray-test-clients/node_modules # deploy/install-deps.sh
fail() { echo "FAIL: $*" >&2; cat "$out/serve.log" >&2; exit 1; }
wait_for_line() { timeout 120 grep -q -m1 "$2" < <(tail -n +1 --pid=$$ -F "$1"); }
[[ -d "$clients/openai" ]] || fail "OpenAI's Node.js client is not in $clients: run deploy/install-deps.sh"

bash "$root/deploy/make-certs.sh" "$out/certs" 127.0.0.1
printf 'sekrit' >"$out/token"
"$dray" serve --workers 1 --port 0 --http-port 0 --client-token-file "$out/token" \
  --public-tls-cert "$out/certs/tls.crt" --public-tls-key "$out/certs/tls.key" \
  worker.image_edit.num_inference_steps=2 worker.image_edit.image_size=64 >"$out/serve.log" 2>&1 &
server=$!
trap 'kill -KILL $server 2>/dev/null || true' EXIT
wait_for_line "$out/serve.log" "HTTP on" || fail "dray serve did not start"
port=$(sed -n 's|.*HTTP on https://[^ ]*:\([0-9][0-9]*\) .*|\1|p' "$out/serve.log")
[[ -n "$port" ]] || fail "dray serve did not say where it serves HTTPS"
url="https://127.0.0.1:$port"
https() { curl -sS --cacert "$out/certs/ca.crt" "$@"; }
authorized=(-H "Authorization: Bearer sekrit")

# expect_error STATUS FIELD CURL-ARGS...: the reply is STATUS with a JSON
# error naming FIELD ("null": none) and the request id of its header.
expect_error() {
  local status=$1 field=$2
  shift 2
  https -D "$out/headers" -o "$out/body" -w '%{http_code}' "$@" >"$out/code" || true
  [[ $(cat "$out/code") == "$status" ]] || fail "$* gave HTTP $(cat "$out/code"), not $status: $(cat "$out/body")"
  /usr/bin/python3 - "$out/body" "$out/headers" "$field" <<'PY' || fail "$*: $(cat "$out/body")"
import json, sys
error = json.load(open(sys.argv[1]))["error"]
headers = open(sys.argv[2]).read().lower()
assert str(error["param"]).lower().replace("none", "null") == sys.argv[3], error
assert f"x-request-id: {error['request_id']}" in headers, (error, headers)
PY
}

[[ $(https "$url/health") == '{"status":"ok"}' ]] || fail "/health"
[[ $(https "$url/ready") == '{"status":"ready"}' ]] || fail "/ready"
https "${authorized[@]}" "$url/v1/models" | grep -q '"id":"dray-embedded"' || fail "/v1/models"

https "${authorized[@]}" "$url/v1/images/edits" -F image=@"$image" -F prompt="make it purple" \
  -F size=64x64 -F seed=5 -o "$out/edit.json" || fail "curl's edit failed"
/usr/bin/python3 - "$out/edit.json" <<'PY' || fail "curl's edit: $(head -c 300 "$out/edit.json")"
import base64, json, struct, sys
reply = json.load(open(sys.argv[1]))
png = base64.b64decode(reply["data"][0]["b64_json"])
assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (64, 64), png[:24]
assert reply["data"][0]["seed"] == 5 and reply["size"] == "64x64", reply
PY

NODE_PATH="$clients" NODE_EXTRA_CA_CERTS="$out/certs/ca.crt" \
  node "$root/tests/http/openai_client.cjs" "$url/v1" sekrit "$image" || fail "OpenAI's client"
/usr/bin/python3 "$root/tests/http/browser_edit.py" "$url/" sekrit "$image" \
  "${TEST_UNDECLARED_OUTPUTS_DIR:-$out}/http_page.png" || fail "the page in Chromium"

echo "not an image" >"$out/bad.png"
expect_error 400 image "${authorized[@]}" "$url/v1/images/edits" -F prompt=x
expect_error 400 null "${authorized[@]}" "$url/v1/images/edits" -F image=@"$out/bad.png" -F prompt=x
expect_error 400 n "${authorized[@]}" "$url/v1/images/edits" -F image=@"$image" -F prompt=x -F n=11
expect_error 413 null "${authorized[@]}" "$url/v1/images/edits" -H "Content-Type: application/json" \
  --data-binary @<(head -c 200000000 /dev/zero)
expect_error 400 null "${authorized[@]}" "$url/v1/images/edits" \
  -H "Content-Type: multipart/form-data; boundary=cut" --data-binary $'--cut\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nx'
expect_error 401 null -H "Authorization: Bearer wrong" "$url/v1/images/edits" -F image=@"$image" -F prompt=x
grep -q "request [0-9a-f]\{16\} (POST /v1/images/edits): INVALID_ARGUMENT" "$out/serve.log" ||
  fail "the server did not log refusals with their request ids"

workers=$(pgrep -P $server || true)
[[ -n "$workers" ]] || fail "dray serve has no worker"
https "$url/metrics" >"$out/metrics.txt"
promtool check metrics <"$out/metrics.txt" >"$out/promtool.txt" 2>&1 ||
  fail "promtool check metrics: $(cat "$out/promtool.txt")"
prometheus_port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$out/prometheus.yml" <<EOF
global: {scrape_interval: 1s}
scrape_configs:
  - job_name: dray
    scheme: https
    tls_config: {ca_file: $out/certs/ca.crt}
    static_configs: [{targets: ["127.0.0.1:$port"]}]
EOF
prometheus --config.file="$out/prometheus.yml" --storage.tsdb.path="$out/tsdb" \
  --web.listen-address="127.0.0.1:$prometheus_port" >"$out/prometheus.log" 2>&1 &
prometheus=$!
trap 'kill -KILL $server $prometheus 2>/dev/null || true' EXIT
# value QUERY: the value of QUERY's first sample once Prometheus has one (it
# scrapes each second), waiting at most a minute; empty if it has none.
value() {
  local answer
  for _ in $(seq 120); do
    answer=$(curl -s "http://127.0.0.1:$prometheus_port/api/v1/query" --data-urlencode "query=$1" |
      /usr/bin/python3 -c 'import json, sys; r = json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")' 2>/dev/null || true)
    if [[ -n "$answer" ]]; then
      echo "$answer"
      return
    fi
    sleep 0.5
  done
  echo "Prometheus never answered $1: $(tail -3 "$out/prometheus.log")" >&2
}
[[ $(value 'up{job="dray"}') == 1 ]] || fail "Prometheus does not see dray serve up"
[[ $(value 'dray_serve_images_total{outcome="edited"}') -ge 4 ]] || fail "images edited"
[[ $(value 'sum(dray_serve_requests_total{api="http",code="401"})') -ge 1 ]] || fail "401s counted"
[[ $(value 'dray_worker_resident_bytes{rank="0"}') -gt 100000000 ]] || fail "the worker's memory"
[[ $(value 'dray_serve_ready') == 1 ]] || fail "ready"
kill -TERM $prometheus
wait $prometheus || true

kill -TERM $server
wait $server || fail "dray serve exited with status $? on SIGTERM"
grep -q "dray serve: stopped" "$out/serve.log" || fail "dray serve did not stop cleanly"
for pid in $workers; do ! kill -0 $pid 2>/dev/null || fail "worker $pid outlived dray serve"; done
echo "PASS"
