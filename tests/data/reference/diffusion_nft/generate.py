"""Reference vectors for DiffusionNFT (NVlabs/DiffusionNFT @ 24af555), computed by the authors' own code.

Executes, from the text of scripts/train_nft_sd3.py (its module imports - diffusers, peft, wandb, absl, PIL - cannot be
loaded here):
  * the per-timestep training statements of main(): `x0 = ...` .. `xt = ...` (the noising) and `loss_terms = {}` ..
    the backward statement (`# Policy Gradient Loss`, adaptive weighting, KL), with stub model predictions;
  * `return_decay` and the old-policy update block (`with torch.no_grad(): decay = return_decay(...) ...`).
Run: OMP_NUM_THREADS=1 nice -n 19 /usr/bin/python3 generate.py   (writes next to this file)
"""
import ast
import copy
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

UP = C.Upstream("NVlabs+DiffusionNFT", "https://github.com/NVlabs/DiffusionNFT",
                "24af5554898d85e93efa492f42b5e9cdf4156e9b")
SCRIPT = "scripts/train_nft_sd3.py"
SRC = UP.text(SCRIPT)
CFG_SRC = UP.text("config/nft.py")
BASE_SRC = UP.text("config/base.py")

# ---------------------------------------------------------------- extract statements from the script's own text
tree = ast.parse(SRC)
inner_for = None
for node in ast.walk(tree):
    if isinstance(node, ast.For) and isinstance(node.target, ast.Tuple) and \
            [e.id for e in node.target.elts] == ["j_idx", "j_timestep_orig_idx"]:
        inner_for = node
assert inner_for is not None
body = inner_for.body
srcs = [C.stmt_source(SRC, s) for s in body]
i_x0 = next(i for i, s in enumerate(srcs) if s.startswith("x0 = train_sample_batch"))
i_xt = next(i for i, s in enumerate(srcs) if s.startswith("xt = "))
i_with = next(i for i, s in enumerate(body) if isinstance(s, ast.With))
i_lt = next(i for i, s in enumerate(srcs) if s.startswith("loss_terms = {}"))
i_bw = next(i for i, s in enumerate(srcs) if s.startswith("if mixed_precision_dtype == torch.float16:")
            and "backward()" in s)
assert i_x0 < i_xt < i_with < i_lt < i_bw
NOISE_STMTS = list(range(i_x0, i_xt + 1))
LOSS_STMTS = list(range(i_lt, i_bw + 1))
LINES = {"noising": [body[i_x0].lineno, body[i_xt].end_lineno], "loss": [body[i_lt].lineno, body[i_bw].end_lineno],
         "skipped_model_calls": [body[i_with].lineno, body[i_with].end_lineno]}
NOISE_TEXT = "".join(srcs[i] for i in NOISE_STMTS)
LOSS_TEXT = "".join(srcs[i] for i in LOSS_STMTS)
CODE = {i: compile(ast.Module(body=[ast.parse(srcs[i]).body[0]], type_ignores=[]), f"{SCRIPT}:{body[i].lineno}",
                   "exec") for i in NOISE_STMTS + LOSS_STMTS}

rd_src, rd_lines = C.function_source(SRC, "return_decay")
upd_body, upd_i = C.find_stmt_list(SRC, lambda st, s: isinstance(st, ast.With) and st.body and
                                   C.stmt_source(s, st.body[0]).startswith("decay = return_decay("))
UPD_NODE = upd_body[upd_i]
UPD_TEXT = C.stmt_source(SRC, UPD_NODE)
LINES["return_decay"] = list(rd_lines)
LINES["old_policy_update"] = [UPD_NODE.lineno, UPD_NODE.end_lineno]
ns_rd = {}
exec(compile(rd_src, f"{SCRIPT}:return_decay", "exec"), ns_rd)
return_decay = ns_rd["return_decay"]
UPD_CODE = compile(UPD_TEXT, f"{SCRIPT}:{UPD_NODE.lineno}", "exec")


class TorchShim(types.ModuleType):
    """`torch` for the exec'd text: everything is torch's, except randn_like returns the recorded draw."""

    def __init__(self, noise):
        super().__init__("torch")
        self._noise = noise

    def __getattr__(self, k):
        return getattr(torch, k)

    def randn_like(self, x, **kw):
        assert x.shape == self._noise.shape and x.dtype == torch.float32
        return self._noise.clone()


# ---------------------------------------------------------------- SD3.5 schedule (diffusers semantics, shift 3)
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
NSTEPS = 10
TFRAC = 0.99
NTRAIN = int(NSTEPS * TFRAC)  # 9


def make_inputs(seed, shape, B_adv, weight_clip_row=None):
    g = torch.Generator().manual_seed(seed)
    B = shape[0]
    x0 = 0.8 * torch.randn(shape, generator=g)
    noise = torch.randn(shape, generator=g)
    v_old = noise - x0 + 0.3 * torch.randn(shape, generator=g)
    v = v_old + 0.05 * torch.randn(shape, generator=g)
    v_ref = v_old + 0.1 * torch.randn(shape, generator=g)
    perms = torch.stack([torch.randperm(NSTEPS, generator=g) for _ in range(B)])
    timesteps_all = SCHED_T[perms]  # [B, 10] per-sample permuted schedule timesteps (float32)
    adv = torch.tensor(B_adv, dtype=torch.float64)[:, None].repeat(1, NTRAIN)  # [B, 9], F64 (numpy tracker)
    if weight_clip_row is not None:
        r = weight_clip_row
        v_old[r] = noise[r] - x0[r]
        v[r] = v_old[r]
    return dict(latents_clean=x0, noise=noise, forward_prediction=v, old_prediction=v_old,
                ref_forward_prediction=v_ref, timesteps_all=timesteps_all, advantages_all=adv, perms_time=perms)


OUT_NAMES = ["t", "t_expanded", "xt", "advantages_clip", "normalized_advantages_clip", "r", "positive_prediction",
             "implicit_negative_prediction", "x0_prediction", "weight_factor", "positive_loss",
             "negative_x0_prediction", "negative_weight_factor", "negative_loss", "ori_policy_loss", "policy_loss",
             "kl_div_loss", "loss", "scaled_loss"]
INFO_NAMES = ["x0_norm", "x0_norm_max", "old_deviate", "old_deviate_max", "policy_loss", "unweighted_policy_loss",
              "kl_div_loss", "kl_div", "old_kl_div", "total_loss"]


def run_loss(inp, cfg, j_idx, gas, to64=False):
    """Execute the script's statements on `inp`; returns outputs, info, derived, gradients."""
    cast = (lambda x: x.double()) if to64 else (lambda x: x)
    noise = inp["noise"].float()
    tsb = {"latents_clean": cast(inp["latents_clean"]), "timesteps": cast(inp["timesteps_all"]),
           "advantages": inp["advantages_all"]}
    v = cast(inp["forward_prediction"]).clone().requires_grad_(True)
    ns = {"torch": TorchShim(noise), "config": cfg, "train_sample_batch": tsb, "j_idx": j_idx,
          "forward_prediction": v, "old_prediction": cast(inp["old_prediction"]).detach(),
          "ref_forward_prediction": cast(inp["ref_forward_prediction"]),
          "effective_grad_accum_steps": gas, "mixed_precision_dtype": None, "scaler": None}
    snaps = {}
    for i in NOISE_STMTS + LOSS_STMTS:
        exec(CODE[i], ns)
        s = srcs[i]
        if s.startswith("policy_loss = (ori_policy_loss"):
            snaps["policy_loss_at_assignment"] = ns["policy_loss"].detach().clone()
        if s.startswith("kl_div_loss = ((forward_prediction"):
            snaps["kl_div_loss_per_sample"] = ns["kl_div_loss"].detach().clone()
    outs = {k: ns[k].detach().clone() for k in OUT_NAMES}
    info = {k: ns["loss_terms"][k].clone() for k in INFO_NAMES}
    assert set(ns["loss_terms"]) == set(INFO_NAMES)
    grads = {"grad_forward_prediction": v.grad.detach().clone()}
    return outs, info, snaps, grads


# ---------------------------------------------------------------- independent float64 re-derivation (numpy)
def rederive(inp, beta, klbeta, a, mode, j, gas):
    x0 = inp["latents_clean"].double().numpy()
    eps = inp["noise"].double().numpy()
    v = inp["forward_prediction"].double().numpy()
    vo = inp["old_prediction"].double().numpy()
    vr = inp["ref_forward_prediction"].double().numpy()
    B = x0.shape[0]
    red = tuple(range(1, x0.ndim))
    N = int(np.prod(x0.shape[1:]))
    t = inp["timesteps_all"].double().numpy()[:, j] / 1000.0
    te = t.reshape((B,) + (1,) * (x0.ndim - 1))
    xt = (1 - te) * x0 + te * eps
    A = np.clip(inp["advantages_all"].numpy()[:, j], -a, a)
    if mode == "positive_only":
        A = np.clip(A, 0, a)
    elif mode == "negative_only":
        A = np.clip(A, -a, 0)
    elif mode == "one_only":
        A = (A > 0).astype(np.float64)
    elif mode == "binary":
        A = np.sign(A)
    r = np.clip(A / a / 2 + 0.5, 0, 1)
    vp = beta * v + (1 - beta) * vo
    vn = (1 + beta) * vo - beta * v
    dp = xt - te * vp - x0
    dn = xt - te * vn - x0
    wp = np.maximum(np.abs(dp).mean(axis=red, keepdims=True), 1e-5)
    wn = np.maximum(np.abs(dn).mean(axis=red, keepdims=True), 1e-5)
    Lp = (dp ** 2 / wp).mean(axis=red)
    Ln = (dn ** 2 / wn).mean(axis=red)
    ori = r * Lp / beta + (1 - r) * Ln / beta
    pol = (ori * a).mean()
    kl = ((v - vr) ** 2).mean(axis=red)
    loss = pol + klbeta * kl.mean()
    rr = r.reshape(te.shape)
    grad = (a / B) * (-(rr / beta) * 2 * dp * te * beta / (wp * N) + ((1 - rr) / beta) * 2 * dn * te * beta / (wn * N))
    grad = (grad + klbeta * 2 * (v - vr) / (B * N)) / gas
    return {"xt": xt, "r": r, "weight_factor": wp, "negative_weight_factor": wn, "positive_loss": Lp,
            "negative_loss": Ln, "ori_policy_loss": ori, "policy_loss_at_assignment": pol, "kl_div_loss_per_sample": kl,
            "loss": loss, "scaled_loss": loss / gas, "grad_forward_prediction": grad}


# ---------------------------------------------------------------- cases
ADV = [7.5, 3.2, 0.4, 0.0, -2.6, -9.0]
J = 3
GAS = {"geneval/pickscore/hpsv2": 16 * NTRAIN, "ocr": 8 * NTRAIN}
tensors_loss = {}
cases = []
rederive_max = {"f64_cases": 0.0, "f32_cases": 0.0}
f32_dev_max = 0.0

LOSS_CASES = [
    # name, beta, train.beta, adv_mode, dtype, shape, gas_key, extra
    ("nft.beta1.0_all_f64", 1.0, 1e-4, "all", "f64", (6, 8, 16), "geneval/pickscore/hpsv2", {}),
    ("nft.beta0.1_all_f64", 0.1, 1e-4, "all", "f64", (6, 8, 16), "ocr", {}),
    ("nft.beta1.0_positive_only_f64", 1.0, 1e-4, "positive_only", "f64", (6, 8, 16), "geneval/pickscore/hpsv2", {}),
    ("nft.beta1.0_negative_only_f64", 1.0, 1e-4, "negative_only", "f64", (6, 8, 16), "geneval/pickscore/hpsv2", {}),
    ("nft.beta1.0_one_only_f64", 1.0, 1e-4, "one_only", "f64", (6, 8, 16), "geneval/pickscore/hpsv2", {}),
    ("nft.beta1.0_binary_f64", 1.0, 1e-4, "binary", "f64", (6, 8, 16), "geneval/pickscore/hpsv2", {}),
    ("nft.beta0.1_klbeta0_f64", 0.1, 0.0, "all", "f64", (6, 8, 16), "ocr", {}),
    ("nft.beta1.0_weightclip_f64", 1.0, 1e-4, "all", "f64", (6, 8, 16), "geneval/pickscore/hpsv2",
     {"weight_clip_row": 2}),
    ("nft.beta1.0_all_4d_f64", 1.0, 1e-4, "all", "f64", (6, 4, 4, 4), "geneval/pickscore/hpsv2", {}),
    ("nft.beta1.0_all_production_f32", 1.0, 1e-4, "all", "f32", (6, 8, 16), "geneval/pickscore/hpsv2", {}),
    ("nft.beta0.1_all_production_f32", 0.1, 1e-4, "all", "f32", (6, 8, 16), "ocr", {}),
]

for ci, (name, beta, klb, mode, dt, shape, gkey, extra) in enumerate(LOSS_CASES):
    inp = make_inputs(100 + ci, shape, ADV, extra.get("weight_clip_row"))
    if dt == "f64":
        for k in ["latents_clean", "forward_prediction", "old_prediction", "ref_forward_prediction",
                  "timesteps_all"]:
            inp[k] = inp[k].double()
    cfg = types.SimpleNamespace(beta=beta, train=types.SimpleNamespace(adv_clip_max=5, beta=klb, adv_mode=mode))
    gas = GAS[gkey]
    outs, info, snaps, grads = run_loss(inp, cfg, J, gas)
    case = {"name": name,
            "function": f"{SCRIPT} main(): per-timestep noising + '# Policy Gradient Loss' .. backward "
                        f"(exec'd from the script text, lines {LINES['noising'][0]}-{LINES['noising'][1]} and "
                        f"{LINES['loss'][0]}-{LINES['loss'][1]})",
            "file": "loss.safetensors", "dtype": dt,
            "params": {"config.beta": beta, "config.train.beta": klb, "config.train.adv_clip_max": 5,
                       "config.train.adv_mode": mode, "j_idx": J, "num_train_timesteps": NTRAIN,
                       "effective_grad_accum_steps": gas,
                       "effective_grad_accum_steps_is": f"config.train.gradient_accumulation_steps "
                                                        f"({gas // NTRAIN}, {gkey} configs on 8 GPUs) * "
                                                        f"num_train_timesteps ({NTRAIN})",
                       "mixed_precision_dtype": "None (the plain scaled_loss.backward() branch)",
                       "shape": list(shape)},
            "inputs": {}, "outputs": {}, "info": {}, "gradients": {}, "derived": {}}
    if "weight_clip_row" in extra:
        case["params"]["weight_clip_row"] = extra["weight_clip_row"]
    pre = name + "."
    for k in ["latents_clean", "noise", "forward_prediction", "old_prediction", "ref_forward_prediction",
              "timesteps_all", "advantages_all", "perms_time"]:
        tensors_loss[pre + k] = inp[k]
        case["inputs"][k] = pre + k
    for k, v in outs.items():
        tensors_loss[pre + k] = v
        case["outputs"][k] = pre + k
    for k, v in info.items():
        tensors_loss[pre + "info." + k] = v
        case["info"][k] = pre + "info." + k
    for k, v in snaps.items():
        tensors_loss[pre + "derived." + k] = v
        case["derived"][k] = pre + "derived." + k
    for k, v in grads.items():
        tensors_loss[pre + k] = v
        case["gradients"][k] = pre + k
    # independent re-derivation
    ref = rederive(inp, beta, klb, 5.0, mode, J, gas)
    got = {**outs, **snaps, **grads}
    rd = max(C.dev(got[k], ref[k])["max_abs"] for k in ref)
    key = "f64_cases" if dt == "f64" else "f32_cases"
    rederive_max[key] = max(rederive_max[key], rd)
    case["rederivation_max_abs_diff"] = rd
    if dt == "f32":
        o64, i64, s64, g64 = run_loss(inp, cfg, J, gas, to64=True)
        devs = {}
        for d32, d64 in [(outs, o64), (snaps, s64), (grads, g64)]:
            for k in d32:
                devs[k] = C.dev(d32[k], d64[k])
        for k in info:
            devs["info." + k] = C.dev(info[k], i64[k])
        case["f32_vs_f64"] = devs
        f32_dev_max = max(f32_dev_max, C.max_dev(devs))
        gd = devs["grad_forward_prediction"]["max_abs"]
        case["tolerance"] = {"default": C.f32_tol(devs), "per_tensor": {
            "grad_forward_prediction": {"rtol": 1e-6, "atol": float(max(1e-12, 4 * gd))}}}
        case["dtypes"] = {k: str(v.dtype).replace("torch.", "") for k, v in {**outs, **grads}.items()}
        case["note"] = ("production dtypes: latents, noise, predictions and timesteps F32, advantages F64 (numpy "
                        "float64 from the stat tracker); weight factors are F64 (.double()), so positive/negative "
                        "loss, r, ori_policy_loss, policy_loss and loss come out F64, the KL term F32")
    else:
        case["tolerance"] = {"default": dict(C.F64_TOL)}
    cases.append(case)

# ---------------------------------------------------------------- return_decay table + old-policy update
tensors_upd = {}
steps = torch.arange(0, 401, dtype=torch.int64)
for dtp in (0, 1, 2):
    name = f"return_decay.type{dtp}"
    vals = torch.tensor([return_decay(int(s), dtp) for s in steps], dtype=torch.float64)
    ref = np.array([min((s - [0, 0, 75][dtp]) * [0.0, 0.001, 0.0075][dtp], [0.0, 0.5, 0.999][dtp])
                    if s >= [0, 0, 75][dtp] else 0.0 for s in steps.tolist()])
    rd = C.dev(vals, ref)["max_abs"]
    rederive_max["f64_cases"] = max(rederive_max["f64_cases"], rd)
    tensors_upd[name + ".step"] = steps
    tensors_upd[name + ".decay"] = vals
    cases.append({"name": name, "function": f"{SCRIPT}::return_decay (exec'd from the script text, lines "
                                            f"{rd_lines[0]}-{rd_lines[1]})",
                  "file": "old_update.safetensors", "params": {"decay_type": dtp, "steps": "0..400"},
                  "inputs": {"step": name + ".step"}, "outputs": {"decay": name + ".decay"},
                  "tolerance": {"default": dict(C.F64_TOL)}, "rederivation_max_abs_diff": rd})

UPD_CASES = [(1, 0, "f64"), (1, 137, "f64"), (1, 900, "f64"), (2, 40, "f64"), (2, 150, "f64"), (2, 400, "f64"),
             (2, 150, "f32")]
for ui, (dtp, step, dt) in enumerate(UPD_CASES):
    g = torch.Generator().manual_seed(500 + ui)
    tdt = torch.float64 if dt == "f64" else torch.float32
    cur = [torch.randn(6, 8, generator=g).to(tdt), torch.randn(8, generator=g).to(tdt)]
    old = [c + 0.1 * torch.randn(c.shape, generator=g).to(tdt) for c in cur]
    old_in = [o.clone() for o in old]
    ns = {"torch": torch, "return_decay": return_decay, "global_step": step,
          "config": types.SimpleNamespace(decay_type=dtp),
          "transformer_trainable_parameters": [torch.nn.Parameter(c.clone()) for c in cur],
          "old_transformer_trainable_parameters": [torch.nn.Parameter(o.clone(), requires_grad=False) for o in old]}
    exec(UPD_CODE, ns)
    new_old = [p.detach().clone() for p in ns["old_transformer_trainable_parameters"]]
    name = f"old_update.type{dtp}_step{step}_{dt}"
    pre = name + "."
    case = {"name": name, "function": f"{SCRIPT} main(): old-policy update after each epoch (exec'd from the script "
                                      f"text, lines {UPD_NODE.lineno}-{UPD_NODE.end_lineno})",
            "file": "old_update.safetensors", "dtype": dt,
            "params": {"decay_type": dtp, "global_step": step, "decay": float(ns["decay"])},
            "inputs": {}, "outputs": {}}
    rd = 0.0
    d = float(ns["decay"])
    for pi in range(2):
        tensors_upd[pre + f"param{pi}"] = cur[pi]
        tensors_upd[pre + f"old_param{pi}"] = old_in[pi]
        tensors_upd[pre + f"new_old_param{pi}"] = new_old[pi]
        case["inputs"][f"param{pi}"] = pre + f"param{pi}"
        case["inputs"][f"old_param{pi}"] = pre + f"old_param{pi}"
        case["outputs"][f"new_old_param{pi}"] = pre + f"new_old_param{pi}"
        rd = max(rd, C.dev(new_old[pi], old_in[pi].double().numpy() * d + cur[pi].double().numpy() * (1 - d))[
            "max_abs"])
    if dt == "f32":
        devs = {f"new_old_param{pi}": C.dev(new_old[pi], old_in[pi].double() * d + cur[pi].double() * (1.0 - d))
                for pi in range(2)}
        case["f32_vs_f64"] = devs
        f32_dev_max = max(f32_dev_max, C.max_dev(devs))
        case["tolerance"] = {"default": C.f32_tol(devs)}
        rederive_max["f32_cases"] = max(rederive_max["f32_cases"], rd)
    else:
        case["tolerance"] = {"default": dict(C.F64_TOL)}
        rederive_max["f64_cases"] = max(rederive_max["f64_cases"], rd)
    case["rederivation_max_abs_diff"] = rd
    cases.append(case)

# ---------------------------------------------------------------- run_sampling: the deterministic rollout samplers
SOLVER_PATH = "flow_grpo/diffusers_patch/solver.py"
SOLVER_SRC = UP.text(SOLVER_PATH)
for _name in ["diffusers", "diffusers.utils", "diffusers.utils.torch_utils"]:
    sys.modules.setdefault(_name, types.ModuleType(_name))
sys.modules["diffusers.utils.torch_utils"].randn_tensor = \
    lambda shape, generator=None, device=None, dtype=None: torch.randn(shape, generator=generator, dtype=dtype)
_tqdm = types.ModuleType("tqdm")
_tqdm.tqdm = lambda it=None, **k: it
sys.modules["tqdm"] = _tqdm
solver = types.ModuleType("flow_grpo.diffusers_patch.solver")
solver.__file__ = SOLVER_PATH
exec(compile(SOLVER_SRC, SOLVER_PATH, "exec"), solver.__dict__)


def toy_velocity(z, i, table):
    """The stand-in model: 0.5 tanh(z) + table[i] at schedule step i (elementwise, float32)."""
    return 0.5 * torch.tanh(z) + table[i]


def sample_upstream(z, sigmas, table, name):
    calls = []

    def v_pred_fn(x, sigma):
        i = len(calls)
        assert sigma.item() == sigmas[i].item()
        calls.append(i)
        return toy_velocity(x, i, table)

    latents, all_latents, _ = solver.run_sampling(v_pred_fn, z.clone(), sigmas, solver=name, determistic=True)
    assert len(calls) == len(sigmas) - 1
    return latents, torch.stack(all_latents, dim=1)


def sample_rederived(z, sigmas, table, name):
    """numpy float64 from the formulas (dpm2: DDIM at the first and last step, DPM-Solver++(2M) between)."""
    x = z.double().numpy()
    s = sigmas.double().numpy()
    tab = table.double().numpy()
    lam = lambda sig: np.log(1 - sig) - np.log(sig)
    n = len(s) - 1
    kept, m_prev = [x], None
    with np.errstate(divide="ignore"):
        for i in range(n):
            v = 0.5 * np.tanh(x) + tab[i]
            x0 = x - s[i] * v
            if name == "flow":
                x = x + (s[i + 1] - s[i]) * v
            elif i == 0 or i == n - 1:
                x = (1 - s[i + 1]) * x0 + s[i + 1] * (x - (1 - s[i]) * x0) / s[i]
            else:
                h, h0 = lam(s[i + 1]) - lam(s[i]), lam(s[i]) - lam(s[i - 1])
                d1 = (h / h0) * (x0 - m_prev)
                c = (1 - s[i + 1]) * (np.exp(-h) - 1.0)
                x = (s[i + 1] / s[i]) * x - c * x0 - 0.5 * c * d1
            m_prev = x0
            kept.append(x)
    return x, np.stack(kept, axis=1)


tensors_sampling = {}
SAMPLING_SCHEDULES = {"sd3_n10_shift3": SCHED_S, "n8_shift2.2": sd3_schedule(8, 2.2)[1],
                      "n20_shift3": sd3_schedule(20, 3.0)[1]}
SAMPLING_CASES = [("dpm2", "sd3_n10_shift3"), ("dpm2", "n8_shift2.2"), ("dpm2", "n20_shift3"),
                  ("flow", "sd3_n10_shift3"), ("flow", "n8_shift2.2")]
for si, (name, schedule) in enumerate(SAMPLING_CASES):
    g = torch.Generator().manual_seed(700 + si)
    sigmas = SAMPLING_SCHEDULES[schedule]
    n = len(sigmas) - 1
    z = torch.randn(2, 12, 8, generator=g)
    table = 0.7 * torch.randn(n, 1, 12, 8, generator=g)
    latents, all_latents = sample_upstream(z, sigmas, table, name)
    x64, all64 = sample_rederived(z, sigmas, table, name)
    devs = {"latents": C.dev(latents, x64), "all_latents": C.dev(all_latents, all64)}
    f32_dev_max = max(f32_dev_max, C.max_dev(devs))
    case_name = f"sampling.{name}_{schedule}"
    pre = case_name + "."
    tensors_sampling.update({pre + "z": z, pre + "sigmas": sigmas, pre + "table": table, pre + "latents": latents,
                             pre + "all_latents": all_latents})
    cases.append({"name": case_name, "function": f"{SOLVER_PATH}::run_sampling (imported from the file's own text) "
                                                 f"with solver={name!r}, determistic=True",
                  "file": "sampling.safetensors", "dtype": "f32",
                  "params": {"solver": name, "schedule": schedule, "num_steps": n,
                             "model": "velocity = 0.5 tanh(z) + table[i] at schedule step i (float32)"},
                  "inputs": {"z": pre + "z", "sigmas": pre + "sigmas", "table": pre + "table"},
                  "outputs": {"latents": pre + "latents", "all_latents": pre + "all_latents"},
                  "f32_vs_f64": devs, "tolerance": {"default": C.f32_tol(devs)}})

counts = {}
counts["loss.safetensors"] = C.write_safetensors(os.path.join(OUT, "loss.safetensors"), tensors_loss,
                                                 {"content": "DiffusionNFT loss cases"})
counts["old_update.safetensors"] = C.write_safetensors(os.path.join(OUT, "old_update.safetensors"), tensors_upd,
                                                       {"content": "DiffusionNFT return_decay and old-policy update"})
counts["sampling.safetensors"] = C.write_safetensors(os.path.join(OUT, "sampling.safetensors"),
                                                     tensors_sampling,
                                                     {"content": "DiffusionNFT run_sampling (dpm2 and flow solvers)"})

doc = {
    "description": "Reference vectors computed by DiffusionNFT's own code (see README.md for every formula).",
    "generator": "generate.py (imports ../_common.py)",
    "seed": "per case (100+i for loss cases, 500+i for update cases)",
    "upstream": UP.provenance(),
    "upstream_lines": LINES,
    **C.env_info(),
    "schedules": {"sd3_n10_shift3": {"num_inference_steps": NSTEPS, "shift": 3.0,
                                     "timesteps": SCHED_T.tolist(), "sigmas": SCHED_S.tolist()}},
    "extracted_from_train_script": {"noising_block": NOISE_TEXT, "loss_block": LOSS_TEXT,
                                    "return_decay": rd_src, "old_policy_update": UPD_TEXT},
    "tolerance_default": {"f64": dict(C.F64_TOL), "f32": {"rtol": 1e-6, "atol": 1e-6}},
    "tolerance_rule": "pass if |actual - expected| <= atol + rtol * |expected| elementwise",
    "rederivation_max_abs_diff": rederive_max,
    "f32_vs_f64_max_abs": f32_dev_max,
    "tensor_counts": counts,
    "cases": cases,
}
C.write_json(os.path.join(OUT, "cases.json"), doc)
print("cases", len(cases), "tensors", counts, "rederive", rederive_max, "f32dev", f32_dev_max)
