"""Reference vectors for DMD2 (tianweiy/DMD2 @ 8d8fa55), computed by the authors' own code.

Imports, from the files' own text, main/utils.py, main/sd_guidance.py and main/sd_unified_model.py (their imports of
diffusers, transformers, accelerate, peft, matplotlib, PIL and imageio are stubbed: nothing used here comes from
them), and calls on toy score models:
  * SDGuidance.compute_distribution_matching_loss (the generator's distribution-matching loss and its gradient);
  * SDGuidance.compute_loss_fake (the fake score's denoising loss);
  * SDGuidance.compute_generator_clean_cls_loss and compute_guidance_clean_cls_loss (the GAN losses, with and
    without diffusion_gan);
  * SDUniModel.forward's generator turn without a generator gradient (prepare_denoising_data with
    backward_simulation: sample_backward's few-step simulation, the re-noising and the pure-noise rows).
Run: OMP_NUM_THREADS=1 nice -n 19 /usr/bin/python3 generate.py   (writes next to this file)
"""
import os
import sys
import types

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _common as C  # noqa: E402

OUT = os.path.dirname(os.path.abspath(__file__))
C.setup()

UP = C.Upstream("tianweiy+DMD2", "https://github.com/tianweiy/DMD2", "8d8fa55633d47cfb81bbc7a892e7248f9518763f")


# ---------------------------------------------------------------- stubs for the files' imports
def stub(name, **attrs):
    module = types.ModuleType(name)
    module.__path__ = []
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


class Unused:
    def __init__(self, *args, **kwargs):
        raise AssertionError("a stubbed import was used")


for name in ["matplotlib", "matplotlib.backends"]:
    stub(name)
stub("matplotlib.backends.backend_agg", FigureCanvasAgg=Unused)
stub("matplotlib.pyplot")
stub("PIL", Image=Unused, ImageDraw=Unused, ImageFont=Unused)
stub("imageio")
stub("imageio.v2")
stub("transformers", PretrainedConfig=Unused, CLIPTextModel=Unused)
stub("diffusers", UNet2DConditionModel=Unused, DDIMScheduler=Unused, AutoencoderKL=Unused, AutoencoderTiny=Unused)
stub("accelerate")
stub("accelerate.utils", broadcast=lambda tensor, from_process=0: tensor)  # one process: broadcast is the identity
stub("peft", LoraConfig=Unused)
stub("main")
stub("main.sdxl")
stub("main.sdxl.sdxl_text_encoder", SDXLTextEncoder=Unused)
stub("main.sd_unet_forward", classify_forward=Unused)


def load(module_name, path):
    module = types.ModuleType(module_name)
    module.__file__ = path
    exec(compile(UP.text(path), path, "exec"), module.__dict__)
    sys.modules[module_name] = module
    return module


utils = load("main.utils", "main/utils.py")
guidance_module = load("main.sd_guidance", "main/sd_guidance.py")
unified_module = load("main.sd_unified_model", "main/sd_unified_model.py")


class RecordingTorch(types.ModuleType):
    """`torch` for the loaded files: torch's own, except that every randint / randn_like draw is also recorded."""

    def __init__(self):
        super().__init__("torch")
        self.draws = []

    def __getattr__(self, k):
        return getattr(torch, k)

    def randint(self, *args, **kwargs):
        out = torch.randint(*args, **kwargs)
        self.draws.append(out.clone())
        return out

    def randn_like(self, x, **kwargs):
        out = torch.randn_like(x, **kwargs)
        self.draws.append(out.clone())
        return out


TORCH = RecordingTorch()
guidance_module.torch = TORCH
unified_module.torch = TORCH


# ---------------------------------------------------------------- scheduler and toy models
class DdpmScheduler:
    """The two members of diffusers' DDIMScheduler that DMD2 uses, with diffusers' semantics, for SD v1.5's
    configuration (scaled_linear betas 0.00085 .. 0.012 over 1000 steps): alphas_cumprod and add_noise."""

    num_train_timesteps = 1000

    def __init__(self, dtype):
        betas = torch.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 1000, dtype=torch.float32) ** 2
        self.alphas_cumprod = torch.cumprod(1.0 - betas, dim=0).to(dtype)

    def add_noise(self, original_samples, noise, timesteps):
        alphas_cumprod = self.alphas_cumprod.to(device=original_samples.device, dtype=original_samples.dtype)
        sqrt_alpha_prod = (alphas_cumprod[timesteps] ** 0.5).flatten()
        while len(sqrt_alpha_prod.shape) < len(original_samples.shape):
            sqrt_alpha_prod = sqrt_alpha_prod.unsqueeze(-1)
        sqrt_one_minus_alpha_prod = ((1 - alphas_cumprod[timesteps]) ** 0.5).flatten()
        while len(sqrt_one_minus_alpha_prod.shape) < len(original_samples.shape):
            sqrt_one_minus_alpha_prod = sqrt_one_minus_alpha_prod.unsqueeze(-1)
        return sqrt_alpha_prod * original_samples + sqrt_one_minus_alpha_prod * noise


class Output:
    def __init__(self, sample):
        self.sample = sample


TOY_MODEL = ("noise prediction = a tanh(x) + b x + c e + d t / 1000, e = the mean of encoder_hidden_states over "
             "its token and feature dims (per row), t = the timestep; classify_mode returns [tanh(a x + c e + "
             "d t / 1000)] as the bottleneck features")
TOY_HEAD = "logits = mean over (C, H, W) of w * features + bias, [B, 1, 1, 1]"


class ToyUNet(nn.Module):
    """A score model with UNet2DConditionModel's call signature (and classify_forward's classify_mode)."""

    def __init__(self, a, b, c, d, dtype):
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Parameter(torch.tensor(v, dtype=dtype)) for v in (a, b, c, d))
        self.outputs = []

    def params(self):
        return [float(p) for p in (self.a, self.b, self.c, self.d)]

    def forward(self, sample, timestep, encoder_hidden_states, added_cond_kwargs=None, classify_mode=False):
        e = encoder_hidden_states.mean(dim=(1, 2)).view(-1, 1, 1, 1)
        t = timestep.to(sample.dtype).view(-1, 1, 1, 1) / 1000
        if classify_mode:
            return [torch.tanh(self.a * sample + self.c * e + self.d * t)]
        out = self.a * torch.tanh(sample) + self.b * sample + self.c * e + self.d * t
        if out.requires_grad:
            out.retain_grad()
        self.outputs.append(out)
        return Output(out)


class SqueezeList:
    """What the head returns: DMD2 calls `.squeeze(dim=[2, 3])` (a list of dims, torch >= 2.0); torch 1.13's
    squeeze takes one dim, so this squeezes them one at a time (the same result) and keeps the logits for their
    gradient."""

    def __init__(self, tensor, kept):
        self.tensor, self.kept = tensor, kept

    def squeeze(self, dim):
        out = self.tensor
        for d in sorted(dim, reverse=True):
            out = out.squeeze(d)
        if out.requires_grad:
            out.retain_grad()
        self.kept.append(out)
        return out


class ToyHead(nn.Module):
    def __init__(self, w, bias, dtype):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w, dtype=dtype))
        self.bias = nn.Parameter(torch.tensor(bias, dtype=dtype))
        self.logits = []

    def forward(self, rep):
        return SqueezeList((self.w * rep).mean(dim=(1, 2, 3), keepdim=True) + self.bias, self.logits)


REAL = (0.9, 0.12, 0.5, -0.3)
FAKE = (0.8, 0.2, 0.35, 0.4)
HEAD = (1.7, -0.2)
GENERATOR = (0.7, 0.25, 0.45, 0.6)


def make_guidance(dtype, real_guidance_scale=1.75, diffusion_gan=False, diffusion_gan_max_timestep=0):
    """An SDGuidance as its __init__ would make it from the arguments named in `GUIDANCE_ARGS` (its own __init__
    loads UNets from the hub), with toy models in the UNets' and the classifier branch's places."""
    g = guidance_module.SDGuidance.__new__(guidance_module.SDGuidance)
    nn.Module.__init__(g)
    g.real_unet = ToyUNet(*REAL, dtype).requires_grad_(False)
    g.fake_unet = ToyUNet(*FAKE, dtype)
    g.cls_pred_branch = ToyHead(*HEAD, dtype)
    g.scheduler = DdpmScheduler(dtype)
    g.register_buffer("alphas_cumprod", g.scheduler.alphas_cumprod)
    g.num_train_timesteps = 1000
    g.min_step = int(0.02 * g.scheduler.num_train_timesteps)
    g.max_step = int(0.98 * g.scheduler.num_train_timesteps)
    g.real_guidance_scale = real_guidance_scale
    g.fake_guidance_scale = 1.0
    g.use_fp16 = False
    g.cls_on_clean_image = True
    g.gen_cls_loss = True
    g.sdxl = False
    g.gan_alone = False
    g.gradient_checkpointing = False
    g.diffusion_gan = diffusion_gan
    g.diffusion_gan_max_timestep = diffusion_gan_max_timestep
    g.network_context_manager = utils.NoOpContext()
    return g


GUIDANCE_ARGS = {"num_train_timesteps": 1000, "min_step_percent": 0.02, "max_step_percent": 0.98,
                 "fake_guidance_scale": 1.0, "use_fp16": False, "sdxl": False, "gan_alone": False,
                 "cls_on_clean_image": True, "gen_cls_loss": True, "gradient_checkpointing": False}

B, CH, H, W, L, D = 3, 4, 8, 8, 5, 6


def inputs(seed, dtype):
    g = torch.Generator().manual_seed(seed)
    return {"latents": (0.8 * torch.randn(B, CH, H, W, generator=g)).to(dtype),
            "real_latents": (0.8 * torch.randn(B, CH, H, W, generator=g)).to(dtype),
            "text_embedding": torch.randn(B, L, D, generator=g).to(dtype),
            "uncond_embedding": (0.1 * torch.randn(B, L, D, generator=g)).to(dtype)}


def replayed(draws):
    """A RecordingTorch whose randint / randn_like return `draws` in order (same shapes and dtypes): the float64
    runs replay the float32 run's draws."""
    queue = list(draws)

    def take(like_dtype=None):
        out = queue.pop(0)
        return out.to(like_dtype) if like_dtype is not None and out.is_floating_point() else out

    shim = RecordingTorch()
    shim.randint = lambda *a, **k: take()
    shim.randn_like = lambda x, **k: take(x.dtype)
    return shim


def run(kind, seed, dtype, params, draws=None):
    """One call of the upstream function `kind`; returns (outputs, gradients, draws)."""
    TORCH.draws = []
    torch.manual_seed(seed)  # the draws inside the upstream code come from the global generator
    shim = TORCH if draws is None else replayed(draws)
    guidance_module.torch = unified_module.torch = shim
    x = inputs(seed, dtype)
    g = make_guidance(dtype, **{k: v for k, v in params.items() if k in (
        "real_guidance_scale", "diffusion_gan", "diffusion_gan_max_timestep")})
    outs, grads = {}, {}
    if kind == "dm":
        latents = x["latents"].clone().requires_grad_(True)
        loss_dict, log = g.compute_distribution_matching_loss(latents, x["text_embedding"], x["uncond_embedding"],
                                                              None, None)
        loss_dict["loss_dm"].backward()
        outs = {"loss_dm": loss_dict["loss_dm"], "noisy_latents": log["dmtrain_noisy_latents"],
                "pred_real_image": log["dmtrain_pred_real_image"], "pred_fake_image": log["dmtrain_pred_fake_image"],
                "grad": log["dmtrain_grad"], "gradient_norm": torch.tensor(log["dmtrain_gradient_norm"]),
                "pred_real_noise": g.real_unet.outputs[0], "pred_fake_noise": g.fake_unet.outputs[0]}
        grads = {"grad_latents": latents.grad}
    elif kind == "fake":
        loss_dict, log = g.compute_loss_fake(x["latents"], x["text_embedding"], x["uncond_embedding"])
        loss_dict["loss_fake_mean"].backward()
        pred = g.fake_unet.outputs[0]
        outs = {"loss_fake_mean": loss_dict["loss_fake_mean"], "noisy_latents": log["faketrain_noisy_latents"],
                "x0_pred": log["faketrain_x0_pred"], "fake_noise_pred": pred}
        grads = {"grad_fake_noise_pred": pred.grad}
    elif kind == "gan_generator":
        image = x["latents"].clone().requires_grad_(True)
        loss_dict = g.compute_generator_clean_cls_loss(image, x["text_embedding"], None)
        loss_dict["gen_cls_loss"].backward()
        logits = g.cls_pred_branch.logits[0]
        outs = {"gen_cls_loss": loss_dict["gen_cls_loss"], "logits_fake": logits}
        grads = {"grad_logits_fake": logits.grad, "grad_image": image.grad}
    elif kind == "gan_guidance":
        loss_dict, log = g.compute_guidance_clean_cls_loss(x["real_latents"], x["latents"], x["uncond_embedding"],
                                                           x["text_embedding"])
        loss_dict["guidance_cls_loss"].backward()
        real, fake = g.cls_pred_branch.logits
        outs = {"guidance_cls_loss": loss_dict["guidance_cls_loss"], "logits_real": real, "logits_fake": fake,
                "pred_realism_on_real": log["pred_realism_on_real"],
                "pred_realism_on_fake": log["pred_realism_on_fake"]}
        grads = {"grad_logits_real": real.grad, "grad_logits_fake": fake.grad}
    else:
        raise ValueError(kind)
    recorded = TORCH.draws if draws is None else draws
    return outs, grads, recorded


DRAW_NAMES = {
    "dm": ["timesteps", "noise"],
    "fake": ["noise", "timesteps"],
    "gan_generator": [],
    "gan_guidance": [],
}
GAN_DIFFUSION_DRAWS = {"gan_generator": ["gan_timesteps", "gan_noise"],
                       "gan_guidance": ["gan_timesteps_real", "gan_noise_real", "gan_timesteps_fake",
                                        "gan_noise_fake"]}
FUNCTIONS = {
    "dm": "main/sd_guidance.py::SDGuidance.compute_distribution_matching_loss",
    "fake": "main/sd_guidance.py::SDGuidance.compute_loss_fake",
    "gan_generator": "main/sd_guidance.py::SDGuidance.compute_generator_clean_cls_loss",
    "gan_guidance": "main/sd_guidance.py::SDGuidance.compute_guidance_clean_cls_loss",
}

cases, tensors, f32_dev_max = [], {}, 0.0
LOSS_CASES = [
    ("dm.cfg1.75", "dm", 100, {"real_guidance_scale": 1.75}),
    ("dm.cfg8", "dm", 101, {"real_guidance_scale": 8.0}),
    ("dm.cfg1", "dm", 102, {"real_guidance_scale": 1.0}),
    ("fake.eps", "fake", 103, {}),
    ("gan.generator", "gan_generator", 104, {}),
    ("gan.guidance", "gan_guidance", 105, {}),
    ("gan.generator_diffusion1000", "gan_generator", 106, {"diffusion_gan": True, "diffusion_gan_max_timestep": 1000}),
    ("gan.guidance_diffusion1000", "gan_guidance", 107, {"diffusion_gan": True, "diffusion_gan_max_timestep": 1000}),
]
for name, kind, seed, params in LOSS_CASES:
    outs, grads, draws = run(kind, seed, torch.float32, params)
    outs64, grads64, _ = run(kind, seed, torch.float64, params, draws)
    draw_names = DRAW_NAMES[kind] + (GAN_DIFFUSION_DRAWS[kind] if params.get("diffusion_gan") else [])
    assert len(draws) == len(draw_names), (name, len(draws))
    x = inputs(seed, torch.float32)
    used = {"dm": ["latents", "text_embedding", "uncond_embedding"],
            "fake": ["latents", "text_embedding", "uncond_embedding"],
            "gan_generator": ["latents", "text_embedding"],
            "gan_guidance": ["real_latents", "latents", "text_embedding", "uncond_embedding"]}[kind]
    pre = name + "."
    case = {"name": name, "function": FUNCTIONS[kind] + " (imported from the file's own text)",
            "file": "losses.safetensors", "dtype": "f32",
            "params": {**GUIDANCE_ARGS, "real_guidance_scale": 1.75, "diffusion_gan": False,
                       "diffusion_gan_max_timestep": 0, **params, "shape": [B, CH, H, W],
                       "text_shape": [B, L, D], "real_unet": list(REAL), "fake_unet": list(FAKE),
                       "cls_pred_branch": list(HEAD)},
            "inputs": {}, "outputs": {}, "gradients": {}}
    if kind == "gan_guidance":
        case["params"]["text_embeddings"] = ("real_text_embedding = uncond_embedding, fake_text_embedding = "
                                             "text_embedding")
    for k in used + ["alphas_cumprod"]:
        value = x[k] if k != "alphas_cumprod" else DdpmScheduler(torch.float32).alphas_cumprod
        tensors[pre + k] = value
        case["inputs"][k] = pre + k
    for k, v in zip(draw_names, draws):
        tensors[pre + k] = v
        case["inputs"][k] = pre + k
    devs = {}
    for part, values, values64 in (("outputs", outs, outs64), ("gradients", grads, grads64)):
        for k, v in values.items():
            tensors[pre + k] = v
            case[part][k] = pre + k
            devs[k] = C.dev(v, values64[k])
    case["f32_vs_f64"] = devs
    case["tolerance"] = {"default": C.f32_tol(devs)}
    f32_dev_max = max(f32_dev_max, C.max_dev(devs))
    cases.append(case)


# ---------------------------------------------------------------- backward simulation (the generator's turn)
def make_unified(dtype, num_denoising_step):
    """An SDUniModel as its __init__ would make it for the 4-step SDXL LoRA recipe's generator turn (its own
    __init__ loads the models from the hub): denoising, backward_simulation, denoising_timestep 1000."""
    m = unified_module.SDUniModel.__new__(unified_module.SDUniModel)
    nn.Module.__init__(m)
    m.feedforward_model = ToyUNet(*GENERATOR, dtype)
    scheduler = DdpmScheduler(dtype)
    m.noise_scheduler = scheduler
    m.alphas_cumprod = scheduler.alphas_cumprod
    m.num_train_timesteps = 1000
    m.denoising = True
    m.backward_simulation = True
    m.denoising_timestep = 1000
    m.num_denoising_step = num_denoising_step
    m.denoising_step_list = torch.tensor(
        list(range(m.denoising_timestep - 1, 0, -(m.denoising_timestep // m.num_denoising_step))), dtype=torch.long)
    m.timestep_interval = m.denoising_timestep // m.num_denoising_step
    m.sdxl = True
    m.add_time_ids = torch.zeros(1, 6, dtype=dtype)
    m.gradient_checkpointing = False
    m.use_fp16 = False
    m.num_visuals = 4
    m.args = types.SimpleNamespace(gan_alone=False)
    return m


def text_encoder_for(text_embedding, pooled):
    return lambda batch: (text_embedding, pooled)


def run_backsim(seed, steps, dtype, draws=None):
    TORCH.draws = []
    torch.manual_seed(seed)  # the draws inside the upstream code come from the global generator
    shim = TORCH if draws is None else replayed(draws)
    guidance_module.torch = unified_module.torch = shim
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(B, CH, H, W, generator=g).to(dtype)
    text = torch.randn(B, L, D, generator=g).to(dtype)
    pooled = torch.randn(B, 8, generator=g).to(dtype)
    m = make_unified(dtype, steps)
    m.text_encoder = text_encoder_for(text, pooled)
    _, log = m.forward(noise, None, None, denoising_dict={}, real_train_dict=None,
                       compute_generator_gradient=False, generator_turn=True)
    calls = m.feedforward_model.outputs
    outs = {"denoising_timestep": log["denoising_timestep"], "generated_image": log["guidance_data_dict"]["image"],
            "generator_outputs": torch.stack(calls)}
    return outs, {"noise": noise, "text_embedding": text}, (TORCH.draws if draws is None else draws)


seen = {}
seed = 300
while len(seen) < 4 + 1:  # 4 steps: selected 0..3; 1 step: always 0
    outs, x, draws = run_backsim(seed, 4, torch.float32)
    key = ("4", int(draws[2]))
    if key not in seen:
        seen[key] = seed
    outs1, _, draws1 = run_backsim(seed, 1, torch.float32)
    key = ("1", int(draws1[2]))
    if key not in seen:
        seen[key] = seed
    seed += 1
for (steps, selected), seed in sorted(seen.items()):
    steps = int(steps)
    outs, x, draws = run_backsim(seed, steps, torch.float32)
    outs64, _, _ = run_backsim(seed, steps, torch.float64, draws)
    name = f"backsim.steps{steps}_selected{selected}"
    pre = name + "."
    draw_names = ["indices", "start_noise", "selected_step"] + [f"renoise{i}" for i in range(selected)]
    assert len(draws) == len(draw_names), (name, len(draws))
    case = {"name": name, "function": "main/sd_unified_model.py::SDUniModel.forward (generator_turn=True, "
                                      "compute_generator_gradient=False; imported from the file's own text)",
            "file": "backsim.safetensors", "dtype": "f32",
            "params": {"num_denoising_step": steps, "denoising_timestep": 1000, "backward_simulation": True,
                       "denoising": True, "num_train_timesteps": 1000, "shape": [B, CH, H, W],
                       "generator": list(GENERATOR),
                       "denoising_step_list": make_unified(torch.float32, steps).denoising_step_list.tolist()},
            "inputs": {"noise": pre + "noise", "text_embedding": pre + "text_embedding",
                       "alphas_cumprod": pre + "alphas_cumprod"},
            "outputs": {}}
    tensors[pre + "noise"] = x["noise"]
    tensors[pre + "text_embedding"] = x["text_embedding"]
    tensors[pre + "alphas_cumprod"] = DdpmScheduler(torch.float32).alphas_cumprod
    for k, v in zip(draw_names, draws):
        tensors[pre + k] = v
        case["inputs"][k] = pre + k
    devs = {}
    for k, v in outs.items():
        tensors[pre + k] = v
        case["outputs"][k] = pre + k
        devs[k] = C.dev(v, outs64[k])
    case["f32_vs_f64"] = devs
    case["tolerance"] = {"default": C.f32_tol(devs)}
    f32_dev_max = max(f32_dev_max, C.max_dev(devs))
    cases.append(case)

losses = {k: v for k, v in tensors.items() if not k.startswith("backsim.")}
backsim = {k: v for k, v in tensors.items() if k.startswith("backsim.")}
counts = {"losses.safetensors": C.write_safetensors(os.path.join(OUT, "losses.safetensors"), losses,
                                                    {"content": "DMD2 loss cases"}),
          "backsim.safetensors": C.write_safetensors(os.path.join(OUT, "backsim.safetensors"), backsim,
                                                     {"content": "DMD2 backward simulation cases"})}
doc = {
    "description": "Reference vectors computed by DMD2's own code (see README.md for every formula).",
    "generator": "generate.py (imports ../_common.py)",
    "upstream": UP.provenance(),
    **C.env_info(),
    "toy_models": {"unet": TOY_MODEL, "cls_pred_branch": TOY_HEAD,
                   "scheduler": "diffusers' DDIMScheduler for SD v1.5: scaled_linear betas, alphas_cumprod, "
                                "add_noise"},
    "tolerance_rule": "pass if |actual - expected| <= atol + rtol * |expected| elementwise",
    "f32_vs_f64_max_abs": f32_dev_max,
    "tensor_counts": counts,
    "cases": cases,
}
C.write_json(os.path.join(OUT, "cases.json"), doc)
print("cases", len(cases), "tensors", counts, "f32dev", f32_dev_max)
