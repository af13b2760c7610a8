"""Reference vectors for MixGRPO (Tencent-Hunyuan/MixGRPO @ e5cdd6a), computed by the authors' own code.

Imported (module text executed as a module): fastvideo/utils/grpo_states.py (pure python/numpy) and
fastvideo/utils/sampling_utils.py (with stub `diffusers.utils.torch_utils.randn_tensor` and `tqdm`).
Executed from the text of fastvideo/train_grpo_flux.py (its imports - wandb, fastvideo models, diffusers, cv2, einops,
PIL, reward models - cannot be loaded here): the GRPOTrainingStates construction statement and the per-step
`timesteps_train = grpo_states.get_current_timesteps(); grpo_states.update_iteration()` statement of main(), the
`determistic` mask statement of sample_reference_model, `grpo_one_step`, the advantage statement and the loss
statements of train_one_step.
Run: OMP_NUM_THREADS=1 nice -n 19 /usr/bin/python3 generate.py
"""
import ast
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

UP = C.Upstream("Tencent-Hunyuan+MixGRPO", "https://github.com/Tencent-Hunyuan/MixGRPO",
                "e5cdd6a427778d8c8b2e7a48ce16972141adbe7c")
STATES_PATH = "fastvideo/utils/grpo_states.py"
SU_PATH = "fastvideo/utils/sampling_utils.py"
SCRIPT = "fastvideo/train_grpo_flux.py"
STATES_SRC = UP.text(STATES_PATH)
SU_SRC = UP.text(SU_PATH)
SRC = UP.text(SCRIPT)
for sh in ["scripts/finetune/finetune_flux_grpo_MixGRPO.sh", "scripts/finetune/finetune_flux_grpo_MixGRPO_Flash.sh",
           "scripts/finetune/finetune_flux_grpo_MixGRPO_Flash*.sh"]:
    UP.text(sh)

# ---------------------------------------------------------------- imports with stubs
DRAWS = []


def randn_tensor(shape, generator=None, device=None, dtype=None, layout=None):
    x = torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype)
    DRAWS.append(x.clone())
    return x


for name in ["diffusers", "diffusers.utils", "diffusers.utils.torch_utils", "tqdm", "fastvideo", "fastvideo.utils"]:
    sys.modules.setdefault(name, types.ModuleType(name))
sys.modules["diffusers.utils.torch_utils"].randn_tensor = randn_tensor
sys.modules["tqdm"].tqdm = lambda it=None, **k: it


def import_text(modname, path, src):
    m = types.ModuleType(modname)
    m.__file__ = path
    sys.modules[modname] = m
    exec(compile(src, path, "exec"), m.__dict__)
    return m


class TorchShim(types.ModuleType):
    """`torch` for the exec'd code: torch's, except torch.autocast is a no-op context (torch 1.13 CPU builds raise on
    autocast('cuda', bfloat16)) and randn_like can be redirected to a recorded draw."""

    def __init__(self):
        super().__init__("torch")
        self.randn_like_fn = None

    def __getattr__(self, k):
        return getattr(torch, k)

    def randn_like(self, x, **kw):
        return self.randn_like_fn(x) if self.randn_like_fn is not None else torch.randn_like(x, **kw)

    class autocast:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False


TSHIM = TorchShim()
states_mod = import_text("fastvideo.utils.grpo_states", STATES_PATH, STATES_SRC)
su = import_text("fastvideo.utils.sampling_utils", SU_PATH, SU_SRC)
su.torch = TSHIM  # the module's global `torch`
GRPOTrainingStates = states_mod.GRPOTrainingStates

# ---------------------------------------------------------------- statements from the training script
TREE = ast.parse(SRC)


def find(pred):
    for n in ast.walk(TREE):
        if isinstance(n, ast.stmt) and pred(n, C.stmt_source(SRC, n)):
            return n
    raise LookupError


def code_of(node):
    return compile(C.stmt_source(SRC, node), f"{SCRIPT}:{node.lineno}", "exec")


N_STATES_NEW = find(lambda n, s: isinstance(n, ast.If) and s.startswith('if args.training_strategy == "part":')
                    and "GRPOTrainingStates(" in s)
N_STATES_STEP = find(lambda n, s: isinstance(n, ast.If) and s.startswith('if args.training_strategy == "part":')
                     and "grpo_states.update_iteration()" in s)
N_MASK = find(lambda n, s: isinstance(n, ast.If) and s.startswith('if args.training_strategy == "part":')
              and "determistic = [True] * sample_steps" in s)
N_ADV = find(lambda n, s: isinstance(n, ast.If) and s.startswith("if args.use_group:") and "trimmed_ratio" in s)
gos_src, gos_lines = C.function_source(SRC, "grpo_one_step")
tos = next(n for n in ast.walk(TREE) if isinstance(n, ast.FunctionDef) and n.name == "train_one_step")
loop = next(n for n in ast.walk(tos) if isinstance(n, ast.For) and isinstance(n.target, ast.Name)
            and n.target.id == "_")
lb = loop.body
lsrc = [C.stmt_source(SRC, s) for s in lb]
i0 = next(i for i, s in enumerate(lsrc) if s.startswith("advantages = torch.clamp("))
i1 = next(i for i, s in enumerate(lsrc) if s.startswith("loss.backward()"))
LOSS_STMTS = list(range(i0, i1 + 1))
LOSS_CODE = {i: compile(lsrc[i], f"{SCRIPT}:{lb[i].lineno}", "exec") for i in LOSS_STMTS}
LOSS_TEXT = "".join(lsrc[i] for i in LOSS_STMTS)
i_gos = next(i for i, s in enumerate(lsrc) if s.startswith("new_log_probs = grpo_one_step("))
GOS_CALL_CODE = compile(lsrc[i_gos], f"{SCRIPT}:{lb[i_gos].lineno}", "exec")
PRE_STMTS = [i for i, s_ in enumerate(lsrc) if s_.startswith("clip_range = args.clip_range")
             or s_.startswith("adv_clip_max = args.adv_clip_max")]
assert len(PRE_STMTS) == 2 and PRE_STMTS[-1] < i_gos
PRE_CODE = {i: compile(lsrc[i], f"{SCRIPT}:{lb[i].lineno}", "exec") for i in PRE_STMTS}
LINES = {"grpo_states_construction": [N_STATES_NEW.lineno, N_STATES_NEW.end_lineno],
         "grpo_states_step": [N_STATES_STEP.lineno, N_STATES_STEP.end_lineno],
         "determistic_mask": [N_MASK.lineno, N_MASK.end_lineno], "advantage_statement": [N_ADV.lineno,
                                                                                         N_ADV.end_lineno],
         "grpo_one_step": list(gos_lines), "loop_clip_statements": [lb[PRE_STMTS[0]].lineno,
                                                                    lb[PRE_STMTS[1]].end_lineno],
         "grpo_one_step_call": [lb[i_gos].lineno, lb[i_gos].end_lineno],
         "loss_statements": [lb[i0].lineno, lb[i1].end_lineno]}
NS_SCRIPT = {"torch": TSHIM, "math": math, "np": np, "flow_grpo_step": su.flow_grpo_step,
             "dance_grpo_step": su.dance_grpo_step, "dpm_step": su.dpm_step, "GRPOTrainingStates": GRPOTrainingStates}
exec(compile("\n" * (gos_lines[0] - 1) + gos_src, SCRIPT, "exec"), NS_SCRIPT)

tensors = {"states": {}, "step": {}, "rollout": {}, "loss": {}, "adv": {}}
cases = []
rd_max = {"f64_cases": 0.0, "f32_cases": 0.0, "states_tables": 0}
f32_dev = {}


def A(**k):
    d = dict(training_strategy="part", iters_per_group=25, group_size=4, sampling_steps=25, sample_strategy=
             "progressive", prog_overlap=True, prog_overlap_step=1, max_iters_per_group=10, min_iters_per_group=1,
             roll_back=True)
    d.update(k)
    return types.SimpleNamespace(**d)


# ---------------------------------------------------------------- a. sliding-window schedule tables
def states_trajectory(args, iters, seeds=None):
    ns = {"args": args, "GRPOTrainingStates": GRPOTrainingStates}
    exec(code_of(N_STATES_NEW), ns)
    st = ns["grpo_states"]
    starts, wins, lens, its = [], [], [], []
    for it in range(iters):
        starts.append(st.cur_timestep)
        its.append(st.cur_iter_in_group)
        if seeds is None:
            exec(code_of(N_STATES_STEP), ns)
        else:  # random strategy with an explicit seed (the script passes none: see README)
            ns["timesteps_train"] = st.get_current_timesteps()
            st.update_iteration(seed=seeds[it])
        tt = ns["timesteps_train"]
        lens.append(len(tt))
        wins.append(list(tt) + [-1] * (args.group_size - len(tt)))
    return (np.array(starts, dtype=np.int64), np.array(wins, dtype=np.int64), np.array(lens, dtype=np.int64),
            np.array(its, dtype=np.int64), st)


def rederive_progressive(args, iters):
    """Independent: the window rule as written in the README (not using grpo_states.py)."""
    mx = args.sampling_steps - 2
    cur, it = 0, 0
    out = []
    for _ in range(iters):
        win = list(range(cur, min(cur + args.group_size, mx)))
        out.append((cur, win))
        if args.sample_strategy == "progressive":
            n_it = args.iters_per_group
        elif args.sample_strategy == "decay":
            p = cur / mx
            n_it = max(args.min_iters_per_group, int(args.max_iters_per_group * (1 - p) +
                                                     args.min_iters_per_group * p))
        else:  # exp_decay
            n_it = math.ceil(args.iters_per_group * math.exp(-0.1 * max(0, cur - 13)))
        it += 1
        if it >= n_it:
            it = 0
            cur += args.prog_overlap_step if args.prog_overlap else args.group_size
        if cur > mx:
            if args.roll_back:
                cur, it = 0, 0
            else:
                cur = mx
    return out


STATE_CASES = [
    ("states.progressive_mixgrpo", A(), 700, None, "finetune_flux_grpo_MixGRPO.sh"),
    ("states.progressive_flash", A(iters_per_group=20), 560, None, "finetune_flux_grpo_MixGRPO_Flash.sh"),
    ("states.progressive_flash_star", A(iters_per_group=20, prog_overlap_step=0), 100, None,
     "finetune_flux_grpo_MixGRPO_Flash*.sh (prog_overlap_step 0)"),
    ("states.progressive_no_overlap_clip", A(prog_overlap=False, roll_back=False, iters_per_group=5), 60, None,
     "prog_overlap False, roll_back False (arg defaults for both)"),
    ("states.decay", A(sample_strategy="decay"), 200, None, "sample_strategy decay, max 10 / min 1 iters"),
    ("states.exp_decay", A(sample_strategy="exp_decay", iters_per_group=5), 150, None,
     "sample_strategy exp_decay, iters_per_group 5, threshold 13, k 0.1"),
    ("states.random_seeded", A(sample_strategy="random"), 50, list(range(50)),
     "sample_strategy random with update_iteration(seed=iteration); the script calls update_iteration() "
     "without a seed (fresh OS entropy every call)"),
]
for name, args, iters, seeds, src in STATE_CASES:
    starts, wins, lens, its, st = states_trajectory(args, iters, seeds)
    pre = name + "."
    for k, v in [("window_start", starts), ("timesteps_train", wins), ("window_len", lens),
                 ("cur_iter_in_group", its)]:
        tensors["states"][pre + k] = v
    case = {"name": name, "function": f"{STATES_PATH}::GRPOTrainingStates (imported), constructed and stepped by "
                                      f"{SCRIPT}'s own statements (L{LINES['grpo_states_construction'][0]}-"
                                      f"{LINES['grpo_states_construction'][1]}, L{LINES['grpo_states_step'][0]}-"
                                      f"{LINES['grpo_states_step'][1]})",
            "file": "states.safetensors",
            "params": {**vars(args), "max_timesteps": args.sampling_steps - 2, "iterations": iters, "source": src},
            "inputs": {}, "outputs": {k: pre + k for k in ["window_start", "timesteps_train", "window_len",
                                                           "cur_iter_in_group"]},
            "tolerance": {"default": {"rtol": 0, "atol": 0}},
            "note": "row it = training step it: window_start / cur_iter_in_group are the state before "
                    "get_current_timesteps(); timesteps_train padded with -1 to group_size"}
    if args.sample_strategy in ("progressive", "decay", "exp_decay"):
        ref = rederive_progressive(args, iters)
        mism = sum(1 for it in range(iters) if ref[it][0] != starts[it] or
                   ref[it][1] != [w for w in wins[it] if w >= 0])
        case["rederivation_mismatches"] = mism
        rd_max["states_tables"] = max(rd_max["states_tables"], mism)
    cases.append(case)


# ---------------------------------------------------------------- b. flow_grpo_step / dance_grpo_step (MixGRPO copies)
def sched(dt, S=25):
    torch.set_default_dtype(dt)
    try:
        return su.sd3_time_shift(3.0, torch.linspace(1, 0, S + 1))
    finally:
        torch.set_default_dtype(torch.float32)


SIG32, SIG64 = sched(torch.float32), sched(torch.float64)
ETA = 0.7


def rederive_fgs(v, x, idx, sig, eta, prev=None, noise=None, determ=False, latents_f32=False):
    """latents_f32: latents are a float32 tensor while sigmas/model_output are float64 (grpo_one_step's
    `latents.to(torch.float32)`): `latents * factor` with a 0-dim float64 factor is then a float32 product."""
    v = v.double().numpy()
    x = x.double().numpy()
    s, sp, smax = float(sig[idx]), float(sig[idx + 1]), float(sig[1])
    dt = sp - s
    x0 = x - s * v
    sd = math.sqrt(s / (1 - (smax if s == 1 else s))) * eta
    xf = x * (1 + sd ** 2 / (2 * s) * dt)
    if latents_f32:
        xf = (x.astype(np.float32) * np.float32(1 + sd ** 2 / (2 * s) * dt)).astype(np.float64)
    mu = xf + v * (1 + sd ** 2 * (1 - s) / (2 * s)) * dt
    if prev is None:
        prev = mu + sd * math.sqrt(-dt) * noise.double().numpy()
    else:
        prev = prev.double().numpy()
    if determ:
        prev = x + dt * v
    std = sd * math.sqrt(-dt)
    lp = (-(prev - mu) ** 2 / (2 * std ** 2) - math.log(std) - math.log(math.sqrt(2 * math.pi)))
    return {"prev_sample": prev, "pred_original_sample": x0, "log_prob": lp.reshape(lp.shape[0], -1).mean(1),
            "prev_sample_mean": mu, "std": np.full((1,), std)}


def run_fgs(v, x, idx, prev, f64, seed, determ=False, grad_w=None):
    dt = torch.float64 if f64 else torch.float32
    torch.set_default_dtype(dt)
    try:
        sig = SIG64 if f64 else SIG32
        DRAWS.clear()
        mo = v.to(dt).clone().requires_grad_(grad_w is not None)
        out = su.flow_grpo_step(model_output=mo, latents=x.to(dt), eta=ETA, sigmas=sig, index=idx,
                                prev_sample=None if prev is None else prev.to(dt),
                                generator=None if prev is not None else torch.Generator().manual_seed(seed),
                                determistic=determ)
        res = {"prev_sample": out[0].detach().clone(), "pred_original_sample": out[1].detach().clone(),
               "log_prob": out[2].detach().clone(), "prev_sample_mean": out[3].detach().clone(),
               "std": out[4].detach().clone().reshape(1)}
        if grad_w is not None:
            (out[2] * grad_w.to(dt)).sum().backward()
            res["grad_model_output"] = mo.grad.detach().clone()
        return res, (DRAWS[-1].clone() if DRAWS else None)
    finally:
        torch.set_default_dtype(torch.float32)


FSHAPE = (3, 16, 16)
for idx in [0, 12, 23]:
    for path in ["rollout", "recompute", "rollout_determistic"]:
        g = torch.Generator().manual_seed(5000 + idx * 11 + len(path))
        s = SIG32[idx].item()
        x = (1 - s) * 0.8 * torch.randn(FSHAPE, generator=g) + s * torch.randn(FSHAPE, generator=g)
        vb = torch.randn(FSHAPE, generator=g) - 0.5 * x
        prev, gw, v = None, None, vb
        if path == "recompute":
            rb, _ = run_fgs(vb, x, idx, None, False, 6000 + idx)
            prev = rb["prev_sample"]
            v = vb + torch.tensor([0.0, 1e-3, 1e-2]).view(-1, 1, 1) * torch.randn(FSHAPE, generator=g)
            gw = torch.randn(FSHAPE[0], generator=g)
        det = path == "rollout_determistic"
        for dt in ["f64", "f32"]:
            f64 = dt == "f64"
            res, noise = run_fgs(v, x, idx, prev, f64, 7000 + idx, determ=det, grad_w=gw)
            st = torch.float64 if f64 else torch.float32
            name = f"flow_grpo_step.s{idx}_{path}_{dt}"
            pre = name + "."
            ins = {"model_output": v.to(st), "latents": x.to(st)}
            if prev is not None:
                ins["prev_sample"] = prev.to(st)
                ins["grad_log_prob"] = gw
            if noise is not None:
                ins["variance_noise"] = noise.to(st)
            for k, t in {**ins, **res}.items():
                tensors["step"][pre + k] = t
            ref = rederive_fgs(v.to(st), x.to(st), idx, (SIG64 if f64 else SIG32).double().numpy(), ETA, prev=prev,
                               noise=noise, determ=det)
            rdd = {k: C.dev(res[k], ref[k])["max_abs"] for k in ref if not (det and k == "log_prob")}
            case = {"name": name, "function": f"{SU_PATH}::flow_grpo_step(model_output, latents, eta, sigmas, index, "
                                              f"prev_sample, generator, determistic)",
                    "file": "step.safetensors", "dtype": dt, "path": path,
                    "params": {"eta": ETA, "index": idx, "determistic": det, "sigma": float((SIG64 if f64 else
                                                                                             SIG32)[idx]),
                               "sigma_prev": float((SIG64 if f64 else SIG32)[idx + 1]),
                               "sigma_max": float((SIG64 if f64 else SIG32)[1]),
                               "generator_seed": None if prev is not None else 7000 + idx},
                    "schedule": f"flux_s25_shift3_{dt}",
                    "inputs": {k: pre + k for k in ins},
                    "outputs": {k: pre + k for k in res if k != "grad_model_output"},
                    "gradients": {"grad_model_output": pre + "grad_model_output"} if gw is not None else {},
                    "rederivation_per_tensor": rdd}
            if det:
                case["note"] = ("determistic=True: a noise tensor is still drawn (variance_noise) but prev_sample = "
                                "latents + dt*model_output (plain Euler, not prev_sample_mean); log_prob is then "
                                "computed against prev_sample_mean and is meaningless (never trained)")
            rdv = max(rdd.values())
            if f64:
                rd_max["f64_cases"] = max(rd_max["f64_cases"], rdv)
                case["tolerance"] = {"default": dict(C.F64_TOL)}
                res64 = res
            else:
                rd_max["f32_cases"] = max(rd_max["f32_cases"], rdv)
                devs = {k: C.dev(res[k], res64[k]) for k in res}
                case["f32_vs_f64"] = devs
                f32_dev["step"] = max(f32_dev.get("step", 0.0), C.max_dev(devs))
                per = {}
                if gw is not None:
                    per["grad_model_output"] = {"rtol": 1e-6, "atol": float(
                        max(1e-12, 4 * devs["grad_model_output"]["max_abs"]))}
                case["tolerance"] = {"default": C.f32_tol({k: d for k, d in devs.items() if k != "grad_model_output"}),
                                     "per_tensor": per}
            cases.append(case)

# dance_grpo_step (MixGRPO's copy): log_prob without the constants (no-op line)
for idx in [0, 12]:
    for sde in [True, False]:
        g = torch.Generator().manual_seed(8100 + idx + sde)
        x = 0.7 * torch.randn(FSHAPE, generator=g)
        v = torch.randn(FSHAPE, generator=g)
        torch.manual_seed(8200 + idx)
        res = {}
        for dt in ["f64"]:
            torch.set_default_dtype(torch.float64)
            try:
                gen_noise = torch.randn(FSHAPE, generator=torch.Generator().manual_seed(8300 + idx), dtype=torch.float32)
                TSHIM.randn_like_fn = lambda t: gen_noise.to(t.dtype)
                try:
                    out = su.dance_grpo_step(v.double(), x.double(), ETA, SIG64, idx, None, grpo=True, sde_solver=sde)
                finally:
                    TSHIM.randn_like_fn = None
            finally:
                torch.set_default_dtype(torch.float32)
        name = f"dance_grpo_step.s{idx}_{'sde' if sde else 'ode'}_f64"
        pre = name + "."
        s_, sp_ = float(SIG64[idx]), float(SIG64[idx + 1])
        std = ETA * math.sqrt(s_ - sp_)
        xd, vd = x.double().numpy(), v.double().numpy()
        x0 = xd - s_ * vd
        mu = xd + (sp_ - s_) * vd
        if sde:
            mu = mu + (-0.5 * ETA ** 2 * (-(xd - x0 * (1 - s_)) / s_ ** 2)) * (sp_ - s_)
            prev = mu + gen_noise.double().numpy() * std
        else:
            prev = mu
        lp_ref = (-(prev - mu) ** 2 / (2 * std ** 2)).reshape(3, -1).mean(1)
        lp_full = lp_ref - math.log(std) - math.log(math.sqrt(2 * math.pi))
        ins = {"model_output": v.double(), "latents": x.double()}
        if sde:
            ins["variance_noise"] = gen_noise.double()
        outs = {"prev_sample": out[0], "pred_original_sample": out[1], "log_prob": out[2]}
        for k, t in {**ins, **outs}.items():
            tensors["step"][pre + k] = t
        rdd = {"prev_sample": C.dev(out[0], prev)["max_abs"], "pred_original_sample": C.dev(out[1], x0)["max_abs"],
               "log_prob": C.dev(out[2], lp_ref)["max_abs"]}
        cases.append({"name": name, "function": f"{SU_PATH}::dance_grpo_step(model_output, latents, eta, sigmas, "
                                                f"index, prev_sample=None, grpo=True, sde_solver)",
                      "file": "step.safetensors", "dtype": "f64", "path": "rollout",
                      "params": {"eta": ETA, "index": idx, "sde_solver": sde, "std_dev_t": std},
                      "inputs": {k: pre + k for k in ins}, "outputs": {k: pre + k for k in outs},
                      "tolerance": {"default": {"rtol": 1e-6, "atol": 1e-6},
                                    "per_tensor": {"prev_sample": dict(C.F64_TOL),
                                                   "pred_original_sample": dict(C.F64_TOL)}},
                      "rederivation_per_tensor": rdd,
                      "log_prob_offset_vs_full_gaussian": float(lp_full[0] - lp_ref[0]),
                      "note": "MixGRPO's copy of DanceGRPO's step: the `- math.log(std_dev_t) - torch.log(...)` line is "
                              "a separate (no-op) statement, so log_prob = mean(-(prev-mu)^2/(2 std^2)) only. "
                              "log_prob is float32 (the .to(torch.float32) casts) -> tolerance 1e-6. With "
                              "sde_solver=False no noise is drawn and prev = mu (log_prob 0)."})
        rd_max["f64_cases"] = max(rd_max["f64_cases"], rdd["prev_sample"], rdd["pred_original_sample"])
        rd_max["f64_dance_log_prob_(float32_by_upstream)"] = max(rd_max.get("f64_dance_log_prob_(float32_by_upstream)",
                                                                            0.0), rdd["log_prob"])


# bf16 model output (production: the transformer runs under torch.autocast("cuda", torch.bfloat16))
for path in ["rollout", "recompute"]:
    idx = 12
    g = torch.Generator().manual_seed(8500 + (path == "recompute"))
    x = 0.6 * torch.randn(FSHAPE, generator=g)
    vb = torch.randn(FSHAPE, generator=g).to(torch.bfloat16)
    prev = None
    if path == "recompute":
        DRAWS.clear()
        prev = su.flow_grpo_step(model_output=vb, latents=x, eta=ETA, sigmas=SIG32, index=idx, prev_sample=None,
                                 generator=torch.Generator().manual_seed(8600))[0].float()
    DRAWS.clear()
    out = su.flow_grpo_step(model_output=vb, latents=x, eta=ETA, sigmas=SIG32, index=idx, prev_sample=prev,
                            generator=None if prev is not None else torch.Generator().manual_seed(8601))
    noise = DRAWS[-1].clone() if DRAWS else None
    outf = su.flow_grpo_step(model_output=vb.float(), latents=x, eta=ETA, sigmas=SIG32, index=idx,
                             prev_sample=prev if prev is not None else None,
                             generator=None if prev is not None else torch.Generator().manual_seed(8601))
    names = ["prev_sample", "pred_original_sample", "log_prob", "prev_sample_mean", "std"]
    name = f"flow_grpo_step.s12_{path}_bf16_model_output"
    pre = name + "."
    ins = {"model_output_bf16_values": vb.float(), "latents": x}
    if prev is not None:
        ins["prev_sample"] = prev
    if noise is not None:
        ins["variance_noise"] = noise.float()
    for k, t in ins.items():
        tensors["step"][pre + k] = t
    for k, t in zip(names, out):
        tensors["step"][pre + k] = t.detach().float().reshape(-1) if k == "std" else t.detach().float()
    cases.append({"name": name, "function": f"{SU_PATH}::flow_grpo_step with a bfloat16 model_output and float32 "
                                            f"latents/sigmas (as under bf16 autocast)",
                  "file": "step.safetensors", "dtype": "bf16+f32", "path": path,
                  "params": {"eta": ETA, "index": idx, "generator_seed": None if prev is not None else 8601},
                  "inputs": {k: pre + k for k in ins}, "outputs": {k: pre + k for k in names},
                  "output_dtypes": {k: str(t.dtype).replace("torch.", "") for k, t in zip(names, out)},
                  "difference_vs_float32_model_output": {k: C.dev(a.float(), b.float()) for k, a, b in
                                                         zip(names, out, outf)},
                  "tolerance": {"default": {"rtol": 1e-6, "atol": 1e-6}},
                  "note": "model_output_bf16_values must be cast to bfloat16 before the call. sigma/dt are 0-dim "
                          "tensors, so `sigma * model_output` and `model_output * (...) * dt` stay bfloat16 products; "
                          "pred_original_sample / prev_sample_mean are float32 sums with bf16-rounded velocity "
                          "terms; the variance noise is drawn in bfloat16 (dtype=model_output.dtype) - stored as F32"})


# ---------------------------------------------------------------- c. window mask + rollout RNG consumption
class ToyFlux:
    def __init__(self, table, tvals):
        self.table, self.tvals, self.calls = table, tvals, []

    def eval(self):
        pass

    def train(self):
        pass

    def __call__(self, hidden_states, encoder_hidden_states, timestep, guidance, txt_ids, pooled_projections,
                 img_ids, joint_attention_kwargs, return_dict):
        k = self.tvals.index(int(round(float(timestep.double().reshape(-1)[0]) * 1000)))
        out = self.table[k].unsqueeze(0) + 0.5 * hidden_states
        self.calls.append(k)
        return (out,)


S_TOK, CH = 4, 16
for wstart in [0, 21, 23]:
    args = A(eta=ETA, dpm_algorithm_type="null", flow_grpo_sampling=True, drop_last_sample=False,
             dpm_apply_strategy="post")
    st = GRPOTrainingStates(iters_per_group=25, group_size=4, max_timesteps=23, cur_timestep=wstart)
    timesteps_train = st.get_current_timesteps()
    ns = {"args": args, "timesteps_train": timesteps_train, "sample_steps": 25}
    exec(code_of(N_MASK), ns)
    det = ns["determistic"]
    g = torch.Generator().manual_seed(9000 + wstart)
    table = 0.5 * torch.randn(25, S_TOK, CH, generator=g)
    z0 = torch.randn(1, S_TOK, CH, generator=g).to(torch.bfloat16).float()
    tvals = [int(s * 1000) for s in SIG32][:25]
    tr = ToyFlux(table, tvals)
    torch.manual_seed(9100 + wstart)  # randn_tensor(generator=None) uses the global RNG
    DRAWS.clear()
    with torch.no_grad():
        z, lat, all_lat, all_lp = su.run_sample_step(args, z0.clone(), range(0, 25), SIG32, tr, torch.zeros(1, 3, 8),
                                                     torch.zeros(1, 8), torch.zeros(3, 3), torch.zeros(S_TOK, 3),
                                                     True, determistic=det)
    draws = torch.stack(DRAWS)[:, 0]
    name = f"rollout.window_start{wstart}"
    pre = name + "."
    for k, t in {"determistic": torch.tensor(det, dtype=torch.int64), "timesteps_train":
                 torch.tensor(timesteps_train + [-1] * (4 - len(timesteps_train)), dtype=torch.int64),
                 "toy_table": table, "initial_latents": z0, "variance_noise": draws, "all_latents": all_lat,
                 "all_log_probs": all_lp, "final_latents": lat}.items():
        tensors["rollout"][pre + k] = t
    # independent re-derivation of the chain from the recorded draws
    zz = z0.double().numpy()
    sig = SIG32.double().numpy()
    maxd = 0.0
    for i in range(25):
        v = (table[i].double().numpy() + 0.5 * zz[0])[None]
        r = rederive_fgs(torch.from_numpy(v), torch.from_numpy(zz), i, sig, ETA, noise=draws[i][None], determ=det[i])
        zz = r["prev_sample"]
        maxd = max(maxd, float(np.abs(zz - all_lat[:, i + 1].double().numpy()).max()))
        if not det[i]:
            maxd = max(maxd, abs(float(r["log_prob"][0]) - float(all_lp[0, i])))
    cases.append({"name": name, "function": f"{SCRIPT} sample_reference_model's `determistic` statement (L"
                                            f"{N_MASK.lineno}-{N_MASK.end_lineno}) + {SU_PATH}::run_sample_step "
                                            f"(flow_grpo_sampling, dpm_algorithm_type null) with a toy transformer",
                  "file": "rollout.safetensors", "dtype": "f32",
                  "params": {"window_start": wstart, "timesteps_train": timesteps_train, "sampling_steps": 25,
                             "eta": ETA, "global_seed": 9100 + wstart, "draws": len(DRAWS),
                             "toy": "out = toy_table[k] + 0.5*hidden_states"},
                  "inputs": {k: pre + k for k in ["toy_table", "initial_latents", "variance_noise"]},
                  "outputs": {k: pre + k for k in ["determistic", "timesteps_train", "all_latents", "all_log_probs",
                                                   "final_latents"]},
                  "tolerance": {"default": {"rtol": 1e-5, "atol": 1e-5},
                                "per_tensor": {"determistic": {"rtol": 0, "atol": 0},
                                               "timesteps_train": {"rtol": 0, "atol": 0}}},
                  "rederivation_vs_float64_formulas": maxd,
                  "note": "one randn_tensor draw per step (25), also on deterministic steps; deterministic steps are "
                          "x + dt*v; their all_log_probs entries are garbage (log-prob of the Euler point under the "
                          "SDE transition) and never used; window start 23 = the empty window (range(23, 23)): the "
                          "whole rollout is deterministic and nothing is trained"})
    rd_max["rollout_chain_vs_float64_formulas"] = max(rd_max.get("rollout_chain_vs_float64_formulas", 0.0), maxd)

# ---------------------------------------------------------------- d. grpo_one_step + loss block
B = 6
ADV = [7.0, 2.0, -1.5, 0.6, -6.0, -0.3]
PERT = [0.0, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2]


class StubFlux:
    def __init__(self, out):
        self.out = out

    def train(self):
        pass

    def __call__(self, **k):
        return (self.out,)


def run_loss_case(f64, kl_coeff, window, j, seed):
    dt = torch.float64 if f64 else torch.float32
    g = torch.Generator().manual_seed(seed)
    sig = SIG64 if f64 else SIG32
    tv = [int(s * 1000) for s in sig][:25]
    res = {k: [] for k in ["new_log_probs", "advantages", "ratio", "unclipped_loss", "clipped_loss", "clip_frac",
                           "policy_loss", "kl_loss", "loss", "grad_new_log_probs"]}
    ins = {k: [] for k in ["latents_j", "next_latents_j", "old_log_probs", "advantages_in", "transformer_output"]}
    grads = []
    for b in range(B):
        s = SIG32[j].item()
        x = (1 - s) * 0.8 * torch.randn(1, S_TOK, CH, generator=g) + s * torch.randn(1, S_TOK, CH, generator=g)
        vb = torch.randn(1, S_TOK, CH, generator=g) - 0.5 * x
        DRAWS.clear()
        with torch.no_grad():
            rb, _ = run_fgs(vb, x, j, None, False, seed + 100 + b)
        nxt = rb["prev_sample"]
        old_lp = torch.randn(1, 24, generator=g)
        old_lp[0, j] = rb["log_prob"][0]
        v = vb + PERT[b] * torch.randn(1, S_TOK, CH, generator=g)
        torch.set_default_dtype(dt)
        try:
            out = v.to(dt).clone().requires_grad_(True)
            sample = {"latents": torch.zeros(1, 24, S_TOK, CH, dtype=dt),
                      "next_latents": torch.zeros(1, 24, S_TOK, CH, dtype=dt),
                      "encoder_hidden_states": torch.zeros(1, 3, 8), "pooled_prompt_embeds": torch.zeros(1, 8),
                      "text_ids": torch.zeros(3, 3), "image_ids": torch.zeros(1, S_TOK, 3),
                      "timesteps": torch.tensor([tv[:24]], dtype=torch.int64), "log_probs": old_lp.to(dt),
                      "advantages": torch.tensor([ADV[b]], dtype=dt)}
            sample["latents"][0, j] = x.to(dt)[0]
            sample["next_latents"][0, j] = nxt.to(dt)[0]
            args = A(eta=ETA, dpm_algorithm_type="null", flow_grpo_sampling=True, clip_range=1e-4, adv_clip_max=5.0,
                     gradient_accumulation_steps=3, kl_coeff=kl_coeff)
            ns = dict(NS_SCRIPT)
            ns.update({"args": args, "sample": sample, "_": j, "i": b, "transformer": StubFlux(out),
                       "sigma_schedule": sig, "train_timesteps": window, "perms": None})
            for i in PRE_STMTS:
                exec(PRE_CODE[i], ns)
            exec(GOS_CALL_CODE, ns)
            ns["new_log_probs"].retain_grad()
            for i in LOSS_STMTS:
                exec(LOSS_CODE[i], ns)
            for k in res:
                if k != "grad_new_log_probs":
                    res[k].append(ns[k].detach().clone().reshape(-1))
            grads.append(out.grad.detach().clone()[0])
            res["grad_new_log_probs"].append(ns["new_log_probs"].grad.detach().clone().reshape(-1))
        finally:
            torch.set_default_dtype(torch.float32)
        ins["latents_j"].append(x.to(dt)[0])
        ins["next_latents_j"].append(nxt.to(dt)[0])
        ins["old_log_probs"].append(old_lp.to(dt)[0])
        ins["advantages_in"].append(torch.tensor(ADV[b], dtype=dt))
        ins["transformer_output"].append(v.to(dt)[0])
    res = {k: torch.cat(v) for k, v in res.items()}
    res["grad_transformer_output"] = torch.stack(grads)
    ins = {k: torch.stack(v) for k, v in ins.items()}
    return ins, res


def rederive_loss(ins, kl_coeff, window, j, sig):
    out = {k: [] for k in ["new_log_probs", "ratio", "policy_loss", "kl_loss", "loss", "grad_transformer_output"]}
    Gd = 3 * len(window)
    for b in range(B):
        v = ins["transformer_output"][b:b + 1]
        r = rederive_fgs(v, ins["latents_j"][b:b + 1], j, sig, ETA, prev=ins["next_latents_j"][b:b + 1],
                         latents_f32=True)
        lp = float(r["log_prob"][0])
        d = lp - float(ins["old_log_probs"][b, j])
        rho = math.exp(d)
        Aa = min(max(float(ins["advantages_in"][b]), -5), 5)
        unc, clp = -Aa * rho, -Aa * min(max(rho, 1 - 1e-4), 1 + 1e-4)
        pol = max(unc, clp) / Gd
        kl = 0.5 * d * d / Gd
        active = (1 - 1e-4 <= rho <= 1 + 1e-4) or unc > clp
        dlp = (-Aa * rho if active else 0.0) / Gd + kl_coeff * d / Gd
        s, sp, smax = float(sig[j]), float(sig[j + 1]), float(sig[1])
        dtt = sp - s
        sd = math.sqrt(s / (1 - (smax if s == 1 else s))) * ETA
        std = sd * math.sqrt(-dtt)
        n = S_TOK * CH
        dmu_dv = (1 + sd ** 2 * (1 - s) / (2 * s)) * dtt
        prev = ins["next_latents_j"][b].double().numpy()
        out["grad_transformer_output"].append(dlp * (prev - r["prev_sample_mean"][0]) / (std ** 2 * n) * dmu_dv)
        for k, val in [("new_log_probs", lp), ("ratio", rho), ("policy_loss", pol), ("kl_loss", kl),
                       ("loss", pol + kl_coeff * kl)]:
            out[k].append(val)
    return {k: np.array(v) for k, v in out.items()}


LOSS_CASES = [("loss.kl0_window4_f64", True, 0.0, [12, 13, 14, 15], 12),
              ("loss.kl0.01_window4_f64", True, 0.01, [12, 13, 14, 15], 14),
              ("loss.kl0_window2_edge_f64", True, 0.0, [21, 22], 22),
              ("loss.kl0.01_window4_production_f32", False, 0.01, [12, 13, 14, 15], 14)]
for ci, (name, f64, klc, window, j) in enumerate(LOSS_CASES):
    ins, res = run_loss_case(f64, klc, window, j, 11000 + 97 * ci)
    pre = name + "."
    for k, t in {**ins, **res}.items():
        tensors["loss"][pre + k] = t
    ref = rederive_loss(ins, klc, window, j, (SIG64 if f64 else SIG32).double().numpy())
    rdd = {k: C.dev(res[k], ref[k])["max_abs"] for k in ref}
    case = {"name": name, "file": "loss.safetensors", "dtype": "f64" if f64 else "f32",
            "function": f"{SCRIPT} train_one_step(): `new_log_probs = grpo_one_step(...)` (L{LINES['grpo_one_step_call'][0]}"
                        f"-{LINES['grpo_one_step_call'][1]}; grpo_one_step L{gos_lines[0]}-{gos_lines[1]} -> "
                        f"flow_grpo_step) and the loss statements L{LINES['loss_statements'][0]}-"
                        f"{LINES['loss_statements'][1]} incl. loss.backward(), exec'd from the text, once per sample",
            "params": {"kl_coeff": klc, "timesteps_train": window, "j": j, "clip_range": 1e-4, "adv_clip_max": 5.0,
                       "gradient_accumulation_steps": 3, "divisor": 3 * len(window), "eta": ETA,
                       "flow_grpo_sampling": True, "dpm_algorithm_type": "null", "per_sample_perturbation": PERT,
                       "sigma": float((SIG64 if f64 else SIG32)[j]), "schedule": "flux_s25_shift3"},
            "inputs": {k: pre + k for k in ins}, "outputs": {k: pre + k for k in res if not k.startswith("grad")},
            "gradients": {k: pre + k for k in res if k.startswith("grad")},
            "ratio_minus_1": (res["ratio"].double() - 1).tolist(), "rederivation_per_tensor": rdd,
            "note": "B = 6 independent per-sample calls (the script trains batches of 1); tensors are stacked over "
                    "the 6 calls. latents_j/next_latents_j/old_log_probs[:, j] come from a float32 rollout call of "
                    "the same flow_grpo_step with a CPU generator"}
    if f64:
        case["tolerance"] = {"default": dict(C.F64_TOL)}
        rd_max["f64_cases"] = max(rd_max["f64_cases"], max(rdd.values()))
    else:
        _, r64 = run_loss_case(True, klc, window, j, 11000 + 97 * ci)
        devs = {k: C.dev(res[k], r64[k]) for k in res}
        case["f32_vs_f64"] = devs
        f32_dev["loss"] = C.max_dev(devs)
        rd_max["f32_cases"] = max(rd_max["f32_cases"], max(rdd.values()))
        per = {k: {"rtol": 1e-6, "atol": float(max(1e-12, 4 * devs[k]["max_abs"]))} for k in res
               if 4 * devs[k]["max_abs"] < 1e-6}
        case["tolerance"] = {"default": C.f32_tol(devs), "per_tensor": per}
    cases.append(case)


# ---------------------------------------------------------------- e. advantages
def run_adv(rewards, use_group, mix, ngen, trimmed, weights=None, gathered=None):
    args = types.SimpleNamespace(use_group=use_group, multi_reward_mix=mix, num_generations=ngen,
                                 trimmed_ratio=trimmed)
    ns = {"torch": torch, "args": args, "samples": {"rewards": rewards}, "reward_weights": weights,
          "gathered_reward": gathered if gathered is not None else rewards}
    exec(code_of(N_ADV), ns)
    return ns["samples"]["advantages"]


def rederive_adv(r, ngen, trimmed):
    r = r.double().numpy()
    out = np.zeros_like(r)
    for i in range(len(r) // ngen):
        g_ = r[i * ngen:(i + 1) * ngen]
        if trimmed > 0:
            srt = np.sort(g_)
            ts = min(int(len(srt) * trimmed), len(srt) - 1)
            srt = srt[ts:]
            m, s = srt.mean(), srt.std(ddof=1) + 1e-8
        else:
            m, s = g_.mean(), g_.std(ddof=1) + 1e-8
        out[i * ngen:(i + 1) * ngen] = (g_ - m) / s
    return out


gA = torch.Generator().manual_seed(12345)
R = {m: (0.3 + 0.1 * torch.randn(24, generator=gA)).double() for m in ["hpsv2", "clip_score", "pick_score"]}
W = {"hpsv2": 1.0, "clip_score": 1.0, "pick_score": 0.5}
ADV_CASES = [
    ("adv.advantage_aggr_3models_f64", dict(use_group=True, mix="advantage_aggr", ngen=12, trimmed=0.0,
                                            weights=W), R),
    ("adv.advantage_aggr_3models_trim0.25_f64", dict(use_group=True, mix="advantage_aggr", ngen=12, trimmed=0.25,
                                                     weights=W), R),
    ("adv.reward_aggr_f64", dict(use_group=True, mix="reward_aggr", ngen=12, trimmed=0.0), R["hpsv2"]),
    ("adv.reward_aggr_trim0.25_f64", dict(use_group=True, mix="reward_aggr", ngen=12, trimmed=0.25), R["hpsv2"]),
    ("adv.advantage_aggr_3models_f32", dict(use_group=True, mix="advantage_aggr", ngen=12, trimmed=0.0, weights=W),
     {k: v.float() for k, v in R.items()}),
]
for name, kw, rw in ADV_CASES:
    rw_in = {k: v.clone() for k, v in rw.items()} if isinstance(rw, dict) else rw.clone()
    out = run_adv(rw_in, kw["use_group"], kw["mix"], kw["ngen"], kw["trimmed"], kw.get("weights"))
    pre = name + "."
    ins = {}
    if isinstance(rw, dict):
        for k, v in rw.items():
            tensors["adv"][pre + "rewards." + k] = v
            ins["rewards." + k] = pre + "rewards." + k
        ref = sum(kw["weights"][k] * rederive_adv(v, kw["ngen"], kw["trimmed"]) for k, v in rw.items())
    else:
        tensors["adv"][pre + "rewards"] = rw
        ins["rewards"] = pre + "rewards"
        ref = rederive_adv(rw, kw["ngen"], kw["trimmed"])
    tensors["adv"][pre + "advantages"] = out
    rd = C.dev(out, ref)["max_abs"]
    case = {"name": name, "file": "advantages.safetensors", "dtype": "f64" if "f64" in name else "f32",
            "function": f"{SCRIPT} train_one_step(): the `if args.use_group:` advantage statement (L{N_ADV.lineno}-"
                        f"{N_ADV.end_lineno}), exec'd from the text",
            "params": {"use_group": kw["use_group"], "multi_reward_mix": kw["mix"], "num_generations": kw["ngen"],
                       "trimmed_ratio": kw["trimmed"], "reward_weights": kw.get("weights")},
            "inputs": ins, "outputs": {"advantages": pre + "advantages"}, "rederivation_max_abs_diff": rd}
    if "f64" in name:
        case["tolerance"] = {"default": dict(C.F64_TOL)}
        rd_max["f64_cases"] = max(rd_max["f64_cases"], rd)
    else:
        o64 = run_adv({k: v.double() for k, v in rw.items()}, kw["use_group"], kw["mix"], kw["ngen"],
                      kw["trimmed"], kw.get("weights"))
        d = C.dev(out, o64)
        case["f32_vs_f64"] = {"advantages": d}
        f32_dev["adv"] = d["max_abs"]
        case["tolerance"] = {"default": C.f32_tol({"a": d})}
        rd_max["f32_cases"] = max(rd_max["f32_cases"], rd)
    cases.append(case)

# ---------------------------------------------------------------- write
counts = {}
for key, fn, desc in [("states", "states.safetensors", "MixGRPO sliding-window tables"),
                      ("step", "step.safetensors", "MixGRPO flow_grpo_step / dance_grpo_step"),
                      ("rollout", "rollout.safetensors", "MixGRPO window mask + rollout"),
                      ("loss", "loss.safetensors", "MixGRPO loss"),
                      ("adv", "advantages.safetensors", "MixGRPO advantages")]:
    counts[fn] = C.write_safetensors(os.path.join(OUT, fn), tensors[key], {"content": desc})
doc = {
    "description": "Reference vectors computed by MixGRPO's own code (see README.md).",
    "generator": "generate.py (imports ../_common.py)",
    "upstream": UP.provenance(),
    "upstream_lines": LINES,
    **C.env_info(),
    "schedules": {"flux_s25_shift3_f32": SIG32.tolist(), "flux_s25_shift3_f64": SIG64.tolist(),
                  "timestep_value_f32": [int(s * 1000) for s in SIG32][:25]},
    "extracted_from_train_script": {
        "grpo_states_construction": C.stmt_source(SRC, N_STATES_NEW), "grpo_states_step":
            C.stmt_source(SRC, N_STATES_STEP), "determistic_mask": C.stmt_source(SRC, N_MASK),
        "grpo_one_step": gos_src, "grpo_one_step_call": lsrc[i_gos], "loop_clip_statements": "".join(lsrc[i] for i in PRE_STMTS),
        "loss_statements": LOSS_TEXT,
        "advantage_statement": C.stmt_source(SRC, N_ADV)},
    "tolerance_default": {"f64": dict(C.F64_TOL), "f32": {"rtol": 1e-6, "atol": 1e-6}},
    "tolerance_rule": "pass if |actual - expected| <= atol + rtol * |expected| elementwise",
    "rederivation_max_abs_diff": rd_max,
    "f32_vs_f64_max_abs": f32_dev,
    "tensor_counts": counts,
    "cases": cases,
}
C.write_json(os.path.join(OUT, "cases.json"), doc)
print("cases", len(cases), counts, "rederive", rd_max, "f32dev", f32_dev)
