#!/usr/bin/env python3
"""A reward scorer for `dray train`: colourfulness of the edited image, over gRPC.

Implements dray.v1.RewardService (proto/dray/v1/reward.proto) with numpy:
the score is Hasler and Suesstrunk's colourfulness of the output image
(about 0 for gray, 1 for very colourful images), and its parts are reported
as components. Run it, then point a training job at it:

    python3 examples/python/reward_server.py --port 50051 &
    dray train 'worker.reward.remote=[{name: colourful, address: "localhost:50051"}]'

Stubs as for edit_client.py (`bazel build //proto:reward_py`, then
PYTHONPATH=bazel-bin/proto). --port 0 picks a free port; the server prints
"listening on PORT" once it serves. --token requires the bearer token dray
sends (worker.reward.remote[].token_env names the variable holding it);
--tls-cert/--tls-key serve TLS.
"""
import argparse
import sys
from concurrent import futures

import grpc
import numpy as np

from dray.v1 import reward_pb2
from dray.v1 import reward_pb2_grpc


def pixels(image):
    """An RgbImage as a float array [height, width, 3]."""
    data = np.frombuffer(image.rgb, dtype=np.uint8)
    if data.size != image.width * image.height * 3:
        raise ValueError(f"an RgbImage of {image.width}x{image.height} needs "
                         f"{image.width * image.height * 3} bytes, got {data.size}")
    return data.reshape(image.height, image.width, 3).astype(np.float64)


def colourfulness(rgb):
    """Hasler and Suesstrunk (2003): spread and strength of the opponent colours, /100."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    rg = r - g
    yb = 0.5 * (r + g) - b
    spread = np.hypot(rg.std(), yb.std())
    strength = np.hypot(rg.mean(), yb.mean())
    return (spread + 0.3 * strength) / 100.0, spread / 100.0, strength / 100.0


class Scorer(reward_pb2_grpc.RewardServiceServicer):
    def __init__(self, token):
        self.token = token

    def Score(self, request, context):
        if self.token is not None:
            metadata = dict(context.invocation_metadata())
            if metadata.get("authorization") != f"Bearer {self.token}":
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "a valid bearer token is required")
        response = reward_pb2.ScoreResponse()
        for i, row in enumerate(request.rows):
            try:
                score, spread, strength = colourfulness(pixels(row.output_image))
            except ValueError as error:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"row {i}: {error}")
            response.scores.add(score=score,
                                components={"spread": spread, "strength": strength})
        return response


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=50051, help="0: a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--token", help="require this bearer token")
    parser.add_argument("--tls-cert", help="PEM certificate chain (with --tls-key: serve TLS)")
    parser.add_argument("--tls-key", help="PEM private key")
    args = parser.parse_args()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    reward_pb2_grpc.add_RewardServiceServicer_to_server(Scorer(args.token), server)
    address = f"{args.host}:{args.port}"
    if args.tls_cert:
        with open(args.tls_cert, "rb") as cert, open(args.tls_key, "rb") as key:
            credentials = grpc.ssl_server_credentials([(key.read(), cert.read())])
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        sys.exit(f"reward_server: cannot listen on {address}")
    server.start()
    print(f"listening on {port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
