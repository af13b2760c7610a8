"""cuda_toolkit: a repository whose :cuda carries the CUDA runtime's and
NCCL's headers and link flags from a CUDA toolkit folder, for --config=cuda
only (the default build never fetches it). The folder is $DRAY_CUDA_PATH
(`--repo_env=DRAY_CUDA_PATH=...`), /usr/local/cuda when unset; Debian's
packaged toolkit is /usr/lib/cuda, whose headers and libraries sit in the
system's own folders, which the compiler and linker search anyway."""

def _cuda_toolkit_impl(ctx):
    path = ctx.os.environ.get("DRAY_CUDA_PATH", "/usr/local/cuda")
    toolkit = ctx.path(path)
    if not toolkit.exists:
        fail("no CUDA toolkit at %s: install one there or set DRAY_CUDA_PATH " % path +
             "(bazel build --config=cuda --repo_env=DRAY_CUDA_PATH=/path/to/cuda)")
    if toolkit.get_child("include").exists:
        ctx.symlink(toolkit.get_child("include"), "include")
    else:
        ctx.file("include/.none", "")
    libraries = [path + "/lib64", path + "/lib"]
    ctx.file("BUILD.bazel", """cc_library(
    name = "cuda",
    hdrs = glob(["include/**"]),
    includes = ["include"],
    linkopts = {search} + ["-lnccl", "-lcudart"],
    visibility = ["//visibility:public"],
)
""".format(search = repr(["-L" + d for d in libraries] + ["-Wl,-rpath," + d for d in libraries])))

cuda_toolkit = repository_rule(
    implementation = _cuda_toolkit_impl,
    environ = ["DRAY_CUDA_PATH"],
    local = True,
)
