#!/usr/bin/env python3
"""diffusers' Qwen-Image transformer, measured as `dray bench --suite gpu`
measures dray's, so that the two read as a ratio from one run on one device.

The same shapes, weights' scale and timing as workers/bench/gpu_bench.cc: on
the first CUDA device in bf16 at the released model's size, one
QwenImageTransformerBlock on a 1024x1024 edit (4096 target + 4096 condition
image tokens, 256 text tokens) forward and forward+backward, then the whole
QwenImageTransformer2DModel for one denoising step with CFG (batch 2) and the
CUDA allocator's peak; without a device, dray's `small` preset in float32 on
the CPU (a dry run of this script). Each figure is the median of the runs
after one to warm up, each timed until the device has finished it. Writes
one JSON line per figure, as `dray bench --json`, names prefixed diffusers_.

  tools/gpu/diffusers_bench.py --diffusers DIR [--quick]

DIR holds diffusers' `diffusers` package (its src/ folder), imported as it
is, and the commit it is from in DIR/COMMIT where tools/gpu/prepare.sh packed
it; the first line says what ran: that commit, torch's version, the device.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

# The released model's configuration (dray's TransformerConfig defaults), and
# dray's `small` preset (workers/models/qwen_image/model.cc) for the CPU.
REAL = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
            num_attention_heads=24, joint_attention_dim=3584, axes_dims_rope=(16, 56, 56))
SMALL = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=3, attention_head_dim=32,
             num_attention_heads=4, joint_attention_dim=48, axes_dims_rope=(8, 12, 12))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--diffusers", required=True, help="folder holding the diffusers package")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    return parser.parse_args()


def emit(name, value, unit):
    print(json.dumps({"name": "diffusers_" + name, "value": round(value, 6), "unit": unit}),
          flush=True)


class Bench:
    def __init__(self, qwen, quick):
        self.qwen = qwen
        self.cuda = torch.cuda.is_available()
        self.device = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.config = REAL if self.cuda else SMALL
        self.image = (1, 64, 64) if self.cuda else (1, 32, 32)
        self.text_tokens = 256 if self.cuda else 64
        self.repetitions = (5 if quick else 20) if self.cuda else (2 if quick else 5)

    def synchronize(self):
        if self.cuda:
            torch.cuda.synchronize()

    def median_seconds(self, run):
        run()
        self.synchronize()
        seconds = []
        for _ in range(self.repetitions):
            start = time.perf_counter()
            run()
            self.synchronize()
            seconds.append(time.perf_counter() - start)
        return statistics.median(seconds)

    def build(self, make):
        """make() on the device in the bench's dtype, weights normal(0, 0.02) as dray's Fill."""
        default = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                module = make()
        finally:
            torch.set_default_dtype(default)
        with torch.no_grad():
            for parameter in module.parameters():
                parameter.normal_(0, 0.02)
        return module

    def image_tokens(self):
        return 2 * self.image[1] * self.image[2]

    def randn(self, *shape):
        return torch.randn(*shape, device=self.device, dtype=self.dtype)

    def measure_block(self):
        config = self.config
        heads, head_dim = config["num_attention_heads"], config["attention_head_dim"]
        d = heads * head_dim
        block = self.build(lambda: self.qwen.QwenImageTransformerBlock(d, heads, head_dim))
        rope = self.qwen.QwenEmbedRope(theta=10000, axes_dim=list(config["axes_dims_rope"]),
                                       scale_rope=True)
        freqs = rope([[self.image, self.image]], device=self.device,
                     max_txt_seq_len=self.text_tokens)
        image = self.randn(1, self.image_tokens(), d)
        text = self.randn(1, self.text_tokens, d)
        temb = self.randn(1, d)

        def forward():
            return block(hidden_states=image, encoder_hidden_states=text,
                         encoder_hidden_states_mask=None, temb=temb, image_rotary_emb=freqs)

        def forward_backward():
            text_out, image_out = forward()
            (text_out.sum() + image_out.sum()).backward()

        s = self.image_tokens() + self.text_tokens
        flops = 2.0 * (12 * d * d * s + 2 * s * s * d + 12 * d * d)  # as gpu_bench.cc's
        with torch.no_grad():
            self.emit_speed("block_forward", self.median_seconds(forward), flops)
        self.emit_speed("block_forward_backward", self.median_seconds(forward_backward), 3 * flops)

    def measure_step(self):
        model = self.build(lambda: self.qwen.QwenImageTransformer2DModel(**self.config))
        batch = 2  # the prompt and the negative prompt
        latents = self.randn(batch, self.image_tokens(), model.config.in_channels)
        text = self.randn(batch, self.text_tokens, model.config.joint_attention_dim)
        timestep = torch.full((batch,), 0.5, device=self.device, dtype=self.dtype)
        shapes = [[self.image, self.image]] * batch

        def step():
            model(hidden_states=latents, encoder_hidden_states=text, timestep=timestep,
                  img_shapes=shapes, return_dict=False)

        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        with torch.no_grad():
            emit("step_s", self.median_seconds(step), "s")
        if self.cuda:
            emit("step_peak_memory_gib", torch.cuda.max_memory_allocated(self.device) / 2**30, "GiB")

    def emit_speed(self, name, seconds, flops):
        emit(name + "_ms", seconds * 1e3, "ms")
        emit(name + "_tflops", flops / seconds / 1e12, "TFLOP/s")


def main():
    args = parse_args()
    sys.path.insert(0, args.diffusers)
    from diffusers.models.transformers import transformer_qwenimage

    bench = Bench(transformer_qwenimage, args.quick)
    commit_file = os.path.join(args.diffusers, "COMMIT")
    commit = open(commit_file).read().strip() if os.path.exists(commit_file) else "unknown"
    device = torch.cuda.get_device_name(0) if bench.cuda else "CPU"
    print(json.dumps({"diffusers_commit": commit, "torch": torch.__version__, "device": device,
                      "dtype": str(bench.dtype)}), flush=True)
    bench.measure_block()
    bench.measure_step()


if __name__ == "__main__":
    main()
