"""Reference vectors for DanceGRPO (XueZeyue/DanceGRPO @ 15cc71d, fastvideo/train_grpo_qwenimage_edit.py), computed by
the authors' own code, executed from the script's text (its module imports - torch.distributed.checkpoint.state_dict,
fastvideo, wandb, diffusers, cv2, einops, PIL - cannot be loaded on torch 1.13 / this machine).

Executed (function definitions compiled from the file's own lines, so tracebacks/line numbers are the file's):
  sd3_time_shift, flux_step, run_sample_step, grpo_one_step, gather_tensor, train_one_step; and from
  train_one_step's text the `timestep_value = ...` statement and the `if args.use_group:` advantage statement.
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

UP = C.Upstream("XueZeyue+DanceGRPO", "https://github.com/XueZeyue/DanceGRPO",
                "15cc71d53cc2e6e18a68ee607d5fb6ba9a99e344")
SCRIPT = "fastvideo/train_grpo_qwenimage_edit.py"
SRC = UP.text(SCRIPT)
LAUNCH = "scripts/finetune/finetune_qwenimage_edit_grpo.sh"
UP.text(LAUNCH)

FUNCS = ["sd3_time_shift", "flux_step", "run_sample_step", "grpo_one_step", "gather_tensor", "train_one_step"]
FUNC_LINES = {}
FUNC_SRC = {}
for f in FUNCS:
    s, (a, b) = C.function_source(SRC, f)
    FUNC_SRC[f] = s
    FUNC_LINES[f] = [a, b]


def compile_at_lines(text, start_line):
    return compile("\n" * (start_line - 1) + text, SCRIPT, "exec")


# statements inside train_one_step
tos_node = next(n for n in ast.walk(ast.parse(SRC)) if isinstance(n, ast.FunctionDef) and n.name == "train_one_step")
TV_NODE = next(s for s in tos_node.body if C.stmt_source(SRC, s).startswith("timestep_value = "))
ADV_NODE = next(s for s in tos_node.body if isinstance(s, ast.If) and "group_std" in C.stmt_source(SRC, s))
TV_TEXT = C.stmt_source(SRC, TV_NODE)
ADV_TEXT = C.stmt_source(SRC, ADV_NODE)
# the loss-block line numbers inside the timestep loop (for the tracer)
LOSS_LINE = None
for n in ast.walk(tos_node):
    if isinstance(n, ast.Expr) and C.stmt_source(SRC, n).strip() == "loss.backward()":
        LOSS_LINE = n.lineno
assert LOSS_LINE is not None
LINES = {**FUNC_LINES, "timestep_value_statement": [TV_NODE.lineno, TV_NODE.end_lineno],
         "advantage_statement": [ADV_NODE.lineno, ADV_NODE.end_lineno], "loss_backward_line": LOSS_LINE}


# ---------------------------------------------------------------- shims
class TorchShim(types.ModuleType):
    """`torch` for the exec'd functions: torch's, except randn_like returns a recorded float32 draw from a CPU
    generator (cast to the tensor's dtype), and autocast is a no-op context (CPU)."""

    def __init__(self):
        super().__init__("torch")
        self.gen = torch.Generator().manual_seed(0)
        self.draws = []

    def __getattr__(self, k):
        return getattr(torch, k)

    def randn_like(self, x, **kw):
        e = torch.randn(x.shape, generator=self.gen, dtype=torch.float32).to(x.dtype)
        self.draws.append(e.clone())
        return e

    class autocast:  # torch.autocast("cuda", bf16) on a CPU-only machine: disabled
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False


class DistStub:
    def is_initialized(self):
        return False

    def get_rank(self):
        return 1  # not 0 and not a multiple of 8: skips reward.txt writes and prints

    def all_reduce(self, t, op=None):
        return None

    def barrier(self):
        return None

    class ReduceOp:
        AVG = "avg"


TSHIM = TorchShim()
NS = {"torch": TSHIM, "math": math, "np": np, "dist": DistStub(), "tqdm": lambda x, **k: x}
for f in FUNCS:
    exec(compile_at_lines(FUNC_SRC[f], FUNC_LINES[f][0]), NS)


class LocalsTracer:
    """Snapshots the locals of `func` at its return and/or before given lines (sys.settrace)."""

    def __init__(self, func, lines=(), on_return=True):
        self.func, self.lines, self.on_return = func, set(lines), on_return
        self.snaps = []

    @staticmethod
    def _clone(d):
        out = {}
        for k, v in d.items():
            if isinstance(v, torch.Tensor):
                out[k] = v.detach().clone()
            elif isinstance(v, (int, float, bool)):
                out[k] = v
            elif isinstance(v, dict) and k == "samples":
                out[k] = {kk: vv.detach().clone() for kk, vv in v.items() if isinstance(vv, torch.Tensor)}
        return out

    def _global(self, frame, event, arg):
        if frame.f_code.co_filename == SCRIPT and frame.f_code.co_name == self.func:
            return self._local
        return None

    def _local(self, frame, event, arg):
        if event == "line" and frame.f_lineno in self.lines:
            self.snaps.append(("line", frame.f_lineno, self._clone(frame.f_locals)))
        elif event == "return" and self.on_return:
            self.snaps.append(("return", frame.f_lineno, self._clone(frame.f_locals)))
        return self._local

    def __enter__(self):
        sys.settrace(self._global)
        return self

    def __exit__(self, *a):
        sys.settrace(None)
        return False


def schedule(dtype, S=20, shift=3.0):
    torch.set_default_dtype(dtype)
    try:
        return NS["sd3_time_shift"](shift, torch.linspace(1, 0, S + 1))
    finally:
        torch.set_default_dtype(torch.float32)


SIG32 = schedule(torch.float32)
SIG64 = schedule(torch.float64)
ETA = 0.3
tensors = {"flux": {}, "adv": {}, "train": {}}
cases = []
rd_max = {"f64_cases": 0.0, "f32_cases": 0.0}
f32_dev = {}

# ---------------------------------------------------------------- a. schedule + timestep ints
for dt, sig in [("f32", SIG32), ("f64", SIG64)]:
    name = f"schedule.s20_shift3_{dt}"
    ns = {"args": types.SimpleNamespace(sampling_steps=20), "sigma_schedule": sig}
    exec(compile_at_lines(TV_TEXT, TV_NODE.lineno), ns)
    tv = torch.tensor(ns["timestep_value"], dtype=torch.int64)
    lin = np.linspace(1, 0, 21)
    ref = 3 * lin / (1 + 2 * lin)
    rd = C.dev(sig, ref)["max_abs"]
    tensors["flux"][name + ".sigma_schedule"] = sig
    tensors["flux"][name + ".timestep_value"] = tv
    case = {"name": name, "function": f"{SCRIPT}::sd3_time_shift(shift, torch.linspace(1, 0, sampling_steps + 1)) "
                                      f"(as sample_reference_model) + the `timestep_value = [int(sigma * 1000) ...]` "
                                      f"statement of train_one_step",
            "file": "flux_step.safetensors", "dtype": dt, "params": {"shift": 3.0, "sampling_steps": 20},
            "inputs": {}, "outputs": {"sigma_schedule": name + ".sigma_schedule",
                                      "timestep_value": name + ".timestep_value"},
            "rederivation_max_abs_diff": rd}
    if dt == "f32":
        d = C.dev(sig, SIG64)
        case["f32_vs_f64"] = {"sigma_schedule": d}
        case["tolerance"] = {"default": C.f32_tol({"s": d}), "per_tensor": {"timestep_value": {"rtol": 0, "atol": 0}}}
        rd_max["f32_cases"] = max(rd_max["f32_cases"], rd)
        f32_dev["schedule"] = d["max_abs"]
    else:
        case["tolerance"] = {"default": dict(C.F64_TOL), "per_tensor": {"timestep_value": {"rtol": 0, "atol": 0}}}
        rd_max["f64_cases"] = max(rd_max["f64_cases"], rd)
    case["note"] = ("timestep_value are int(sigma*1000) (truncation) of the schedule in the case's dtype; the f32 and "
                    "f64 lists differ where sigma*1000 is within rounding of an integer" if dt == "f64" else
                    "production: torch default float32")
    cases.append(case)
TV32 = [int(s * 1000) for s in SIG32][:20]
TV64 = [int(s * 1000) for s in SIG64][:20]


# ---------------------------------------------------------------- b. flux_step
def rederive_flux(v, x, eta, sig, idx, prev=None, noise=None, grad_w=None):
    """float64 formulas; log_prob in float64 (upstream computes it in float32, see README)."""
    v = v.double().numpy()
    x = x.double().numpy()
    s = float(sig[idx])
    sp = float(sig[idx + 1])
    ds = sp - s
    x0 = x - s * v
    std = eta * math.sqrt(s - sp)
    score = -(x - x0 * (1 - s)) / s ** 2
    mu = x + ds * v + (-0.5 * eta ** 2 * score) * ds
    if prev is None:
        prev = mu + noise.double().numpy() * std
    else:
        prev = prev.double().numpy()
    lp = (-(prev - mu) ** 2 / (2 * std ** 2) - math.log(std) - math.log(math.sqrt(2 * math.pi)))
    lp = lp.reshape(lp.shape[0], -1).mean(1)
    res = {"prev_sample": prev, "pred_original_sample": x0, "log_prob": lp, "prev_sample_mean": mu}
    n = int(np.prod(x.shape[1:]))
    dlp_dv = (prev - mu) / (std ** 2 * n) * ds * (1 + 0.5 * eta ** 2 * (1 - s) / s)  # d log_prob_b / d v
    if grad_w is not None:
        res["grad_model_output"] = grad_w.double().numpy().reshape((-1,) + (1,) * (x.ndim - 1)) * dlp_dv
    res["_dlp_dv"] = dlp_dv
    return res


def run_flux(v, x, idx, prev, f64, seed, bf16=False, grad_w=None):
    dt = torch.float64 if f64 else torch.float32
    torch.set_default_dtype(dt)
    try:
        sig = SIG64 if f64 else SIG32
        TSHIM.gen = torch.Generator().manual_seed(seed)
        TSHIM.draws = []
        mo = v.to(torch.bfloat16) if bf16 else v.to(dt)
        mo = mo.clone().requires_grad_(grad_w is not None)
        lat = x.to(torch.float32) if not f64 else x.to(dt)
        with LocalsTracer("flux_step") as tr:
            out = NS["flux_step"](mo, lat, ETA, sig, idx, None if prev is None else prev.to(torch.float32),
                                  grpo=True, sde_solver=True)
        loc = tr.snaps[-1][2]
        res = {"prev_sample": out[0].detach().clone(), "pred_original_sample": out[1].detach().clone(),
               "log_prob": out[2].detach().clone(), "prev_sample_mean": loc["prev_sample_mean"]}
        info = {"std_dev_t": loc["std_dev_t"], "sigma": float(loc["sigma"]), "dsigma": float(loc["dsigma"])}
        if grad_w is not None:
            (out[2] * grad_w.to(out[2].dtype)).sum().backward()
            res["grad_model_output"] = mo.grad.detach().clone()
        noise = TSHIM.draws[-1] if TSHIM.draws else None
        return res, info, noise
    finally:
        torch.set_default_dtype(torch.float32)


FSHAPE = (3, 16, 16)
fl_i = 0
for idx in [0, 9, 18, 19]:
    for path in ["rollout", "recompute"]:
        if idx == 19 and path == "recompute":
            continue
        g = torch.Generator().manual_seed(200 + idx * 7 + (path == "recompute"))
        s = SIG32[idx].item()
        x = torch.randn(FSHAPE, generator=g) * (1 - s + s)  # float32 values
        x = (1 - s) * 0.8 * torch.randn(FSHAPE, generator=g) + s * torch.randn(FSHAPE, generator=g)
        vb = torch.randn(FSHAPE, generator=g) - 0.5 * x
        prev = None
        old_lp = None
        gw = None
        if path == "recompute":
            rb, _, nb = run_flux(vb, x, idx, None, False, 900 + idx)
            prev = rb["prev_sample"].float()
            old_lp = rb["log_prob"]
            v = vb + torch.tensor([0.0, 1e-3, 1e-2]).view(-1, 1, 1) * torch.randn(FSHAPE, generator=g)
            gw = torch.randn(FSHAPE[0], generator=g)
        else:
            v = vb
        for dt in ["f64", "f32"]:
            f64 = dt == "f64"
            seed = 300 + idx
            res, info, noise = run_flux(v, x, idx, prev, f64, seed, grad_w=gw)
            name = f"flux.s{idx}_{path}_{dt}"
            pre = name + "."
            st = torch.float64 if f64 else torch.float32
            ins = {"model_output": v.to(st), "latents": x.to(st)}
            if prev is not None:
                ins["prev_sample"] = prev.to(st)
                ins["grad_log_prob"] = gw
                tensors["flux"][pre + "old_log_prob"] = old_lp
            if noise is not None:
                ins["variance_noise"] = noise.to(st)
            for k, t in ins.items():
                tensors["flux"][pre + k] = t
            for k, t in res.items():
                tensors["flux"][pre + k] = t
            case = {"name": name, "function": f"{SCRIPT}::flux_step(model_output, latents, eta, sigmas, index, "
                                              f"prev_sample, grpo=True, sde_solver=True)",
                    "file": "flux_step.safetensors", "dtype": dt, "path": path,
                    "params": {"eta": ETA, "index": idx, "sigma": info["sigma"], "sigma_next": SIG64[idx + 1].item()
                               if f64 else SIG32[idx + 1].item(), "std_dev_t": info["std_dev_t"],
                               "schedule": f"schedule.s20_shift3_{dt}", "noise_seed": seed},
                    "inputs": {k: pre + k for k in ins}, "outputs": {k: pre + k for k in res if k != "grad_model_output"},
                    "gradients": {"grad_model_output": pre + "grad_model_output"} if gw is not None else {}}
            if prev is not None:
                case["outputs"]["old_log_prob"] = pre + "old_log_prob"
                case["call"] = ("flux_step(...prev_sample=prev_sample...); grad_model_output = d(sum_b grad_log_prob[b]"
                                " * log_prob[b]) / d model_output; old_log_prob = the f32 rollout's log_prob that "
                                "produced prev_sample (behaviour model output not stored; not needed)")
            ref = rederive_flux(v.to(st), x.to(st), ETA, (SIG64 if f64 else SIG32).double().numpy(), idx,
                                prev=prev, noise=noise, grad_w=gw)
            rdd = {k: C.dev(res[k], ref[k])["max_abs"] for k in ref if not k.startswith("_")}
            case["rederivation_per_tensor"] = rdd
            if f64:
                lim = ("log_prob", "grad_model_output")
                rd_max["f64_cases"] = max(rd_max["f64_cases"], max(v_ for k, v_ in rdd.items() if k not in lim))
                kk = "f64_flux_log_prob_and_grad_(float32_by_upstream_cast)"
                rd_max[kk] = max(rd_max.get(kk, 0.0), max(v_ for k, v_ in rdd.items() if k in lim))
                per = {"log_prob": {"rtol": 1e-6, "atol": 1e-6}}
                if gw is not None:
                    per["grad_model_output"] = {"rtol": 1e-6, "atol": 1e-12}
                    per["old_log_prob"] = {"rtol": 1e-6, "atol": 1e-6}  # float32 behaviour rollout value
                case["tolerance"] = {"default": dict(C.F64_TOL), "per_tensor": per}
                case["note"] = ("inputs float32-representable, stored F64; sigmas F64 (torch default dtype F64). "
                                "flux_step computes prev_sample_mean/pred_original_sample in F64 but casts to float32 "
                                "for the log-prob (`.to(torch.float32)`), so log_prob is F32 (per-tensor 1e-6) and "
                                "the gradient flows back through that cast (rtol 1e-6)")
                res64 = res
            else:
                rd_max["f32_cases"] = max(rd_max["f32_cases"], max(rdd.values()))
                devs = {k: C.dev(res[k], res64[k]) for k in res}
                case["f32_vs_f64"] = devs
                f32_dev["flux"] = max(f32_dev.get("flux", 0.0), C.max_dev(devs))
                per = {}
                if gw is not None:
                    per["grad_model_output"] = {"rtol": 1e-6,
                                                "atol": float(max(1e-12, 4 * devs["grad_model_output"]["max_abs"]))}
                case["tolerance"] = {"default": C.f32_tol({k: v_ for k, v_ in devs.items()
                                                           if k != "grad_model_output"}), "per_tensor": per}
            cases.append(case)

# bf16 model output (production: the transformer runs under bf16 autocast)
for path in ["rollout", "recompute"]:
    idx = 9
    g = torch.Generator().manual_seed(777 + (path == "recompute"))
    x = 0.6 * torch.randn(FSHAPE, generator=g)
    vb = torch.randn(FSHAPE, generator=g).to(torch.bfloat16).float()
    prev = None
    if path == "recompute":
        rb, _, _ = run_flux(vb, x, idx, None, False, 778, bf16=True)
        prev = rb["prev_sample"].float()
    res, info, noise = run_flux(vb, x, idx, prev, False, 779, bf16=True)
    res_f, _, _ = run_flux(vb, x, idx, prev, False, 779, bf16=False)
    name = f"flux.s9_{path}_bf16_model_output"
    pre = name + "."
    ins = {"model_output_bf16_values": vb, "latents": x}
    if prev is not None:
        ins["prev_sample"] = prev
    if noise is not None:
        ins["variance_noise"] = noise
    for k, t in ins.items():
        tensors["flux"][pre + k] = t
    for k, t in res.items():
        tensors["flux"][pre + k] = t.float()
    dvs = {k: C.dev(res[k], res_f[k]) for k in res}
    cases.append({"name": name, "function": f"{SCRIPT}::flux_step with a bfloat16 model_output (as under "
                                            f"torch.autocast('cuda', torch.bfloat16)) and float32 latents",
                  "file": "flux_step.safetensors", "dtype": "bf16+f32", "path": path,
                  "params": {"eta": ETA, "index": idx, "noise_seed": 779, "std_dev_t": info["std_dev_t"]},
                  "inputs": {k: pre + k for k in ins}, "outputs": {k: pre + k for k in res},
                  "output_dtypes": {k: str(t.dtype).replace("torch.", "") for k, t in res.items()},
                  "difference_vs_float32_model_output": dvs,
                  "tolerance": {"default": {"rtol": 1e-6, "atol": 1e-6}},
                  "note": "model_output_bf16_values are bfloat16 values stored as F32; the port must cast them to "
                          "bfloat16 before the call. `dsigma * model_output` and `sigma * model_output` are then "
                          "bfloat16 products (a 0-dim float32 tensor times a bfloat16 tensor stays bfloat16), so "
                          "pred_original_sample and prev_sample_mean are float32 sums of float32 latents and "
                          "bf16-rounded velocity terms; difference_vs_float32_model_output (same values as float32 "
                          "model_output) shows the effect"})

# ---------------------------------------------------------------- c. advantages
ADV_CODE = compile_at_lines(ADV_TEXT, ADV_NODE.lineno)


def run_adv(rewards, use_group, ngen, gathered=None):
    ns = {"torch": torch, "args": types.SimpleNamespace(use_group=use_group, num_generations=ngen),
          "samples": {"rewards": rewards.clone()}, "gathered_reward": rewards if gathered is None else gathered}
    exec(ADV_CODE, ns)
    return ns["samples"]["advantages"]


def rederive_adv(rewards, use_group, ngen, gathered=None):
    r = rewards.double().numpy()
    if use_group:
        out = np.zeros_like(r)
        for i in range(len(r) // ngen):
            g_ = r[i * ngen:(i + 1) * ngen]
            out[i * ngen:(i + 1) * ngen] = (g_ - g_.mean()) / (g_.std(ddof=1) + 1e-8)
        return out
    gg = (rewards if gathered is None else gathered).double().numpy()
    return (r - gg.mean()) / (gg.std(ddof=1) + 1e-8)


gA = torch.Generator().manual_seed(4242)
R16 = (0.25 + 0.05 * torch.randn(16, generator=gA))
ADV_CASES = [
    ("adv.group_2x8_f64", R16.double(), True, 8, None, {}),
    ("adv.group_2x8_f32", R16.float(), True, 8, None, {}),
    ("adv.group_tied_exact_f32", torch.cat([torch.full((8,), 1.1), R16[8:]]).float(), True, 8, None,
     {"note": "group 0 has 8 equal rewards 1.1 whose float32 mean is exact: advantages 0"}),
    ("adv.group_tied_inexact_f32", torch.cat([torch.full((8,), 0.7), R16[8:]]).float(), True, 8, None,
     {"informational": True,
      "note": "group 0 has 8 equal rewards 0.7; torch's float32 CPU mean of them is 1 ulp off (r - mean = 5.96e-8, "
              "unbiased std 6.4e-8), and with the +1e-8 denominator the advantages become 0.81, not 0. The value "
              "depends on the reduction's rounding (CPU vs CUDA kernels): not a parity target, a warning"}),
    ("adv.group_2x3_f64", R16[:6].double(), True, 3, None, {}),
    ("adv.global_f64", R16[:8].double(), False, 8, R16.double(), {"note": "use_group False: rewards of this rank "
                                                                          "(8) against the gathered rewards (16)"}),
    ("adv.global_f32", R16[:8].float(), False, 8, R16.float(), {}),
]
for name, r, ug, ngen, gathered, extra in ADV_CASES:
    out = run_adv(r, ug, ngen, gathered)
    ref = rederive_adv(r, ug, ngen, gathered)
    pre = name + "."
    tensors["adv"][pre + "rewards"] = r
    ins = {"rewards": pre + "rewards"}
    if gathered is not None:
        tensors["adv"][pre + "gathered_reward"] = gathered
        ins["gathered_reward"] = pre + "gathered_reward"
    tensors["adv"][pre + "advantages"] = out
    rd = C.dev(out, ref)["max_abs"]
    case = {"name": name, "function": f"{SCRIPT} train_one_step(): the `if args.use_group:` advantage statement "
                                      f"(exec'd from the script text, L{ADV_NODE.lineno}-{ADV_NODE.end_lineno})",
            "file": "advantages.safetensors", "dtype": "f64" if r.dtype == torch.float64 else "f32",
            "params": {"use_group": ug, "num_generations": ngen}, "inputs": ins,
            "outputs": {"advantages": pre + "advantages"}, "rederivation_max_abs_diff": rd, **extra}
    if r.dtype == torch.float64:
        case["tolerance"] = {"default": dict(C.F64_TOL)}
        rd_max["f64_cases"] = max(rd_max["f64_cases"], rd)
    else:
        o64 = run_adv(r.double(), ug, ngen, None if gathered is None else gathered.double())
        d = C.dev(out, o64)
        case["f32_vs_f64"] = {"advantages": d}
        if not extra.get("informational"):
            f32_dev["adv"] = max(f32_dev.get("adv", 0.0), d["max_abs"])
            rd_max["f32_cases"] = max(rd_max["f32_cases"], rd)
            case["tolerance"] = {"default": C.f32_tol({"a": d})}
        else:
            case["tolerance"] = {"default": {"rtol": 0.0, "atol": 10.0}}
    cases.append(case)


# ---------------------------------------------------------------- d. train_one_step chain (rollout + training)
class ToyTransformer:
    """out = table[k] + 0.5 * hidden_states, k = schedule index of the timestep it receives (timesteps/1000).
    hidden_states = cat([z, image_latents], dim=1) [1, 2S, C]; records every call (output retains grad)."""

    def __init__(self, table, tvals):
        self.table = table
        self.tvals = tvals
        self.calls = []

    def train(self):
        pass

    def eval(self):
        pass

    def __call__(self, hidden_states, timestep, guidance, encoder_hidden_states_mask, encoder_hidden_states,
                 img_shapes, txt_seq_lens, attention_kwargs, return_dict):
        k = self.tvals.index(int(round(float(timestep.double().reshape(-1)[0]) * 1000)))
        out = self.table[k].unsqueeze(0) + 0.5 * hidden_states
        if out.requires_grad:
            out.retain_grad()
        self.calls.append({"k": k, "timestep": timestep.clone(), "hidden_states": hidden_states.detach().clone(),
                           "out": out})
        return (out,)

    def clip_grad_norm_(self, max_norm):
        return torch.nn.utils.clip_grad_norm_([self.table], max_norm)


NPROMPT, NGEN, STEPS, S_TOK, CH = 2, 3, 20, 4, 16
B = NPROMPT * NGEN
TFRAC = 0.6
GA = 3


def run_chain(f64):
    dt = torch.float64 if f64 else torch.float32
    torch.set_default_dtype(dt)
    try:
        g = torch.Generator().manual_seed(31337)
        sig = NS["sd3_time_shift"](3.0, torch.linspace(1, 0, STEPS + 1))
        tvals = [int(s * 1000) for s in sig][:STEPS]
        F32 = torch.float32  # all draws in float32 (same values in the f32 and f64 runs)
        table_b = (0.5 * torch.randn(STEPS, 2 * S_TOK, CH, generator=g, dtype=F32)).to(dt)
        pert_scale = torch.tensor([0.0, 3e-4, 3e-3, 3e-2] * 5, dtype=F32)[:STEPS].view(-1, 1, 1)
        table_p = (table_b + pert_scale.to(dt) * torch.randn(STEPS, 2 * S_TOK, CH, generator=g, dtype=F32).to(dt))
        table_p = table_p.clone().requires_grad_(True)
        z0 = torch.randn(1, S_TOK, CH, generator=g, dtype=F32).to(torch.bfloat16).to(dt)  # init_same_noise: one bf16 draw
        img_lat = (0.7 * torch.randn(NPROMPT, S_TOK, CH, generator=g, dtype=F32)).to(dt)
        rewards = (0.3 + 0.05 * torch.randn(B, generator=g, dtype=F32)).float()
        args = types.SimpleNamespace(use_group=True, num_generations=NGEN, sampling_steps=STEPS, eta=ETA, h=32, w=32,
                                     timestep_fraction=TFRAC, clip_range=1e-4, adv_clip_max=5.0,
                                     gradient_accumulation_steps=GA, shift=3.0)
        # rollout, one sample at a time, as sample_reference_model does (run_sample_step exec'd from the text)
        TSHIM.gen = torch.Generator().manual_seed(4040)
        TSHIM.draws = []
        beh = ToyTransformer(table_b, tvals)
        all_lat, all_lp = [], []
        img_rep = torch.repeat_interleave(img_lat, NGEN, dim=0)
        for b in range(B):
            with torch.no_grad():
                z, x0, lat_b, lp_b = NS["run_sample_step"](args, z0.clone(), range(0, STEPS), sig, beh,
                                                           torch.zeros(1, 3, 8), torch.ones(1, 3), [[(1, 2, 2)]], [3],
                                                           img_rep[b:b + 1], True)
            all_lat.append(lat_b)
            all_lp.append(lp_b)
        rollout_draws = torch.stack(TSHIM.draws).view(B, STEPS, 1, S_TOK, CH)[:, :, 0]
        all_latents = torch.cat(all_lat)
        all_log_probs = torch.cat(all_lp)

        def sample_reference_model(*a, **k):
            return (rewards, all_latents, all_log_probs, sig, torch.full((B,), 3), img_rep)

        NS["sample_reference_model"] = sample_reference_model
        pol = ToyTransformer(table_p, tvals)
        torch.manual_seed(2024)  # train_one_step's torch.randperm draws (global CPU RNG)
        opt = types.SimpleNamespace(step=lambda: None, zero_grad=lambda: None)
        with LocalsTracer("train_one_step", lines=[LOSS_LINE], on_return=True) as tr:
            total_loss, grad_norm = NS["train_one_step"](
                args, "cpu", pol, None, None, None, opt, types.SimpleNamespace(step=lambda: None),
                torch.zeros(NPROMPT, 3, 8), torch.ones(NPROMPT, 3, dtype=torch.long), ["p0", "p1"],
                torch.full((NPROMPT,), 3), torch.full((NPROMPT,), 32), torch.full((NPROMPT,), 32), img_lat, None,
                1.0, None, None)
        steps = [s for s in tr.snaps if s[0] == "line"]
        final = [s for s in tr.snaps if s[0] == "return"][-1][2]
        return dict(sig=sig, tvals=tvals, table_b=table_b, table_p=table_p, z0=z0, img_lat=img_lat, rewards=rewards,
                    all_latents=all_latents, all_log_probs=all_log_probs, rollout_draws=rollout_draws,
                    beh_calls=beh.calls, pol_calls=pol.calls, steps=steps, final=final, total_loss=total_loss,
                    grad_norm=grad_norm, table_grad=table_p.grad.detach().clone())
    finally:
        torch.set_default_dtype(torch.float32)


CH32 = run_chain(False)
CH64 = run_chain(True)
TT = int((STEPS - 1) * TFRAC)
assert len(CH32["steps"]) == B * TT
pre = "train.qwen_edit_chain."
T = tensors["train"]
fin = CH32["final"]
T[pre + "rewards"] = CH32["rewards"]
T[pre + "sigma_schedule"] = CH32["sig"]
T[pre + "behaviour_table"] = CH32["table_b"]
T[pre + "policy_table"] = CH32["table_p"].detach()
T[pre + "init_noise"] = CH32["z0"]
T[pre + "image_latents"] = CH32["img_lat"]
T[pre + "rollout.variance_noise"] = CH32["rollout_draws"]
T[pre + "rollout.all_latents"] = CH32["all_latents"]
T[pre + "rollout.all_log_probs"] = CH32["all_log_probs"]
T[pre + "perms"] = fin["perms"]
for k in ["timesteps", "log_probs", "advantages"]:
    T[pre + "samples." + k] = fin["samples"][k]
step_names = ["new_log_probs", "advantages", "ratio", "unclipped_loss", "clipped_loss", "loss"]
stk = {k: torch.stack([s[2][k] for s in CH32["steps"]]).view(B, TT, -1) for k in step_names}
stk64 = {k: torch.stack([s[2][k] for s in CH64["steps"]]).view(B, TT, -1) for k in step_names}
for k in step_names:
    T[pre + "train." + k] = stk[k]
idx_used = torch.tensor([[int(CH32["final"]["perms"][i][k]) for k in range(TT)] for i in range(B)])
T[pre + "train.sigma_index"] = idx_used
calls = CH32["pol_calls"]
assert len(calls) == B * TT
T[pre + "train.transformer_output"] = torch.stack([c["out"].detach() for c in calls]).view(B, TT, 2 * S_TOK, CH)
T[pre + "train.grad_transformer_output"] = torch.stack([c["out"].grad for c in calls]).view(B, TT, 2 * S_TOK, CH)
T[pre + "train.transformer_timestep"] = torch.stack([c["timestep"] for c in calls]).view(B, TT)
T[pre + "train.policy_table_grad_after_clip"] = CH32["table_grad"]
T[pre + "total_loss"] = torch.tensor(CH32["total_loss"], dtype=torch.float64)
T[pre + "grad_norm"] = torch.tensor(CH32["grad_norm"], dtype=torch.float64)
grads64 = torch.stack([c["out"].grad for c in CH64["pol_calls"]]).view(B, TT, 2 * S_TOK, CH)
devs = {k: C.dev(stk[k], stk64[k]) for k in step_names}
devs["grad_transformer_output"] = C.dev(T[pre + "train.grad_transformer_output"], grads64)
devs["rollout.all_latents"] = C.dev(CH32["all_latents"], CH64["all_latents"])
devs["rollout.all_log_probs"] = C.dev(CH32["all_log_probs"], CH64["all_log_probs"])
devs["total_loss"] = C.dev(torch.tensor(CH32["total_loss"]), torch.tensor(CH64["total_loss"]))


# independent re-derivation of the training losses from the stored rollout (float64, formulas)
def rederive_chain(ch):
    sig = ch["sig"].double().numpy()
    lat = ch["all_latents"].double().numpy()
    lps = ch["all_log_probs"].double().numpy()
    r = ch["rewards"].double().numpy()
    adv = np.zeros(B)
    for i in range(NPROMPT):
        gg = r[i * NGEN:(i + 1) * NGEN]
        adv[i * NGEN:(i + 1) * NGEN] = (gg - gg.mean()) / (gg.std(ddof=1) + 1e-8)
    perms = ch["final"]["perms"].numpy()
    tab = ch["table_p"].detach().double().numpy()
    img = torch.repeat_interleave(ch["img_lat"], NGEN, dim=0).double().numpy()
    out = {k: np.zeros((B, TT)) for k in ["new_log_probs", "ratio", "loss"]}
    out["grad_transformer_output"] = np.zeros((B, TT, 2 * S_TOK, CH))
    for i in range(B):
        for k in range(TT):
            p = perms[i][k]  # index into the trimmed [0..18] lists and into the sigma schedule
            x = lat[i, p]
            xn = lat[i, p + 1]
            hs = np.concatenate([x, img[i]], 0)
            v = (tab[p] + 0.5 * hs)[:S_TOK]
            res = rederive_flux(torch.from_numpy(v[None]), torch.from_numpy(x[None]), ETA, sig, p,
                                prev=torch.from_numpy(xn[None]))
            lp = res["log_prob"][0]
            rho = math.exp(lp - lps[i, p])
            A = min(max(adv[i], -5), 5)
            l_ = max(-A * rho, -A * min(max(rho, 1 - 1e-4), 1 + 1e-4)) / (GA * TT)
            eps_c = 1e-4
            active = (1 - eps_c <= rho <= 1 + eps_c) or (-A * rho > -A * min(max(rho, 1 - eps_c), 1 + eps_c))
            d_lp = (-A / (GA * TT)) * rho if active else 0.0
            out["grad_transformer_output"][i, k, :S_TOK] = d_lp * res["_dlp_dv"][0]
            out["new_log_probs"][i, k] = lp
            out["ratio"][i, k] = rho
            out["loss"][i, k] = l_
    out["advantages"] = adv
    return out


rc = rederive_chain(CH32)
rd_chain = {k: C.dev(stk[k].view(B, TT), rc[k]) for k in ["new_log_probs", "ratio", "loss"]}
rd_chain["advantages"] = C.dev(stk["advantages"][:, 0, 0], rc["advantages"])
rd_chain["grad_transformer_output"] = C.dev(T[pre + "train.grad_transformer_output"], rc["grad_transformer_output"])
rd_max["chain_vs_float64_formulas"] = max(v["max_abs"] for v in rd_chain.values())
chain_tol = C.f32_tol(devs)
ratios = stk["ratio"].view(-1)
case = {"name": "train.qwen_edit_chain", "file": "train_chain.safetensors", "dtype": "f32",
        "function": f"{SCRIPT}: run_sample_step (per sample, as sample_reference_model) then train_one_step "
                    f"(exec'd from the script text; sample_reference_model stubbed to return that rollout) with "
                    f"grpo_one_step/flux_step/gather_tensor from the text",
        "params": {"num_prompts": NPROMPT, "num_generations": NGEN, "use_group": True, "sampling_steps": STEPS,
                   "eta": ETA, "shift": 3.0, "timestep_fraction": TFRAC, "train_timesteps": TT, "clip_range": 1e-4,
                   "adv_clip_max": 5.0, "gradient_accumulation_steps": GA, "loss_divisor": GA * TT,
                   "tokens": S_TOK, "image_tokens": S_TOK, "channels": CH, "init_same_noise": True,
                   "torch_manual_seed_for_randperm": 2024, "rollout_noise_seed": 4040,
                   "timestep_value": CH32["tvals"], "ratio_range": [float(ratios.min()), float(ratios.max())],
                   "clipfrac_overall": float(((ratios - 1).abs() > 1e-4).float().mean()),
                   "rollout_transformer_calls": len(CH32["beh_calls"]), "train_transformer_calls": len(calls)},
        "inputs": {k: pre + k for k in ["rewards", "sigma_schedule", "behaviour_table", "policy_table", "init_noise",
                                        "image_latents", "rollout.variance_noise", "perms"]},
        "outputs": {**{k: pre + k for k in ["rollout.all_latents", "rollout.all_log_probs", "total_loss",
                                            "grad_norm", "samples.timesteps", "samples.log_probs",
                                            "samples.advantages"]},
                    **{"train." + k: pre + "train." + k for k in step_names + ["sigma_index", "transformer_timestep",
                                                                               "transformer_output"]}},
        "gradients": {"train.grad_transformer_output": pre + "train.grad_transformer_output",
                      "train.policy_table_grad_after_clip": pre + "train.policy_table_grad_after_clip"},
        "f32_vs_f64": devs, "rederivation_vs_float64_formulas": rd_chain,
        "tolerance": {"default": {"rtol": 1e-5, "atol": max(1e-5, chain_tol["atol"])},
                      "per_tensor": {"perms": {"rtol": 0, "atol": 0}, "train.sigma_index": {"rtol": 0, "atol": 0},
                                     **{(k if k.startswith("rollout") or k == "total_loss" else "train." + k):
                                        {"rtol": 1e-5, "atol": float(max(1e-9, 4 * v["max_abs"]))}
                                        for k, v in devs.items()}}},
        "min_distance_of_ratio_to_clip_edges": float(((ratios - 1).abs() - 1e-4).abs().min()),
        "note": "float32 chain (production dtypes except the bf16 transformer output); the toy transformer is "
                "table[k] + 0.5*hidden_states. The optimizer/lr_scheduler are no-op stubs, so every step uses the "
                "same policy table; transformer.clip_grad_norm_ = torch.nn.utils.clip_grad_norm_ on the table "
                "(max_grad_norm 1.0), which clips the accumulated table gradient in place after samples 3 and 6. "
                "Per-step tensors are [B, train_timesteps, ...] in the loop order (sample i, k-th permuted step)."}
cases.append(case)
f32_dev["chain"] = C.max_dev(devs)

# ---------------------------------------------------------------- write
counts = {}
counts["flux_step.safetensors"] = C.write_safetensors(os.path.join(OUT, "flux_step.safetensors"), tensors["flux"],
                                                      {"content": "DanceGRPO schedule + flux_step cases"})
counts["advantages.safetensors"] = C.write_safetensors(os.path.join(OUT, "advantages.safetensors"), tensors["adv"],
                                                       {"content": "DanceGRPO advantage cases"})
counts["train_chain.safetensors"] = C.write_safetensors(os.path.join(OUT, "train_chain.safetensors"),
                                                        tensors["train"], {"content": "DanceGRPO rollout+train chain"})
doc = {
    "description": "Reference vectors computed by DanceGRPO's own code (see README.md).",
    "generator": "generate.py (imports ../_common.py)",
    "upstream": UP.provenance(),
    "upstream_lines": LINES,
    **C.env_info(),
    "schedules": {"s20_shift3_f32": SIG32.tolist(), "s20_shift3_f64": SIG64.tolist(),
                  "timestep_value_f32": TV32, "timestep_value_f64": TV64},
    "extracted_from_train_script": {**FUNC_SRC, "timestep_value_statement": TV_TEXT,
                                    "advantage_statement": ADV_TEXT},
    "tolerance_default": {"f64": dict(C.F64_TOL), "f32": {"rtol": 1e-6, "atol": 1e-6}},
    "tolerance_rule": "pass if |actual - expected| <= atol + rtol * |expected| elementwise",
    "rederivation_max_abs_diff": rd_max,
    "f32_vs_f64_max_abs": f32_dev,
    "tensor_counts": counts,
    "cases": cases,
}
C.write_json(os.path.join(OUT, "cases.json"), doc)
print("cases", len(cases), counts, "rederive", rd_max, "f32dev", f32_dev)
print("chain ratios", ratios.min().item() - 1, ratios.max().item() - 1, case["params"]["clipfrac_overall"],
      "total_loss", CH32["total_loss"], "grad_norm", CH32["grad_norm"])
