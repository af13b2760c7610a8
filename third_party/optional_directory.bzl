"""optional_local_directory: a local directory that may be absent.

Like new_local_repository, but a missing directory gives an empty
repository instead of an error, so that a checkout without the directory
still builds, and tests that need its files can say so and skip.

    optional_local_directory(
        name = "shared_reference",
        path = "../shared/reference",      # relative to the workspace
        filegroups = ["qwen_image"],       # a filegroup per top-level folder
    )
"""

def _optional_local_directory_impl(ctx):
    workspace = ctx.path(Label("@//:WORKSPACE")).dirname
    target = ctx.path("%s/%s" % (workspace, ctx.attr.path))
    present = target.exists
    if present:
        for child in target.readdir():
            ctx.symlink(child, child.basename)
    rules = []
    for group in ctx.attr.filegroups:
        srcs = 'glob(["%s/**"])' % group if present else "[]"
        rules.append('filegroup(name = "%s", srcs = %s, visibility = ["//visibility:public"])' % (group, srcs))
    ctx.file("BUILD.bazel", "\n".join(rules) + "\n")

optional_local_directory = repository_rule(
    implementation = _optional_local_directory_impl,
    attrs = {
        "path": attr.string(mandatory = True),
        "filegroups": attr.string_list(mandatory = True),
    },
    local = True,
)
