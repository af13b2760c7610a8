#!/usr/bin/env bash
# `dray serve` as a user runs it: the resolved configuration printed, the
# Python client example and `dray edit --server` answered with the same image
# for the same seed, bad input refused, a 1024^2 edit run within a 6 GB
# address-space limit (attention in blocks; it once asked for 36.7 GB) and a
# larger one refused by the pixel budget, a burst of concurrent requests that
# leaves the server's memory where it was, SIGTERM letting a request finish
# within --shutdown-grace-s and then cancelling it, and a server whose
# workers fail past --max-restarts exiting with status 1.
set -euo pipefail

root="$TEST_SRCDIR/$TEST_WORKSPACE"
dray="$root/cli/dray"
image="$root/docs/example.png"
out="$TEST_TMPDIR"
fail() { echo "FAIL: $*" >&2; cat "$out/serve.log" >&2; exit 1; }
# wait_for_line FILE PATTERN: blocks until a line of FILE matches (tail -F
# follows the file as it grows, once the background job has created it);
# false if none does within 2 minutes.
wait_for_line() { timeout 120 grep -q -m1 "$2" < <(tail -n +1 --pid=$$ -F "$1"); }

(
  ulimit -v 6000000 # KiB, for the server and its workers
  exec "$dray" serve --workers 2 --port 0 --shutdown-grace-s 1 worker.image_edit.num_inference_steps=2 \
    worker.image_edit.image_size=64 worker.image_edit.negative_prompt='" "'
) >"$out/serve.log" 2>&1 &
server=$!
trap 'kill -KILL $server 2>/dev/null || true' EXIT

wait_for_line "$out/serve.log" "ImageEditService on\|^dray serve: " || fail "dray serve did not start"
kill -0 $server 2>/dev/null || fail "dray serve exited early"
port=$(sed -n 's/.*ImageEditService on [^ ]*:\([0-9][0-9]*\) .*/\1/p' "$out/serve.log")
[[ -n "$port" ]] || fail "dray serve did not say where it listens"
grep -q "num_inference_steps: 2" "$out/serve.log" || fail "the resolved configuration was not printed"

PYTHONPATH="$root/proto" /usr/bin/python3 "$root/examples/python/edit_client.py" --server "127.0.0.1:$port" \
  --image "$image" --instruction "make the sky purple" --seed 3 --out "$out/python.png" | tee "$out/python.txt"
grep -q "seed 3" "$out/python.txt" || fail "the Python client did not report its seed"
[[ "$(head -c 8 "$out/python.png" | od -An -tx1 | tr -d ' \n')" == "89504e470d0a1a0a" ]] || fail "not a PNG"

"$dray" edit --server "127.0.0.1:$port" --image "$image" --instruction "make the sky purple" --seed 3 \
  --out "$out/cli.png" 2>&1 | tee "$out/cli.txt"
grep -q "denoising: step 2/2" "$out/cli.txt" || fail "dray edit --server showed no progress"
cmp "$out/python.png" "$out/cli.png" || fail "the same request gave different images"

echo "not an image" >"$out/bad.png"
if PYTHONPATH="$root/proto" /usr/bin/python3 "$root/examples/python/edit_client.py" --server "127.0.0.1:$port" \
  --image "$out/bad.png" --instruction "x" --out "$out/never.png" 2>"$out/bad.txt"; then
  fail "a bad image was accepted"
fi
grep -q "INVALID_ARGUMENT: row 0: image data" "$out/bad.txt" || fail "unexpected error: $(cat "$out/bad.txt")"

"$dray" edit --server "127.0.0.1:$port" --image "$image" --instruction "make it blue" --steps 1 \
  --width 1024 --height 1024 --out "$out/big.png" >"$out/big.txt" 2>&1 || fail "the 1024^2 edit failed: $(cat "$out/big.txt")"
grep -q "1024x1024" "$out/big.txt" || fail "the 1024^2 edit wrote $(cat "$out/big.txt")"
if "$dray" edit --server "127.0.0.1:$port" --image "$image" --instruction "x" --steps 1 \
  --width 2048 --height 2048 --out "$out/never.png" 2>"$out/huge.txt"; then
  fail "a 2048^2 edit passed the 1024^2 pixel budget"
fi
grep -q "INVALID_ARGUMENT.*max_pixels allows 1048576" "$out/huge.txt" || fail "unexpected error: $(cat "$out/huge.txt")"

# A burst: 32 concurrent EditBatch calls, half with two small images that
# are edited, half with two 4096^2 ones (50 KB of PNG, 48 MB decoded) for a
# 2048^2 output that the pixel budget refuses from their headers. The
# server's memory returns to where it was.
rss() { awk '/^VmRSS:/ { print $2 }' /proc/$server/status; }
before=$(rss)
PYTHONPATH="$root/proto" /usr/bin/python3 - "127.0.0.1:$port" "$image" <<'PY' || fail "the burst failed"
import concurrent.futures, struct, sys, zlib
import grpc
from dray.v1 import image_edit_pb2, image_edit_pb2_grpc

def png(width, height):
    chunk = lambda kind, data: (struct.pack(">I", len(data)) + kind + data +
                                struct.pack(">I", zlib.crc32(kind + data)))
    rows = zlib.compress(bytes(height * (1 + 3 * width)), 9)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", rows) + chunk(b"IEND", b""))

small = open(sys.argv[2], "rb").read()
huge = png(4096, 4096)
stub = image_edit_pb2_grpc.ImageEditServiceStub(grpc.insecure_channel(sys.argv[1]))
def call(huge_ones):
    images = [image_edit_pb2.EditImageRequest(image=small, instruction="x", num_inference_steps=1)] * 2
    if huge_ones:
        images = [image_edit_pb2.EditImageRequest(image=huge, instruction="x", width=2048,
                                                  height=2048)] * 2
    try:
        stub.EditBatch(image_edit_pb2.EditImageBatchRequest(requests=images), timeout=300)
        return "OK"
    except grpc.RpcError as error:
        return error.code().name
with concurrent.futures.ThreadPoolExecutor(32) as pool:
    answers = list(pool.map(call, [i % 2 == 1 for i in range(32)]))
print("burst:", {a: answers.count(a) for a in set(answers)})
assert set(answers[1::2]) == {"INVALID_ARGUMENT"}, answers
assert set(answers[0::2]) <= {"OK", "RESOURCE_EXHAUSTED"} and "OK" in answers, answers
PY
after=$(rss)
echo "dray serve resident: ${before} KiB before the burst, ${after} KiB after"
((after < before + 65536)) || fail "the burst left $((after - before)) KiB behind"

worker_pids=$(pgrep -P $server || true)
# SIGTERM mid-request: the request outlasts the 1 s grace and is cancelled.
"$dray" edit --server "127.0.0.1:$port" --image "$image" --instruction "x" --steps 1000 \
  --out "$out/never.png" >"$out/long.txt" 2>&1 &
client=$!
wait_for_line "$out/long.txt" "step 1/" || fail "the long request never started: $(cat "$out/long.txt")"
kill -TERM $server
wait $server || fail "dray serve exited with $? on SIGTERM"
! wait $client || fail "the long request was not cancelled"
grep -q "UNAVAILABLE.*grace period" "$out/long.txt" || fail "unexpected end: $(cat "$out/long.txt")"
grep -q "stopping" "$out/serve.log" || fail "no stop message"
[[ $(echo $worker_pids | wc -w) -eq 2 ]] || fail "expected 2 worker processes, saw: $worker_pids"
for pid in $worker_pids; do ! kill -0 $pid 2>/dev/null || fail "worker $pid outlived dray serve"; done

# Workers that fail past --max-restarts end dray serve with status 1. (A
# log of its own: following the first server's log as the second truncated
# it could read the first's "ImageEditService on" before the second had
# any worker to kill.)
"$dray" serve --workers 1 --port 0 --max-restarts 0 worker.image_edit.image_size=64 \
  >"$out/serve2.log" 2>&1 &
server=$!
wait_for_line "$out/serve2.log" "ImageEditService on" || fail "the second dray serve did not start"
workers=$(pgrep -P $server) || fail "the second dray serve has no worker process"
kill -KILL $workers
status=0
wait $server || status=$?
[[ $status -eq 1 ]] || fail "dray serve exited with $status when its workers could not be restarted"
grep -q "restarts are used up" "$out/serve2.log" || fail "no reason given"
echo PASS
