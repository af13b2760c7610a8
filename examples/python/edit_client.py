#!/usr/bin/env python3
"""Edit an image with a running `dray serve`, from Python with grpcio.

    dray serve --workers 2 --port 8000 &
    python3 examples/python/edit_client.py --server localhost:8000 \\
        --image docs/example.png --instruction "make the sky purple" --out edited.png

The stubs are generated from proto/dray/v1/image_edit.proto (Debian:
protobuf-compiler, protobuf-compiler-grpc, python3-grpcio, python3-protobuf):

    protoc -Iproto --python_out=py --grpc_python_out=py \\
        --plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin dray/v1/image_edit.proto
    PYTHONPATH=py python3 examples/python/edit_client.py ...

(`bazel build //proto:image_edit_py` does the same into bazel-bin/proto.)
A server started with --client-token-file wants --token-file; one on TLS
(dray serve --tls-cert ...) wants --tls-ca, the authority that signed its
certificate.
"""
import argparse
import sys

import grpc

from dray.v1 import image_edit_pb2
from dray.v1 import image_edit_pb2_grpc


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="localhost:8000", help="HOST:PORT of dray serve")
    parser.add_argument("--image", required=True, action="append",
                        help="input image (PNG or JPEG); repeat it for pictures 2 and 3 of an "
                        "Edit-Plus model (Qwen-Image-Edit-2509/2511)")
    parser.add_argument("--instruction", required=True, help="what to change")
    parser.add_argument("--out", required=True, help="output PNG")
    parser.add_argument("--seed", type=int, help="noise seed (default: the server's)")
    parser.add_argument("--steps", type=int, help="denoising steps (default: the server's)")
    parser.add_argument("--negative-prompt",
                        help='what to steer away from; "" turns guidance off (default: the server\'s)')
    parser.add_argument("--true-cfg-scale", type=float, help="guidance scale (default: the server's)")
    parser.add_argument("--guidance-scale", type=float,
                        help="embedded guidance of FLUX.1 Kontext models (default: the server's)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait")
    parser.add_argument("--token-file", help="a file with the token the server asks for")
    parser.add_argument("--tls-ca", help="the authority (PEM) that signed the server's certificate")
    args = parser.parse_args()

    pictures = []
    for path in args.image:
        with open(path, "rb") as f:
            pictures.append(f.read())
    request = image_edit_pb2.EditImageRequest(image=pictures[0], more_images=pictures[1:],
                                              instruction=args.instruction)
    if args.seed is not None:
        request.seed = args.seed
    if args.steps is not None:
        request.num_inference_steps = args.steps
    if args.negative_prompt is not None:
        request.negative_prompt = args.negative_prompt
    if args.true_cfg_scale is not None:
        request.true_cfg_scale = args.true_cfg_scale
    if args.guidance_scale is not None:
        request.guidance_scale = args.guidance_scale

    metadata = []
    if args.token_file:
        with open(args.token_file) as f:
            metadata.append(("authorization", "Bearer " + f.read().strip()))
    if args.tls_ca:
        with open(args.tls_ca, "rb") as f:
            channel = grpc.secure_channel(
                args.server, grpc.ssl_channel_credentials(root_certificates=f.read()))
    else:
        channel = grpc.insecure_channel(args.server)
    with channel:
        stub = image_edit_pb2_grpc.ImageEditServiceStub(channel)
        try:
            response = stub.Edit(request, timeout=args.timeout, metadata=metadata)
        except grpc.RpcError as error:
            print(f"edit_client: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1
    with open(args.out, "wb") as f:
        f.write(response.image)
    print(f"wrote {args.out} ({response.width}x{response.height}, seed {response.seed}, "
          f"edited in a batch of {response.batch_rows})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
