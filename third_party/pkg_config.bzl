"""pkg_config_library: a repository whose :lib carries a system package's link
flags as pkg-config reports them, so that dray links whatever set of
libraries the installed version splits itself into (Abseil's changes from
one Debian release to the next)."""

def _pkg_config_library_impl(ctx):
    result = ctx.execute(["pkg-config", "--libs"] + ctx.attr.modules)
    if result.return_code != 0:
        fail("pkg-config --libs %s failed (deploy/install-deps.sh installs the packages): %s" %
             (" ".join(ctx.attr.modules), result.stderr))
    ctx.file("BUILD.bazel", """cc_library(
    name = "lib",
    linkopts = {flags},
    visibility = ["//visibility:public"],
)
""".format(flags = repr([flag for flag in result.stdout.strip().split(" ") if flag])))

pkg_config_library = repository_rule(
    implementation = _pkg_config_library_impl,
    attrs = {"modules": attr.string_list(mandatory = True, doc = "pkg-config module names")},
    local = True,
)
