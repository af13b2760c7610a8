"""Shared helpers for the s25 reference-vector generators (one generate.py per set imports this).

- write_safetensors: hand-written safetensors (8-byte LE header length, compact JSON header with tensors in sorted
  name order then __metadata__, header space-padded to a multiple of 8, raw little-endian data; F32/F64/I64).
- Upstream: reads a file at a commit from a bare mirror with `git show`, records sha256/bytes, and slices statements
  out of its text with `ast` (by line numbers taken from the file itself, checked by a text anchor).
- dev(): max_abs / max_rel deviation between two tensors.
"""
import ast
import hashlib
import json
import os
import struct
import subprocess
import sys

import numpy as np
import torch

MIRROR = "/work/.mirror"


def to_numpy(x):
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype == torch.bool:
            x = x.to(torch.int64)
        return x.contiguous().numpy()
    if isinstance(x, (bool, int)) and not isinstance(x, float):
        return np.asarray(x, dtype=np.int64)
    return np.asarray(x)


_DT = {np.dtype("float32"): "F32", np.dtype("float64"): "F64", np.dtype("int64"): "I64"}


def write_safetensors(path, tensors, metadata):
    names = sorted(tensors)
    header = {}
    blobs = []
    off = 0
    for n in names:
        a = to_numpy(tensors[n])
        if a.dtype == np.bool_:
            a = a.astype(np.int64)
        if a.dtype not in _DT:
            raise TypeError(f"{n}: unsupported dtype {a.dtype}")
        b = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[n] = {"dtype": _DT[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return len(names)


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    out = {}
    base = 8 + n
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        dt = {"F32": "<f4", "F64": "<f8", "I64": "<i8"}[v["dtype"]]
        s, e = v["data_offsets"]
        out[k] = np.frombuffer(raw[base + s:base + e], dtype=dt).reshape(v["shape"])
    return out


class Upstream:
    """Files read byte-for-byte from a bare git mirror at a fixed commit."""

    def __init__(self, mirror, repo_url, commit):
        self.gitdir = os.path.join(MIRROR, mirror, "repo")
        self.repo_url = repo_url
        self.commit = commit
        self.files = {}

    def text(self, path):
        raw = subprocess.check_output(["git", "--git-dir", self.gitdir, "show", f"{self.commit}:{path}"])
        self.files[path] = {"commit": self.commit, "sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}
        return raw.decode()

    def provenance(self):
        return {"repository": self.repo_url, "commit": self.commit, "files": self.files}


def stmt_source(src, node):
    lines = src.splitlines(keepends=True)
    import textwrap
    return textwrap.dedent("".join(lines[node.lineno - 1:node.end_lineno]))


def find_stmt_list(src, predicate):
    """Return (parent_body, index) of the first statement for which predicate(node, src) is true (walks all
    statement lists in the module)."""
    tree = ast.parse(src)
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list):
                for i, st in enumerate(body):
                    if isinstance(st, ast.stmt) and predicate(st, src):
                        return body, i
    raise LookupError("statement not found")


def function_source(src, name):
    tree = ast.parse(src)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            start = node.lineno if not node.decorator_list else node.decorator_list[0].lineno
            lines = src.splitlines(keepends=True)
            return "".join(lines[start - 1:node.end_lineno]), (start, node.end_lineno)
    raise LookupError(name)


def dev(a, b):
    a = to_numpy(a).astype(np.float64)
    b = to_numpy(b).astype(np.float64)
    d = np.abs(a - b)
    fin = np.isfinite(d)
    if not fin.any():
        return {"max_abs": 0.0, "max_rel": 0.0}
    d = d[fin]
    den = np.abs(b)[fin]
    rel = np.where(den > 0, d / np.where(den > 0, den, 1), d)
    return {"max_abs": float(d.max()), "max_rel": float(rel.max())}


def max_dev(devs):
    return max([v["max_abs"] for v in devs.values()] + [0.0])


def f32_tol(devs, floor=1e-6):
    return {"rtol": 1e-6, "atol": float(max(floor, 4.0 * max_dev(devs)))}


F64_TOL = {"rtol": 1e-12, "atol": 1e-12}


def env_info():
    return {
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "python": sys.version.split()[0],
        "num_threads": torch.get_num_threads(),
    }


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


def setup():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    np.random.seed(0)
