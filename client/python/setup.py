"""Builds the stubs of sluice's wire contract into the wheel: `pip install ./client/python` (from
a clone: the .proto files are in ../../proto, or in $SLUICE_PROTO_DIR) runs grpcio-tools' protoc
into the build directory, so that sluice.v1 ships beside the package sources. Nothing generated is
written into the source tree."""
import glob
import os

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        from grpc_tools import protoc
        import grpc_tools

        proto = os.environ.get("SLUICE_PROTO_DIR") or os.path.join(HERE, "..", "..", "proto")
        files = sorted(glob.glob(os.path.join(proto, "sluice", "v1", "*.proto")))
        if not files:
            raise SystemExit("sluice: no .proto files under %s (build from a clone of the "
                             "repository, or set SLUICE_PROTO_DIR)" % os.path.abspath(proto))
        include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        out = self.build_lib
        args = ["grpc_tools.protoc", "-I" + proto, "-I" + include, "--python_out=" + out,
                "--grpc_python_out=" + out]
        args += [os.path.relpath(f, proto) for f in files]
        if protoc.main(args) != 0:
            raise SystemExit("sluice: protoc failed on %s" % ", ".join(files))


setup(cmdclass={"build_py": BuildWithStubs})
