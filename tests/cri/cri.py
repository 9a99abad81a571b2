#!/usr/bin/env python3
"""A small CRI v1 client for natledger's tests (Debian has no crictl).

    cri.py --socket SOCK --stubs DIR COMMAND ARGS...

    version                         runtime name and version, one line
    run-pod POD.json                RunPodSandbox; prints the pod sandbox id
    pod-status POD_ID               PodSandboxStatus (verbose) as JSON
    stop-pod POD_ID                 StopPodSandbox
    rm-pod POD_ID                   RemovePodSandbox
    create POD_ID CTR.json POD.json CreateContainer; prints the container id
    start CTR_ID                    StartContainer
    stop CTR_ID [TIMEOUT]           StopContainer (TIMEOUT seconds before SIGKILL; 0 default)
    rm CTR_ID                       RemoveContainer
    status CTR_ID                   ContainerStatus (verbose) as JSON
    ps [POD_ID]                     ListContainers as JSON
    pods                            ListPodSandbox as JSON
    image-status IMAGE              ImageStatus as JSON ({} when the image is unknown)

The JSON files are the CRI messages in protobuf's JSON mapping (PodSandboxConfig,
ContainerConfig; field names as in api.proto or camelCase). The Python stubs are generated
from api.proto (beside this file) into --stubs DIR on first use; they are not committed.
A failed call exits 1 with the gRPC status code and the runtime's message on stderr.
"""

import argparse
import importlib
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# Every call is bounded: a hung runtime fails the test instead of stalling it.
TIMEOUT = 120


def stubs(directory):
    """api_pb2 and api_pb2_grpc, generated into `directory` unless already there."""
    if not os.path.exists(os.path.join(directory, "api_pb2_grpc.py")):
        os.makedirs(directory, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", "-I", HERE,
             "--python_out", directory, "--grpc_python_out", directory,
             os.path.join(HERE, "api.proto")],
            check=True)
    sys.path.insert(0, directory)
    return importlib.import_module("api_pb2"), importlib.import_module("api_pb2_grpc")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, help="containerd's CRI socket path")
    parser.add_argument("--stubs", required=True, help="directory for the generated stubs")
    parser.add_argument("command")
    parser.add_argument("args", nargs="*")
    opts = parser.parse_args()

    pb, pb_grpc = stubs(opts.stubs)
    import grpc
    from google.protobuf import json_format

    def load(path, message):
        with open(path, encoding="utf-8") as f:
            return json_format.Parse(f.read(), message)

    def show(message):
        print(json_format.MessageToJson(message, preserving_proto_field_name=True))

    channel = grpc.insecure_channel("unix://" + os.path.abspath(opts.socket))
    runtime = pb_grpc.RuntimeServiceStub(channel)
    images = pb_grpc.ImageServiceStub(channel)
    cmd, args = opts.command, opts.args

    def need(n):
        if len(args) < n:
            parser.error(f"{cmd} needs {n} argument(s), got {args}")

    try:
        if cmd == "version":
            v = runtime.Version(pb.VersionRequest(version="v1"), timeout=TIMEOUT)
            print(v.runtime_name, v.runtime_version, v.runtime_api_version)
        elif cmd == "run-pod":
            need(1)
            config = load(args[0], pb.PodSandboxConfig())
            r = runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=TIMEOUT)
            print(r.pod_sandbox_id)
        elif cmd == "pod-status":
            need(1)
            show(runtime.PodSandboxStatus(
                pb.PodSandboxStatusRequest(pod_sandbox_id=args[0], verbose=True),
                timeout=TIMEOUT))
        elif cmd == "stop-pod":
            need(1)
            runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=args[0]),
                                   timeout=TIMEOUT)
        elif cmd == "rm-pod":
            need(1)
            runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=args[0]),
                                     timeout=TIMEOUT)
        elif cmd == "create":
            need(3)
            r = runtime.CreateContainer(pb.CreateContainerRequest(
                pod_sandbox_id=args[0],
                config=load(args[1], pb.ContainerConfig()),
                sandbox_config=load(args[2], pb.PodSandboxConfig())), timeout=TIMEOUT)
            print(r.container_id)
        elif cmd == "start":
            need(1)
            runtime.StartContainer(pb.StartContainerRequest(container_id=args[0]),
                                   timeout=TIMEOUT)
        elif cmd == "stop":
            need(1)
            grace = int(args[1]) if len(args) > 1 else 0
            runtime.StopContainer(pb.StopContainerRequest(container_id=args[0], timeout=grace),
                                  timeout=TIMEOUT)
        elif cmd == "rm":
            need(1)
            runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=args[0]),
                                    timeout=TIMEOUT)
        elif cmd == "status":
            need(1)
            show(runtime.ContainerStatus(
                pb.ContainerStatusRequest(container_id=args[0], verbose=True), timeout=TIMEOUT))
        elif cmd == "ps":
            filt = pb.ContainerFilter(pod_sandbox_id=args[0] if args else "")
            show(runtime.ListContainers(pb.ListContainersRequest(filter=filt), timeout=TIMEOUT))
        elif cmd == "pods":
            show(runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=TIMEOUT))
        elif cmd == "image-status":
            need(1)
            show(images.ImageStatus(
                pb.ImageStatusRequest(image=pb.ImageSpec(image=args[0])), timeout=TIMEOUT))
        else:
            parser.error(f"unknown command {cmd!r}")
    except grpc.RpcError as e:
        print(f"cri.py {cmd}: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
