# dray's image for GPU nodes: one `dray` binary built with --config=cuda
# against Debian 13's CUDA LibTorch 2.6 (CUDA 12.4, NCCL 2.22; see
# deploy/install-cuda-deps.sh), and the shared libraries it links, on Debian
# 13. Run it as the CPU image (Dockerfile beside this one) is run, with the
# GPUs passed in: the NVIDIA driver's own libraries come from the host at run
# time (NVIDIA Container Toolkit: `podman run --device nvidia.com/gpu=all`,
# Kubernetes' nvidia.com/gpu resource).
#
#   podman build -f deploy/container/gpu.Dockerfile -t localhost/dray-gpu \
#       -v /path/to/cudnn/lib:/cudnn:ro .
#
# /cudnn holds cuDNN 9 for CUDA 12 (libcudnn*.so.9, from NVIDIA's
# redistributable archive), which Debian cannot ship; a build-time volume, so
# Docker needs BuildKit's equivalent. BASE is any Debian 13 image;
# tools/gpu/check_image.sh builds this on one imported from debootstrap.
ARG BASE=docker.io/library/debian:trixie

FROM ${BASE} AS build
COPY deploy/install-deps.sh deploy/install-cuda-deps.sh /src/deploy/
RUN /src/deploy/install-deps.sh --build-only && /src/deploy/install-cuda-deps.sh /cudnn
COPY . /src
WORKDIR /src
# Inside a container build, Bazel's own namespace sandbox is not available.
# cuDNN's kernel libraries and NVRTC (cuDNN's runtime-compiled engines,
# LibTorch's CUDA fusers) are loaded by name, so ldd does not list them.
RUN bazel build --spawn_strategy=local --color=no --curses=no --config=cuda \
      --repo_env=DRAY_CUDA_PATH=/usr/lib/cuda //cli:dray \
    && deploy/container/collect-libraries.sh bazel-bin/cli/dray /image \
    && cp -L /usr/lib/x86_64-linux-gnu/libcudnn*.so.9 /usr/lib/x86_64-linux-gnu/libnvrtc.so.12 \
      /usr/lib/x86_64-linux-gnu/libnvrtc-builtins.so.12.4 /image/usr/lib/x86_64-linux-gnu/

FROM ${BASE}
COPY --from=build /image/ /
ENTRYPOINT ["/usr/local/bin/dray"]
CMD ["--help"]
