"""Reference vectors for flow-matching DPO (flow_grpo @ 9745241, scripts/train_sd3_dpo.py) and, for comparison, the
Diffusion-DPO authors' epsilon-prediction loss (SalesforceAIResearch/DiffusionDPO @ 5233e75, train.py), computed by the
authors' own code, executed from the scripts' text (their imports - accelerate, ml_collections, diffusers, peft,
wandb, datasets, transformers, torchvision - cannot be loaded here).

flow_grpo: `get_sigmas` (function) and the statements of the `with accelerator.accumulate(transformer):` block from
`model_input = sample["latents"]` to `accelerator.backward(loss)` minus the model-call statement; the `dpo` branch of
`PerPromptStatTracker.update` (flow_grpo/stat_tracking.py, imported); `compute_density_for_timestep_sampling` from
diffusers' own text (huggingface/diffusers @ 58eb52c, src/diffusers/training_utils.py).
DiffusionDPO: the DPO pairing statement (`timesteps.chunk(2)[0].repeat(2)`, `noise.chunk(2)[0].repeat(...)`), the
`target = noise` statement and the `#### START LOSS COMPUTATION ####` statement, then `accelerator.backward(loss)`.
Run: OMP_NUM_THREADS=1 nice -n 19 /usr/bin/python3 generate.py
"""
import ast
import collections
import math
import os
import sys
import types

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _common as C  # noqa: E402

OUT = os.path.dirname(os.path.abspath(__file__))
C.setup()

UPF = C.Upstream("zhtmike+flow_grpo", "https://github.com/yifan123/flow_grpo", "9745241cf1101407e9b518dd4f10498092150522")
UPS = C.Upstream("SalesforceAIResearch+DiffusionDPO", "https://github.com/SalesforceAIResearch/DiffusionDPO",
                 "5233e75919f912f3f631958ee4ebb5b5204382d9")
UPD = C.Upstream("huggingface+diffusers", "https://github.com/huggingface/diffusers",
                 "58eb52c0803ea9af3abec60841c2a093bdf1f951")
FDPO = "scripts/train_sd3_dpo.py"
F_SRC = UPF.text(FDPO)
UPF.text("config/dpo.py")
ST_SRC = UPF.text("flow_grpo/stat_tracking.py")
S_SRC = UPS.text("train.py")
UPS.text("launchers/sd15.sh")
UPS.text("launchers/sdxl.sh")
D_PATH = "src/diffusers/training_utils.py"
D_SRC = UPD.text(D_PATH)

# ---------------------------------------------------------------- extraction
gs_src, gs_lines = C.function_source(F_SRC, "get_sigmas")
cd_src, cd_lines = C.function_source(D_SRC, "compute_density_for_timestep_sampling")
ftree = ast.parse(F_SRC)
acc = next(n for n in ast.walk(ftree) if isinstance(n, ast.With) and
           C.stmt_source(F_SRC, n).startswith("with accelerator.accumulate(transformer):"))
fb = acc.body
fsrc = [C.stmt_source(F_SRC, s) for s in fb]
f0 = next(i for i, s in enumerate(fsrc) if s.startswith('model_input = sample["latents"]'))
fauto = next(i for i, s in enumerate(fsrc) if s.startswith("with autocast():"))
fbw = next(i for i, s in enumerate(fsrc) if s.startswith("accelerator.backward(loss)"))
F_STMTS = [i for i in range(f0, fbw + 1) if i != fauto]
F_CODE = {i: compile(fsrc[i], f"{FDPO}:{fb[i].lineno}", "exec") for i in F_STMTS}
F_TEXT = "".join(fsrc[i] for i in F_STMTS)

stree = ast.parse(S_SRC)


def s_find(pred):
    for n in ast.walk(stree):
        if isinstance(n, ast.stmt) and pred(n, C.stmt_source(S_SRC, n)):
            return n
    raise LookupError


S_PAIR = s_find(lambda n, s: isinstance(n, ast.If) and s.startswith("if args.train_method == 'dpo':")
                and "timesteps.chunk(2)[0].repeat(2)" in s)
S_TARGET = s_find(lambda n, s: isinstance(n, ast.Assign) and s.strip() == "target = noise")
S_LOSS = s_find(lambda n, s: isinstance(n, ast.If) and s.startswith("if args.train_method == 'sft':")
                and "F.logsigmoid(inside_term)" in s)
S_BW = [n for n in ast.walk(stree) if isinstance(n, ast.Expr) and C.stmt_source(S_SRC, n).strip() ==
        "accelerator.backward(loss)"]
assert len(S_BW) == 1
S_BW = S_BW[0]
S_CODE = [compile(C.stmt_source(S_SRC, n), f"train.py:{n.lineno}", "exec") for n in [S_PAIR, S_TARGET, S_LOSS, S_BW]]
LINES = {"flow_grpo": {"get_sigmas": list(gs_lines), "accumulate_block_statements": [fb[f0].lineno, fb[fbw].end_lineno],
                       "skipped_model_calls": [fb[fauto].lineno, fb[fauto].end_lineno]},
         "diffusers": {"compute_density_for_timestep_sampling": list(cd_lines)},
         "DiffusionDPO": {"pairing": [S_PAIR.lineno, S_PAIR.end_lineno], "target": [S_TARGET.lineno] * 2,
                          "loss": [S_LOSS.lineno, S_LOSS.end_lineno], "backward": [S_BW.lineno] * 2}}

ns_lib = {"torch": torch, "math": math}
exec(compile(cd_src, f"diffusers/{D_PATH}", "exec"), ns_lib)
compute_density_for_timestep_sampling = ns_lib["compute_density_for_timestep_sampling"]
ns_gs = {"torch": torch}
exec(compile(gs_src, f"{FDPO}:get_sigmas", "exec"), ns_gs)
get_sigmas = ns_gs["get_sigmas"]
st_mod = types.ModuleType("flow_grpo.stat_tracking")
exec(compile(ST_SRC, "flow_grpo/stat_tracking.py", "exec"), st_mod.__dict__)


class TorchShim(types.ModuleType):
    def __init__(self, noise):
        super().__init__("torch")
        self._noise = noise

    def __getattr__(self, k):
        return getattr(torch, k)

    def randn_like(self, x, **kw):
        assert x.shape == self._noise.shape
        return self._noise.to(x.dtype).clone()


class StubAccelerator:
    def __init__(self, gas):
        self.gradient_accumulation_steps = gas
        self.device = "cpu"

    def backward(self, loss):
        (loss / self.gradient_accumulation_steps).backward()

    def gather(self, t):
        return t


def sd3_train_scheduler(shift=3.0, n=1000):
    """FlowMatchEulerDiscreteScheduler(shift=3).__init__ (1000 training timesteps), diffusers semantics."""
    ts = np.linspace(1, n, n, dtype=np.float32)[::-1].copy()
    t = torch.from_numpy(ts).to(torch.float32)
    s = t / n
    s = shift * s / (1 + (shift - 1) * s)
    return types.SimpleNamespace(timesteps=s * n, sigmas=s, config=types.SimpleNamespace(num_train_timesteps=n))


NS_SCHED = sd3_train_scheduler()
tensors = {"flow": {}, "sf": {}, "tracker": {}}
cases = []
rd_max = {}
f32_dev = {}

# ---------------------------------------------------------------- a. flow_grpo flow-matching DPO
SHAPE = (3, 4, 4, 4)  # 3 pairs -> model_input [6, 4, 4, 4]: chosen first, rejected second


def run_flow(inp, beta, gas, seed_u):
    ns = {"torch": TorchShim(inp["noise_draw"]), "F": F, "sample": {"latents": inp["latents"]},
          "compute_density_for_timestep_sampling": compute_density_for_timestep_sampling,
          "noise_scheduler": NS_SCHED, "get_sigmas": get_sigmas, "accelerator": StubAccelerator(gas),
          "config": types.SimpleNamespace(train=types.SimpleNamespace(beta=beta)),
          "info": collections.defaultdict(list)}
    mp = inp["model_pred"].clone().requires_grad_(True)
    torch.manual_seed(seed_u)  # compute_density_for_timestep_sampling draws torch.normal from the global RNG
    for i in F_STMTS:
        if i > fauto and "model_pred" not in ns:
            ns["model_pred"] = mp
            ns["model_pred_ref"] = inp["model_pred_ref"].detach()
        exec(F_CODE[i], ns)
    outs = {k: ns[k].detach().clone() if isinstance(ns[k], torch.Tensor) else torch.tensor(ns[k])
            for k in ["bsz", "noise", "u", "indices", "timesteps", "sigmas", "noisy_model_input", "target",
                      "theta_mse", "ref_mse", "model_w_err", "model_l_err", "ref_w_err", "ref_l_err", "w_diff",
                      "l_diff", "w_l_diff", "inside_term", "loss", "implicit_acc"]}
    info = {k: v[0].detach().clone() for k, v in ns["info"].items()}
    return outs, info, {"grad_model_pred": mp.grad.detach().clone()}


def rederive_flow(inp, outs, beta, gas):
    x = inp["latents"].double().numpy()
    n = inp["noise_draw"].double().numpy()
    bsz = x.shape[0] // 2
    n = np.concatenate([n[:bsz], n[:bsz]])
    sig = outs["sigmas"].double().numpy()  # from the recorded timestep draw (checked separately below)
    target = n - x
    mp = inp["model_pred"].double().numpy()
    mr = inp["model_pred_ref"].double().numpy()
    th = ((mp - target) ** 2).reshape(2 * bsz, -1).mean(1)
    rf = ((mr - target) ** 2).reshape(2 * bsz, -1).mean(1)
    wl = (th[:bsz] - rf[:bsz]) - (th[bsz:] - rf[bsz:])
    inside = -0.5 * beta * wl
    loss = np.mean(np.logaddexp(0, -inside))  # -logsigmoid(z) = log(1 + e^{-z})
    sgm = 1 / (1 + np.exp(inside))  # d(-logsigmoid(z))/dz = -sigmoid(-z)
    dz = -sgm / bsz / gas
    dwl = dz * (-0.5 * beta)
    N = mp[0].size
    g = np.zeros_like(mp)
    g[:bsz] = (dwl[:, None, None, None]) * 2 * (mp[:bsz] - target[:bsz]) / N
    g[bsz:] = (-dwl[:, None, None, None]) * 2 * (mp[bsz:] - target[bsz:]) / N
    return {"noisy_model_input": (1 - sig) * x + sig * n, "target": target, "theta_mse": th, "ref_mse": rf,
            "w_l_diff": wl, "inside_term": inside, "loss": loss, "grad_model_pred": g}


FLOW_CASES = [("flow_dpo.geneval_beta100_f32", 100.0, torch.float32, [0.0, 0.002, -0.004]),
              ("flow_dpo.beta100_saturated_f32", 100.0, torch.float32, [0.2, -0.3, 0.05]),
              ("flow_dpo.beta100_f64inputs", 100.0, torch.float64, [0.0, 0.002, -0.004])]
G_FLOW = 1 * int(40 * 0.99)  # config.train.gradient_accumulation_steps (1) * num_train_timesteps (39)
for ci, (name, beta, dt, shifts) in enumerate(FLOW_CASES):
    g = torch.Generator().manual_seed(300 + ci)
    lat = torch.randn((6,) + SHAPE[1:], generator=g)
    nd = torch.randn((6,) + SHAPE[1:], generator=g)
    tgt = torch.cat([nd[:3], nd[:3]]) - lat
    # predictions: reference near the target, policy = reference + per-pair shifts of the chosen / rejected error
    mr = tgt + 0.3 * torch.randn((6,) + SHAPE[1:], generator=g)
    mp = mr + 0.02 * torch.randn((6,) + SHAPE[1:], generator=g)
    for p, sft in enumerate(shifts):  # move the chosen prediction toward / away from its target
        mp[p] = mp[p] - sft * 10 * (mp[p] - tgt[p])
    inp = {"latents": lat.to(dt), "noise_draw": nd.to(dt), "model_pred": mp.to(dt), "model_pred_ref": mr.to(dt)}
    seed_u = 400 + ci
    outs, info, grads = run_flow(inp, beta, G_FLOW, seed_u)
    torch.manual_seed(seed_u)
    u_normal = torch.normal(mean=0.0, std=1.0, size=(3,))
    pre = name + "."
    for k, t in inp.items():
        tensors["flow"][pre + k] = t
    tensors["flow"][pre + "u_normal_draw"] = u_normal
    for k, t in {**outs, **grads}.items():
        tensors["flow"][pre + k] = t
    for k, t in info.items():
        tensors["flow"][pre + "info." + k] = t
    ref = rederive_flow(inp, outs, beta, G_FLOW)
    rdd = {k: C.dev({**outs, **grads}[k], ref[k])["max_abs"] for k in ref}
    # the timestep chain: u = sigmoid(normal), idx = long(u*1000), t = timesteps[idx], sigma = sigmas[idx]
    idx_ref = (torch.sigmoid(u_normal) * 1000).long()
    chain_ok = bool(torch.equal(idx_ref, outs["indices"]) and
                    torch.equal(torch.cat([NS_SCHED.sigmas[idx_ref]] * 2).view(-1, 1, 1, 1).to(dt), outs["sigmas"]))
    devs = {k: {"max_abs": v} for k, v in rdd.items()}
    per = {k: {"rtol": 1e-6, "atol": float(max(1e-9, 4 * v))} for k, v in rdd.items()}
    per.update({k: {"rtol": 0, "atol": 0} for k in ["bsz", "indices", "timesteps"]})
    case = {"name": name, "file": "flow_dpo.safetensors", "dtype": "f32" if dt == torch.float32 else "f64 inputs",
            "function": f"{FDPO}: get_sigmas (L{gs_lines[0]}-{gs_lines[1]}) and the accumulate-block statements "
                        f"L{LINES['flow_grpo']['accumulate_block_statements'][0]}-"
                        f"{LINES['flow_grpo']['accumulate_block_statements'][1]} (minus the model calls "
                        f"L{fb[fauto].lineno}-{fb[fauto].end_lineno}) incl. accelerator.backward(loss), exec'd from "
                        f"the text; diffusers compute_density_for_timestep_sampling exec'd from its text",
            "params": {"config.train.beta": beta, "pairs": 3, "latent_shape": list(SHAPE[1:]),
                       "accelerate_gradient_accumulation_steps": G_FLOW,
                       "weighting_scheme": "logit_normal", "logit_mean": 0, "logit_std": 1, "mode_scale": 1.29,
                       "global_seed_for_u": seed_u, "timestep_chain_reproduced": chain_ok,
                       "policy_shift_per_pair": shifts},
            "inputs": {k: pre + k for k in list(inp) + ["u_normal_draw"]},
            "outputs": {k: pre + k for k in outs}, "info": {k: pre + "info." + k for k in info},
            "gradients": {k: pre + k for k in grads}, "rederivation_per_tensor": rdd,
            "deviation_from_float64_formulas": devs,
            "tolerance": {"default": {"rtol": 1e-6, "atol": float(max(1e-6, 4 * max(rdd.values())))},
                          "per_tensor": per},
            "note": "model_pred/model_pred_ref/target are cast with .float() before the MSE, so the loss is float32 "
                    "whatever the input dtype (the f64-inputs case differs only before that cast: sigmas, "
                    "noisy_model_input, target F64). Tolerances: 4 x the deviation from a float64 evaluation of the "
                    "formulas (per tensor). u = sigmoid(u_normal_draw) where u_normal_draw = torch.normal(0, 1, (3,)) "
                    "from the global CPU RNG (recorded)"}
    rd_max[name] = max(rdd.values())
    cases.append(case)

# ---------------------------------------------------------------- b. DiffusionDPO (Salesforce) epsilon loss
SF_SHAPE = (4, 4, 4, 4)  # 4 pairs -> batch 8 (the script: train_batch_size pairs, chosen first half)


def run_sf(inp, beta, gas):
    args = types.SimpleNamespace(train_method="dpo", beta_dpo=beta, sdxl=False)
    mp = inp["model_pred"].clone().requires_grad_(True)

    class RefUnet:
        def __call__(self, *a, added_cond_kwargs=None):
            return types.SimpleNamespace(sample=inp["ref_pred"].clone())

    ns = {"torch": torch, "F": F, "args": args, "timesteps": inp["timesteps_draw"].clone(),
          "noise": inp["noise_draw"].clone(), "model_pred": mp, "ref_unet": RefUnet(),
          "model_batch_args": (None, None, None), "added_cond_kwargs": None, "accelerator": StubAccelerator(gas)}
    for code in S_CODE:
        exec(code, ns)
    outs = {k: ns[k].detach().clone() for k in ["timesteps", "noise", "target", "model_losses", "model_losses_w",
                                                 "model_losses_l", "raw_model_loss", "model_diff", "ref_losses",
                                                 "ref_losses_w", "ref_losses_l", "ref_diff", "raw_ref_loss",
                                                 "inside_term", "implicit_acc", "loss"]}
    return outs, {"grad_model_pred": mp.grad.detach().clone()}


def rederive_sf(inp, beta, gas):
    n = inp["noise_draw"].double().numpy()
    b = n.shape[0] // 2
    tgt = np.concatenate([n[:b], n[:b]])
    mp = inp["model_pred"].double().numpy()
    rp = inp["ref_pred"].double().numpy()
    ml = ((mp - tgt) ** 2).mean(axis=(1, 2, 3))
    rl = ((rp - tgt) ** 2).mean(axis=(1, 2, 3))
    inside = -0.5 * beta * ((ml[:b] - ml[b:]) - (rl[:b] - rl[b:]))
    loss = np.mean(np.logaddexp(0, -inside))
    dz = -1 / (1 + np.exp(inside)) / b / gas
    dd = dz * (-0.5 * beta)
    N = mp[0].size
    g = np.zeros_like(mp)
    g[:b] = dd[:, None, None, None] * 2 * (mp[:b] - tgt[:b]) / N
    g[b:] = -dd[:, None, None, None] * 2 * (mp[b:] - tgt[b:]) / N
    return {"target": tgt, "model_losses": ml, "ref_losses": rl, "inside_term": inside, "loss": loss,
            "grad_model_pred": g}


SF_CASES = [("diffusion_dpo.sd15_beta5000_f64", 5000.0, torch.float64, 128),
            ("diffusion_dpo.sd15_beta5000_f32", 5000.0, torch.float32, 128),
            ("diffusion_dpo.beta2500_f64", 2500.0, torch.float64, 128)]
for ci, (name, beta, dt, gas) in enumerate(SF_CASES):
    g = torch.Generator().manual_seed(600 + (ci if ci != 1 else 0))
    B2 = 2 * SF_SHAPE[0]
    nd = torch.randn((B2,) + SF_SHAPE[1:], generator=g)
    tdraw = torch.randint(0, 1000, (B2,), generator=g)
    tgt = torch.cat([nd[:4], nd[:4]])
    rp = tgt + 0.3 * torch.randn((B2,) + SF_SHAPE[1:], generator=g)
    mp = rp + 0.003 * torch.randn((B2,) + SF_SHAPE[1:], generator=g)
    inp = {"noise_draw": nd.to(dt), "timesteps_draw": tdraw, "model_pred": mp.to(dt), "ref_pred": rp.to(dt)}
    outs, grads = run_sf(inp, beta, gas)
    pre = name + "."
    for k, t in {**inp, **outs, **grads}.items():
        tensors["sf"][pre + k] = t
    ref = rederive_sf(inp, beta, gas)
    rdd = {k: C.dev({**outs, **grads}[k], ref[k])["max_abs"] for k in ref}
    case = {"name": name, "file": "diffusion_dpo.safetensors", "dtype": "f64" if dt == torch.float64 else "f32",
            "function": f"DiffusionDPO train.py: pairing statement L{S_PAIR.lineno}-{S_PAIR.end_lineno}, `target = "
                        f"noise` L{S_TARGET.lineno}, loss statement L{S_LOSS.lineno}-{S_LOSS.end_lineno}, "
                        f"accelerator.backward(loss) L{S_BW.lineno} (exec'd from the text)",
            "params": {"beta_dpo": beta, "train_method": "dpo", "pairs": 4, "latent_shape": list(SF_SHAPE[1:]),
                       "gradient_accumulation_steps": gas, "launcher": "launchers/sd15.sh: --beta_dpo 5000, "
                                                                        "train_batch_size 1, grad accumulation 128"},
            "inputs": {k: pre + k for k in inp}, "outputs": {k: pre + k for k in outs},
            "gradients": {k: pre + k for k in grads}, "rederivation_per_tensor": rdd,
            "note": "noise_draw/timesteps_draw are the batch's torch.randn_like / torch.randint draws before the "
                    "pairing statement (which keeps the first half for both halves); model_pred and ref_pred stand "
                    "in for unet(...).sample and ref_unet(...).sample"}
    if dt == torch.float64:
        case["tolerance"] = {"default": dict(C.F64_TOL), "per_tensor": {"timesteps": {"rtol": 0, "atol": 0},
                                                                        "implicit_acc": {"rtol": 1e-7, "atol": 1e-7}}}
        rd_max[name] = max(rdd.values())
        sf64 = (outs, grads)
    else:
        devs = {k: C.dev(v, {**sf64[0], **sf64[1]}[k]) for k, v in {**outs, **grads}.items()}
        case["f32_vs_f64"] = devs
        f32_dev["diffusion_dpo"] = C.max_dev(devs)
        per = {k: {"rtol": 1e-6, "atol": float(max(1e-12, 4 * v["max_abs"]))} for k, v in devs.items()}
        per["timesteps"] = {"rtol": 0, "atol": 0}
        case["tolerance"] = {"default": C.f32_tol(devs), "per_tensor": per}
        rd_max[name] = max(rdd.values())
    cases.append(case)

# ---------------------------------------------------------------- c. flow_grpo DPO pair selection (stat tracker)
TR_CASES = [("tracker.dpo_3prompts", ["p0", "p1", "p2", "p0", "p1", "p2", "p0", "p1", "p2", "p0", "p1", "p2"],
             [0.1, 0.5, 0.3, 0.7, 0.2, 0.3, 0.4, 0.9, 0.3, 0.2, 0.1, 0.3]),
            ("tracker.dpo_ties", ["a", "a", "a", "b", "b", "b", "c", "c", "c"],
             [0.5, 0.9, 0.9, 0.2, 0.1, 0.1, 0.4, 0.4, 0.4])]
for name, prompts, rewards in TR_CASES:
    tr = st_mod.PerPromptStatTracker(True)
    adv = tr.update(prompts, np.array(rewards, dtype=np.float32), type="dpo")
    uniq = sorted(set(prompts))
    pre = name + "."
    tensors["tracker"][pre + "rewards"] = np.array(rewards, dtype=np.float32)
    tensors["tracker"][pre + "prompt_index"] = np.array([uniq.index(p) for p in prompts], dtype=np.int64)
    tensors["tracker"][pre + "advantages"] = adv
    cases.append({"name": name, "file": "tracker.safetensors",
                  "function": "flow_grpo/stat_tracking.py::PerPromptStatTracker(global_std).update(prompts, rewards, "
                              "type='dpo') (imported)",
                  "params": {"prompts": prompts, "unique_prompts_sorted": uniq},
                  "inputs": {"rewards": pre + "rewards", "prompt_index": pre + "prompt_index"},
                  "outputs": {"advantages": pre + "advantages"}, "tolerance": {"default": {"rtol": 0, "atol": 0}},
                  "note": "per prompt: +1 at torch.argmax, -1 at torch.argmin (first occurrence), 0 elsewhere; if "
                          "argmax == argmin (all equal) index 1 gets +1 and index 0 gets -1 (within the prompt's "
                          "rows in batch order)"})

counts = {}
for key, fn, desc in [("flow", "flow_dpo.safetensors", "flow_grpo flow-matching DPO"),
                      ("sf", "diffusion_dpo.safetensors", "Diffusion-DPO (Salesforce) loss"),
                      ("tracker", "tracker.safetensors", "flow_grpo dpo pair selection")]:
    counts[fn] = C.write_safetensors(os.path.join(OUT, fn), tensors[key], {"content": desc})
doc = {
    "description": "Reference vectors computed by flow_grpo's DPO script and DiffusionDPO's train.py (see README.md).",
    "generator": "generate.py (imports ../_common.py)",
    "upstream": {"flow_grpo": UPF.provenance(), "DiffusionDPO": UPS.provenance(), "diffusers": UPD.provenance()},
    "upstream_lines": LINES,
    **C.env_info(),
    "noise_scheduler": "FlowMatchEulerDiscreteScheduler(shift=3.0) init: timesteps = sigmas*1000, 1000 entries "
                       "(sigmas = 3s/(1+2s), s = linspace(1, 1000, 1000)[::-1]/1000, float32)",
    "extracted": {"flow_grpo_get_sigmas": gs_src, "flow_grpo_block": F_TEXT,
                  "diffusers_compute_density_for_timestep_sampling": cd_src,
                  "DiffusionDPO_pairing": C.stmt_source(S_SRC, S_PAIR), "DiffusionDPO_loss":
                      C.stmt_source(S_SRC, S_LOSS)},
    "tolerance_rule": "pass if |actual - expected| <= atol + rtol * |expected| elementwise",
    "rederivation_max_abs_diff": rd_max,
    "f32_vs_f64_max_abs": f32_dev,
    "tensor_counts": counts,
    "cases": cases,
}
C.write_json(os.path.join(OUT, "cases.json"), doc)
print("cases", len(cases), counts, "rederive", rd_max, "f32dev", f32_dev)
for c in cases:
    if "flow_dpo" in c["name"] or "diffusion_dpo" in c["name"]:
        print(c["name"], {k: "%.1e" % v for k, v in c["rederivation_per_tensor"].items()})
