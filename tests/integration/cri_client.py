"""A minimal CRI v1 client: cri/runtime_v1.proto (the subset of
k8s.io/cri-api's runtime.v1 that the tests call) compiled by protoc at
run time into a temp dir, and gRPC calls made with grpcio's generic
unary_unary (no generated stubs, so protoc's --python_out is enough).
Debian's python3-grpcio and python3-protobuf live in Debian's
dist-packages; an interpreter of another prefix (pyenv, a venv) of the
same Python version finds them there."""

import importlib
import os
import shutil
import subprocess
import sys
import tempfile

PROTO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cri")
PROTO = "runtime_v1.proto"
DEBIAN_DIST = "/usr/lib/python3/dist-packages"


def _import_grpc():
    try:
        import grpc  # noqa: F401
        import google.protobuf  # noqa: F401
    except ImportError:
        if DEBIAN_DIST in sys.path or not os.path.isdir(DEBIAN_DIST):
            raise
        sys.path.append(DEBIAN_DIST)
        for name in [m for m in sys.modules if m == "google" or m.startswith("google.")]:
            del sys.modules[name]
        import grpc  # noqa: F401
        import google.protobuf  # noqa: F401
    import grpc
    return grpc


def missing():
    """Why the client cannot run here (a sentence), or None."""
    if not shutil.which("protoc"):
        return "protoc is not installed (scripts/setup.sh installs protobuf-compiler)"
    try:
        _import_grpc()
    except ImportError as e:
        return f"grpcio/protobuf cannot be imported ({e}; scripts/setup.sh installs python3-grpcio python3-protobuf)"
    return None


_pb = None


def pb():
    """The generated module of runtime_v1.proto (compiled once per process)."""
    global _pb
    if _pb is None:
        _import_grpc()
        out = tempfile.mkdtemp(prefix="airlock-cri-pb-")
        try:
            subprocess.run(["protoc", f"--proto_path={PROTO_DIR}", f"--python_out={out}", PROTO],
                           check=True, capture_output=True, text=True)
            sys.path.insert(0, out)
            try:
                _pb = importlib.import_module(PROTO[:-len(".proto")] + "_pb2")
            finally:
                sys.path.remove(out)
        finally:
            shutil.rmtree(out, ignore_errors=True)
    return _pb


# Method -> its response message; the request is <Method>Request.
_RUNTIME = ["Version", "RunPodSandbox", "StopPodSandbox", "RemovePodSandbox", "PodSandboxStatus",
            "ListPodSandbox", "CreateContainer", "StartContainer", "StopContainer", "RemoveContainer",
            "ContainerStatus", "ExecSync"]


class Client:
    """runtime.v1.RuntimeService over containerd's unix socket."""

    def __init__(self, socket_path):
        grpc = _import_grpc()
        self.grpc = grpc
        self.pb = pb()
        self.channel = grpc.insecure_channel("unix://" + socket_path)
        self._calls = {}
        for m in _RUNTIME:
            req, resp = getattr(self.pb, m + "Request"), getattr(self.pb, m + "Response")
            self._calls[m] = self.channel.unary_unary(f"/runtime.v1.RuntimeService/{m}",
                                                      request_serializer=req.SerializeToString,
                                                      response_deserializer=resp.FromString)

    def call(self, method, deadline=180, **fields):
        """The response of `method` with a request built from `fields` (messages
        or dicts), waited for at most `deadline` seconds."""
        req = getattr(self.pb, method + "Request")(**fields)
        return self._calls[method](req, timeout=deadline)

    def close(self):
        self.channel.close()
