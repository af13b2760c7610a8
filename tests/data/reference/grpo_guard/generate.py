"""Reference vectors for GRPO-Guard (flow_grpo @ 9745241, scripts/train_sd3_GRPO_Guard.py), computed by the authors'
own code.

* `flow_grpo/diffusers_patch/sd3_sde_with_logprob.py` is imported (its module text executed as a module) with stub
  `diffusers` modules (randn_tensor, the scheduler class name) and a stand-in scheduler;
* from the text of `scripts/train_sd3_GRPO_Guard.py` (whose imports - accelerate, ml_collections, diffusers, peft,
  wandb, absl - cannot be loaded here) are executed: `compute_log_prob` (the function) and, inside the timestep loop,
  the `with autocast(): ... compute_log_prob(...)` statement and every statement from `advantages = torch.clamp(` (the
  `# grpo logic` block, RatioNorm) to `accelerator.backward(loss)`.
Run: OMP_NUM_THREADS=1 nice -n 19 /usr/bin/python3 generate.py
"""
import ast
import contextlib
import math
import os
import sys
import types

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _common as C  # noqa: E402

OUT = os.path.dirname(os.path.abspath(__file__))
C.setup()

UP = C.Upstream("zhtmike+flow_grpo", "https://github.com/yifan123/flow_grpo",
                "9745241cf1101407e9b518dd4f10498092150522")
SDE_PATH = "flow_grpo/diffusers_patch/sd3_sde_with_logprob.py"
SCRIPT = "scripts/train_sd3_GRPO_Guard.py"
SDE_SRC = UP.text(SDE_PATH)
SRC = UP.text(SCRIPT)
CFG_SRC = UP.text("config/grpo_guard.py")
BASE_SRC = UP.text("config/base.py")

# ---------------------------------------------------------------- import sde_step_with_logprob with stub diffusers
DRAWS = []


def randn_tensor(shape, generator=None, device=None, dtype=None, layout=None):
    x = torch.randn(shape, generator=generator, dtype=dtype)
    DRAWS.append(x.clone())
    return x


class FlowMatchEulerDiscreteScheduler:  # name only (type annotation in the module)
    pass


for name in ["diffusers", "diffusers.utils", "diffusers.utils.torch_utils", "diffusers.schedulers",
             "diffusers.schedulers.scheduling_flow_match_euler_discrete"]:
    sys.modules[name] = types.ModuleType(name)
sys.modules["diffusers.utils.torch_utils"].randn_tensor = randn_tensor
sys.modules["diffusers.schedulers.scheduling_flow_match_euler_discrete"].FlowMatchEulerDiscreteScheduler = \
    FlowMatchEulerDiscreteScheduler
sde_mod = types.ModuleType("flow_grpo.diffusers_patch.sd3_sde_with_logprob")
sde_mod.__file__ = SDE_PATH
exec(compile(SDE_SRC, SDE_PATH, "exec"), sde_mod.__dict__)
sde_step_with_logprob = sde_mod.sde_step_with_logprob


class StandInScheduler:
    """sigmas/timesteps as explicit tensors; index_for_timestep as diffusers (exact ==, 2nd match if several)."""

    def __init__(self, sigmas, timesteps):
        self.sigmas = sigmas
        self.timesteps = timesteps

    def index_for_timestep(self, timestep, schedule_timesteps=None):
        st = self.timesteps if schedule_timesteps is None else schedule_timesteps
        idx = (st == timestep).nonzero()
        pos = 1 if len(idx) > 1 else 0
        return idx[pos].item()


def sd3_schedule(n=10, shift=3.0, ntrain=1000):
    ts = np.linspace(1, ntrain, ntrain, dtype=np.float32)[::-1].copy()
    s = torch.from_numpy(ts).to(torch.float32) / ntrain
    s = shift * s / (1 + (shift - 1) * s)
    smin, smax = s[-1].item(), s[0].item()
    t = np.linspace(smax * ntrain, smin * ntrain, n)
    sig = t / ntrain
    sig = shift * sig / (1 + (shift - 1) * sig)
    sig = torch.from_numpy(sig).to(torch.float32)
    return sig * ntrain, torch.cat([sig, torch.zeros(1)])


SCHED_T, SCHED_S = sd3_schedule()
SCHED32 = StandInScheduler(SCHED_S.clone(), SCHED_T.clone())
SCHED64 = StandInScheduler(SCHED_S.double(), SCHED_T.clone())  # timesteps stay float32 (diffusers)
NSTEPS = 10
NTRAIN = int(NSTEPS * 0.99)  # 9

# ---------------------------------------------------------------- extract from the training script
clp_src, clp_lines = C.function_source(SRC, "compute_log_prob")
tree = ast.parse(SRC)
acc_with = None
for node in ast.walk(tree):
    if isinstance(node, ast.With) and C.stmt_source(SRC, node).startswith("with accelerator.accumulate(transformer):"):
        acc_with = node
assert acc_with is not None
wb = acc_with.body
wsrc = [C.stmt_source(SRC, s) for s in wb]
i_auto = next(i for i, s in enumerate(wsrc) if s.startswith("with autocast():"))
i_adv = next(i for i, s in enumerate(wsrc) if s.startswith("advantages = torch.clamp("))
i_bw = next(i for i, s in enumerate(wsrc) if s.startswith("accelerator.backward(loss)"))
assert i_auto < i_adv < i_bw
LOSS_STMTS = list(range(i_adv, i_bw + 1))
LINES = {"compute_log_prob": list(clp_lines), "autocast_compute_log_prob": [wb[i_auto].lineno, wb[i_auto].end_lineno],
         "loss_block": [wb[i_adv].lineno, wb[i_bw].end_lineno]}
AUTO_TEXT = wsrc[i_auto]
LOSS_TEXT = "".join(wsrc[i] for i in LOSS_STMTS)
CODE_AUTO = compile(AUTO_TEXT, f"{SCRIPT}:{wb[i_auto].lineno}", "exec")
CODE_LOSS = {i: compile(wsrc[i], f"{SCRIPT}:{wb[i].lineno}", "exec") for i in LOSS_STMTS}


class StubTransformer:
    """Returns a given tensor (the 'transformer output'); `module.disable_adapter()` switches to the reference."""

    def __init__(self, out, out_ref):
        self.out, self.out_ref, self.ref = out, out_ref, False
        self.module = self
        self.calls = []

    @contextlib.contextmanager
    def disable_adapter(self):
        self.ref = True
        try:
            yield
        finally:
            self.ref = False

    def __call__(self, hidden_states, timestep, encoder_hidden_states, pooled_projections, return_dict):
        self.calls.append({"ref": self.ref, "hidden_states": hidden_states, "timestep": timestep})
        o = self.out_ref if self.ref else self.out
        assert o.shape[0] == hidden_states.shape[0]
        return (o,)


class StubAccelerator:
    """accelerate's Accelerator.backward (non-DeepSpeed): (loss / gradient_accumulation_steps).backward()."""

    def __init__(self, gas):
        self.gradient_accumulation_steps = gas

    def backward(self, loss):
        (loss / self.gradient_accumulation_steps).backward()


def ns_config(cfg, clip, beta, noise_level=0.7, g=4.5):
    return types.SimpleNamespace(
        rationorm=True,
        train=types.SimpleNamespace(cfg=cfg, clip_range=clip, highclip_range=clip, adv_clip_max=5, beta=beta),
        sample=types.SimpleNamespace(guidance_scale=g, noise_level=noise_level))


# ---------------------------------------------------------------- behaviour (rollout) step, production float32
SHAPE = (6, 4, 4, 4)
ADV = [7.0, 2.0, -1.5, 0.6, -6.0, -0.3]
PERT = [0.0, 1e-5, 1e-4, 3e-4, 1e-3, 1e-2]  # per-sample |current - behaviour| scale of the guided velocity


def make_case_inputs(seed, j, cfg, g, noise_level, beta):
    gen = torch.Generator().manual_seed(seed)
    B = SHAPE[0]
    x = torch.randn(SHAPE, generator=gen) * (0.3 + SCHED_S[j].item())
    nb = torch.randn(SHAPE, generator=gen)  # behaviour guided velocity (CFG already applied), float32
    t = SCHED_T[j].repeat(B)
    DRAWS.clear()
    torch.set_default_dtype(torch.float32)
    with torch.no_grad():
        nxt, lp_old, mu_old, _, _ = sde_step_with_logprob(SCHED32, nb, t, x, noise_level=noise_level,
                                                         generator=torch.Generator().manual_seed(seed + 1),
                                                         return_sqrt_dt=True)
    eps = DRAWS[-1]
    delta = torch.randn(SHAPE, generator=gen) * torch.tensor(PERT).view(-1, 1, 1, 1)
    target = nb + delta
    if cfg:
        u = torch.randn(SHAPE, generator=gen)
        tx = u + (target - u) / g
        tout = torch.cat([u, tx])
        uref = u + 0.05 * torch.randn(SHAPE, generator=gen)
        tref = tx + 0.05 * torch.randn(SHAPE, generator=gen)
        rout = torch.cat([uref, tref])
    else:
        tout = target.clone()
        rout = target + 0.05 * torch.randn(SHAPE, generator=gen)
    adv_all = torch.randn(B, NTRAIN, generator=gen).double()
    adv_all[:, j] = torch.tensor(ADV, dtype=torch.float64)
    lp_all = -1.0 - torch.rand(B, NTRAIN, generator=gen)
    lp_all[:, j] = lp_old
    return dict(latents_j=x, next_latents_j=nxt, old_prev_sample_mean_j=mu_old.float(), old_log_probs_all=lp_all,
                advantages_all=adv_all, timestep_j=t, transformer_output=tout, transformer_output_ref=rout,
                behaviour_noise_pred=nb, behaviour_variance_noise=eps, behaviour_generator_seed=seed + 1)


OUT_NAMES = ["prev_sample", "log_prob", "prev_sample_mean", "std_dev_t", "sqrt_dt", "advantages", "sigma_t",
             "ratio_mean_bias", "ratio", "unclipped_loss", "clipped_loss", "policy_loss", "loss"]


def run_case(inp, cfgns, j, gas, f64):
    """Execute compute_log_prob + loss block + accelerator.backward on inp."""
    dt = torch.float64 if f64 else torch.float32
    torch.set_default_dtype(dt)
    try:
        sched = SCHED64 if f64 else SCHED32
        B = SHAPE[0]
        T = NTRAIN

        def full(x_j):  # [B, ...] -> [B, T, ...] with column j filled (only [:, j] is ever read)
            z = torch.zeros((B, T) + tuple(x_j.shape[1:]), dtype=x_j.dtype)
            z[:, j] = x_j
            return z

        sample = {"latents": full(inp["latents_j"].to(dt)), "next_latents": full(inp["next_latents_j"].to(dt)),
                  "timesteps": full(inp["timestep_j"]), "log_probs": inp["old_log_probs_all"].to(dt),
                  "prev_sample_mean": full(inp["old_prev_sample_mean_j"].to(dt)),
                  "advantages": inp["advantages_all"]}
        tout = inp["transformer_output"].to(dt).clone().requires_grad_(True)
        tref = inp["transformer_output_ref"].to(dt)
        tr = StubTransformer(tout, tref)
        g = globals()
        ns_f = {"torch": torch, "sde_step_with_logprob": sde_step_with_logprob}
        exec(compile(clp_src, f"{SCRIPT}:compute_log_prob", "exec"), ns_f)
        embeds = torch.zeros(2 * B if cfgns.train.cfg else B, 1)
        ns = {"torch": torch, "compute_log_prob": ns_f["compute_log_prob"], "transformer": tr,
              "pipeline": types.SimpleNamespace(scheduler=sched), "sample": sample, "j": j, "embeds": embeds,
              "pooled_embeds": embeds, "config": cfgns, "autocast": contextlib.nullcontext,
              "accelerator": StubAccelerator(gas), "info": __import__("collections").defaultdict(list)}
        exec(CODE_AUTO, ns)
        for k in ["log_prob", "prev_sample_mean"]:
            ns[k].retain_grad()
        snaps = {}
        for i in LOSS_STMTS:
            exec(CODE_LOSS[i], ns)
            if wsrc[i].startswith("if config.rationorm:") and "sigma_t = std_dev_t.mean()" in wsrc[i]:
                pass
            if wsrc[i].startswith("policy_loss = torch.mean("):
                snaps["policy_loss_before_dt_division"] = ns["policy_loss"].detach().clone()
        outs = {k: ns[k].detach().clone() for k in OUT_NAMES}
        if cfgns.train.beta > 0:
            outs["kl_loss"] = ns["kl_loss"].detach().clone()
            outs["prev_sample_mean_ref"] = ns["prev_sample_mean_ref"].detach().clone()
        info = {k: v[0].detach().clone() for k, v in ns["info"].items()}
        # noise_pred as the step saw it (reconstructed from the call: CFG combination) - recorded for a port
        grads = {"grad_transformer_output": tout.grad.detach().clone(),
                 "grad_log_prob": ns["log_prob"].grad.detach().clone(),
                 "grad_prev_sample_mean": ns["prev_sample_mean"].grad.detach().clone()}
        calls = [{"ref": c["ref"], "batch": int(c["hidden_states"].shape[0])} for c in tr.calls]
        return outs, info, snaps, grads, calls
    finally:
        torch.set_default_dtype(torch.float32)


# ---------------------------------------------------------------- independent float64 re-derivation (numpy)
def rederive(inp, cfgns, j, gas, f64):
    B = SHAPE[0]
    N = int(np.prod(SHAPE[1:]))
    o = inp["transformer_output"].double().numpy()
    g = cfgns.sample.guidance_scale
    if cfgns.train.cfg:
        u, tx = o[:B], o[B:]
        v = u + g * (tx - u)
    else:
        v = o.copy()
    v = v.astype(np.float32).astype(np.float64)  # the step's model_output.float()
    x = inp["latents_j"].double().numpy()
    xp = inp["next_latents_j"].double().numpy()
    s_sig = SCHED_S.double().numpy()
    sig, sigp, smax = s_sig[j], s_sig[j + 1], s_sig[1]
    eta = cfgns.sample.noise_level
    dt = sigp - sig
    s = math.sqrt(sig / (1 - (smax if sig == 1 else sig))) * eta
    mu = x * (1 + s * s / (2 * sig) * dt) + v * (1 + s * s * (1 - sig) / (2 * sig)) * dt
    std = s * math.sqrt(-dt)
    lp = (-(xp - mu) ** 2 / (2 * std * std) - math.log(std) - math.log(math.sqrt(2 * math.pi))).reshape(B, -1).mean(1)
    sd = math.sqrt(-dt)
    D = sd * s
    mu_old = inp["old_prev_sample_mean_j"].double().numpy()
    lp_old = inp["old_log_probs_all"].double().numpy()[:, j]
    bias = ((mu - mu_old) ** 2).mean() / (2 * D * D)  # scalar: mean over the whole batch
    z = (lp - lp_old + bias) * D
    rho = np.exp(z)
    A = np.clip(inp["advantages_all"].numpy()[:, j], -5, 5)
    eps_c = cfgns.train.clip_range
    unc = -A * rho
    clp = -A * np.clip(rho, 1 - eps_c, 1 + eps_c)
    pol0 = np.maximum(unc, clp).mean()
    pol = pol0 / sd ** 2
    loss = pol
    # gradient of loss / gas
    inside = (rho >= 1 - eps_c) & (rho <= 1 + eps_c)
    unc_active = unc > clp
    d_rho = np.where(inside | unc_active, -A, 0.0) / (B * sd ** 2 * gas)
    d_z = d_rho * rho
    d_lp = d_z * D
    d_bias = d_z.sum() * D
    d_mu = (d_lp[:, None, None, None] * (xp - mu) / (std * std * N)
            + d_bias * (mu - mu_old) / (B * N * D * D))
    res = {"log_prob": lp, "prev_sample_mean": mu, "ratio_mean_bias": bias, "ratio": rho, "unclipped_loss": unc,
           "clipped_loss": clp, "policy_loss_before_dt_division": pol0}
    if cfgns.train.beta > 0:
        oref = inp["transformer_output_ref"].double().numpy()
        vr = oref[:B] + g * (oref[B:] - oref[:B]) if cfgns.train.cfg else oref.copy()
        vr = vr.astype(np.float32).astype(np.float64)
        mur = x * (1 + s * s / (2 * sig) * dt) + vr * (1 + s * s * (1 - sig) / (2 * sig)) * dt
        kl = (((mu - mur) ** 2).reshape(B, -1).mean(1) / (2 * s * s)).mean()
        loss = pol + cfgns.train.beta * kl
        res["kl_loss"] = kl
        d_mu = d_mu + cfgns.train.beta * (mu - mur) / (s * s * N * B * gas)
    res["policy_loss"] = pol
    res["loss"] = loss
    res["grad_log_prob"] = d_lp
    res["grad_prev_sample_mean"] = d_mu
    d_v = d_mu * (1 + s * s * (1 - sig) / (2 * sig)) * dt
    d_v = d_v.astype(np.float32).astype(np.float64)  # autograd casts the grad back to model_output.float()'s dtype
    res["grad_transformer_output"] = np.concatenate([d_v * (1 - g), d_v * g]) if cfgns.train.cfg else d_v
    return res


# ---------------------------------------------------------------- cases
G_OCR = 4 * NTRAIN  # config.train.gradient_accumulation_steps (8 batches/epoch // 2) * num_train_timesteps
CASES = [
    # name, j, train.cfg, clip, beta, dtype, config
    ("guard.ocr_j0_f64", 0, True, 2e-6, 0.0, "f64", "general_ocr_sd3_rationorm"),
    ("guard.ocr_j4_f64", 4, True, 2e-6, 0.0, "f64", "general_ocr_sd3_rationorm"),
    ("guard.ocr_j8_f64", 8, True, 2e-6, 0.0, "f64", "general_ocr_sd3_rationorm"),
    ("guard.pickscore_j4_f64", 4, True, 4e-6, 0.0, "f64", "pickscore_hps_sd3_ratio_norm"),
    ("guard.ocr_j4_beta0.04_f64", 4, True, 2e-6, 0.04, "f64", "general_ocr_sd3_rationorm + train.beta 0.04"),
    ("guard.ocr_j4_nocfg_f64", 4, False, 2e-6, 0.0, "f64", "general_ocr_sd3_rationorm + train.cfg False"),
    ("guard.ocr_j4_production_f32", 4, True, 2e-6, 0.0, "f32", "general_ocr_sd3_rationorm"),
    ("guard.ocr_j0_beta0.04_production_f32", 0, True, 2e-6, 0.04, "f32",
     "general_ocr_sd3_rationorm + train.beta 0.04"),
]
tensors = {}
cases = []
rd_max = {"f64_cases": 0.0, "f32_cases": 0.0}
f32_dev_max = 0.0
for ci, (name, j, cfg, clip, beta, dt, cfgname) in enumerate(CASES):
    cfgns = ns_config(cfg, clip, beta)
    inp = make_case_inputs(1000 + 17 * ci, j, cfg, 4.5, 0.7, beta)
    f64 = dt == "f64"
    outs, info, snaps, grads, calls = run_case(inp, cfgns, j, G_OCR, f64)
    pre = name + "."
    case = {"name": name,
            "function": f"{SCRIPT}: compute_log_prob (L{clp_lines[0]}-{clp_lines[1]}) -> {SDE_PATH}::"
                        f"sde_step_with_logprob(return_sqrt_dt=True), then the '# grpo logic' block with "
                        f"config.rationorm=True and accelerator.backward(loss) (exec'd from the script text, "
                        f"L{LINES['loss_block'][0]}-{LINES['loss_block'][1]})",
            "file": "guard.safetensors", "dtype": dt,
            "params": {"config": cfgname, "j": j, "step_index": j, "sigma": SCHED_S[j].item(),
                       "sigma_prev": SCHED_S[j + 1].item(), "sigma_max_used_at_sigma_1": SCHED_S[1].item(),
                       "timestep": SCHED_T[j].item(), "noise_level": 0.7, "sde_type": "sde",
                       "train.cfg": cfg, "guidance_scale": 4.5, "clip_range": clip, "highclip_range_unused": clip,
                       "adv_clip_max": 5, "train.beta": beta, "rationorm": True,
                       "accelerate_gradient_accumulation_steps": G_OCR,
                       "accelerate_gradient_accumulation_steps_is": "config.train.gradient_accumulation_steps (4) * "
                                                                    "num_train_timesteps (9)",
                       "behaviour_generator_seed": inp["behaviour_generator_seed"],
                       "per_sample_perturbation_scale": PERT, "transformer_calls": calls},
            "schedule": "sd3_n10_shift3", "inputs": {}, "outputs": {}, "info": {}, "gradients": {}, "derived": {},
            "rollout_inputs_note": "latents_j, next_latents_j (= rollout prev_sample), old_log_probs_all[:, j] and "
                                   "old_prev_sample_mean_j come from a float32 rollout call of the same "
                                   "sde_step_with_logprob on behaviour_noise_pred with a CPU generator "
                                   "(behaviour_variance_noise = its draw)"}
    for k in ["latents_j", "next_latents_j", "old_prev_sample_mean_j", "old_log_probs_all", "advantages_all",
              "timestep_j", "transformer_output", "behaviour_noise_pred", "behaviour_variance_noise"]:
        tensors[pre + k] = inp[k].to(torch.float64) if (f64 and inp[k].dtype == torch.float32 and k != "timestep_j") \
            else inp[k]
        case["inputs"][k] = pre + k
    if beta > 0:
        k = "transformer_output_ref"
        tensors[pre + k] = inp[k].to(torch.float64) if f64 else inp[k]
        case["inputs"][k] = pre + k
    for k, v in outs.items():
        tensors[pre + k] = v
        case["outputs"][k] = pre + k
    for k, v in info.items():
        tensors[pre + "info." + k] = v
        case["info"][k] = pre + "info." + k
    for k, v in snaps.items():
        tensors[pre + "derived." + k] = v
        case["derived"][k] = pre + "derived." + k
    for k, v in grads.items():
        tensors[pre + k] = v
        case["gradients"][k] = pre + k
    rho = outs["ratio"].double()
    case["ratio_minus_1"] = (rho - 1).tolist()
    case["clipped"] = ((rho - 1).abs() > clip).tolist()
    ref = rederive(inp, cfgns, j, G_OCR, f64)
    got = {**outs, **snaps, **grads}
    rdd = {k: C.dev(got[k], ref[k]) for k in ref}
    rd = max(v["max_abs"] for v in rdd.values())
    case["rederivation_per_tensor"] = {k: v["max_abs"] for k, v in rdd.items()}
    case["rederivation_max_abs_diff"] = rd
    if f64:
        rd_max["f64_cases"] = max(rd_max["f64_cases"], rd)
        case["tolerance"] = {"default": dict(C.F64_TOL),
                             "per_tensor": {"grad_transformer_output": {"rtol": 1e-6, "atol": 1e-15},
                                            "info.clipfrac": {"rtol": 1e-7, "atol": 1e-7},
                                            "info.clipfrac_gt_one": {"rtol": 1e-7, "atol": 1e-7},
                                            "info.clipfrac_lt_one": {"rtol": 1e-7, "atol": 1e-7}}}
        case["note"] = ("inputs float32-representable, stored F64; sigmas F64 and torch default dtype F64, so the "
                        "step's arithmetic is F64 after its .float() casts of model_output/sample/prev_sample. With "
                        "train.cfg the guided noise_pred (F64) is rounded to F32 by that cast, and the gradient "
                        "w.r.t. the transformer output passes back through it (F32-accurate: per-tensor rtol 1e-6)")
    else:
        rd_max["f32_cases"] = max(rd_max["f32_cases"], rd)
        o64, i64, s64, g64, _ = run_case(inp, cfgns, j, G_OCR, True)
        devs = {}
        for d32, d64 in [(outs, o64), (snaps, s64), (grads, g64)]:
            for k in d32:
                devs[k] = C.dev(d32[k], d64[k])
        for k in info:
            devs["info." + k] = C.dev(info[k], i64[k])
        case["f32_vs_f64"] = devs
        f32_dev_max = max(f32_dev_max, C.max_dev(devs))
        dflt = C.f32_tol(devs)
        # per-tensor: 4 x the tensor's own deviation where that is tighter than the default (ratios must resolve
        # the clip range 2e-6; gradients are ~1e-4)
        per = {}
        for k, v in devs.items():
            a = float(max(4 * v["max_abs"], 1e-9 if not k.startswith("grad") else 1e-15))
            if a < dflt["atol"]:
                per[k] = {"rtol": 1e-6, "atol": a}
        case["tolerance"] = {"default": dflt, "per_tensor": per}
        case["dtypes"] = {k: str(v.dtype).replace("torch.", "") for k, v in {**outs, **grads}.items()}
        case["note"] = ("production dtypes: everything F32 (the step casts to F32; the schedule is F32), "
                        "advantages F64 (numpy tracker) -> advantages/unclipped/clipped/policy_loss/loss F64")
    cases.append(case)

ntens = C.write_safetensors(os.path.join(OUT, "guard.safetensors"), tensors, {"content": "GRPO-Guard cases"})
doc = {
    "description": "Reference vectors computed by flow_grpo's own GRPO-Guard code (see README.md).",
    "generator": "generate.py (imports ../_common.py)",
    "seed": "per case 1000 + 17*i (inputs), 1001 + 17*i (behaviour rollout generator)",
    "upstream": UP.provenance(),
    "upstream_lines": LINES,
    "mirror_note": "commit 9745241 is upstream yifan123/flow_grpo's own merge commit (PR #175); read from the "
                   "zhtmike/flow_grpo fork, whose HEAD it is (no fork-only commits)",
    **C.env_info(),
    "schedules": {"sd3_n10_shift3": {"num_inference_steps": NSTEPS, "shift": 3.0,
                                     "timesteps": SCHED_T.tolist(), "sigmas": SCHED_S.tolist()}},
    "extracted_from_train_script": {"compute_log_prob": clp_src, "autocast_statement": AUTO_TEXT,
                                    "loss_block": LOSS_TEXT},
    "tolerance_default": {"f64": dict(C.F64_TOL), "f32": {"rtol": 1e-6, "atol": 1e-6}},
    "tolerance_rule": "pass if |actual - expected| <= atol + rtol * |expected| elementwise",
    "rederivation_max_abs_diff": rd_max,
    "f32_vs_f64_max_abs": f32_dev_max,
    "tensor_count": ntens,
    "cases": cases,
}
C.write_json(os.path.join(OUT, "cases.json"), doc)
print("cases", len(cases), "tensors", ntens, "rederive", rd_max, "f32dev", f32_dev_max)
for c in cases:
    print(c["name"], c["rederivation_max_abs_diff"], ["%.2e" % r for r in c["ratio_minus_1"]], c["clipped"])
