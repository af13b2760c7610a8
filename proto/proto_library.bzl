"""C++ code generation for dray's .proto files with Debian's protoc and grpc_cpp_plugin.

Bazel's proto_library wants @com_google_protobuf sources, which an offline build
does not have; this macro runs the system compilers in a genrule instead.

    dray_cc_proto_library(
        name = "data_cc_proto",
        srcs = ["dray/v1/data.proto"],
        deps = [":tensor_cc_proto"],
        grpc = True,  # also generate service stubs (*.grpc.pb.{h,cc})
    )

Sources are paths below this package; protoc's import root is this package, so
C++ includes them as "dray/v1/data.pb.h".
"""

def _strip(src):
    if not src.endswith(".proto"):
        fail("dray_cc_proto_library: %s is not a .proto file" % src)
    return src[:-len(".proto")]

def dray_cc_proto_library(name, srcs, deps = [], proto_deps = [], grpc = False, visibility = None):
    """Generates and compiles C++ for `srcs`.

    Args:
      name: the cc_library to create.
      srcs: .proto files below this package.
      deps: dray_cc_proto_library targets whose messages `srcs` import.
      proto_deps: the .proto files of `deps` (protoc reads them for imports).
      grpc: also generate gRPC service stubs.
      visibility: of the cc_library.
    """
    stems = [_strip(s) for s in srcs]
    hdrs = [s + ".pb.h" for s in stems]
    ccs = [s + ".pb.cc" for s in stems]
    plugin = ""
    if grpc:
        hdrs += [s + ".grpc.pb.h" for s in stems]
        ccs += [s + ".grpc.pb.cc" for s in stems]
        plugin = " --grpc_out=$(RULEDIR) --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin"
    native.genrule(
        name = name + "_gen",
        srcs = srcs + proto_deps,
        outs = hdrs + ccs,
        cmd = "/usr/bin/protoc -I" + native.package_name() + " --cpp_out=$(RULEDIR)" +
              plugin + " " + " ".join(["$(location %s)" % s for s in srcs]),
    )
    native.cc_library(
        name = name,
        srcs = ccs,
        hdrs = hdrs,
        includes = ["."],
        deps = deps + ["//third_party:protobuf"] + (["//third_party:grpc"] if grpc else []),
        visibility = visibility,
    )

def dray_py_grpc_library(name, src, visibility = None):
    """Generates Python messages and gRPC stubs (`<file>_pb2.py`, `<file>_pb2_grpc.py`) for `src`.

    Args:
      name: the genrule to create.
      src: one .proto file below this package (its imports are not followed).
      visibility: of the generated files.
    """
    stem = _strip(src)
    native.genrule(
        name = name,
        srcs = [src],
        outs = [stem + "_pb2.py", stem + "_pb2_grpc.py"],
        cmd = ("/usr/bin/protoc -Iproto --python_out=$(RULEDIR) --grpc_python_out=$(RULEDIR) " +
               "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin $(location %s)") % src,
        visibility = visibility,
    )
