#!/usr/bin/env python3
"""The runtime image of the Dockerfile's final stage, assembled here without docker.

A docker build needs a registry (the base image, the Rust image); this machine has none. This
script makes the same image from the same parts: the binary of the Dockerfile's own cargo command
(the dist profile), the glibc libraries it links (what `ldd` lists, as distroless/cc carries
them), the nonroot user 65532, and the final stage's USER, ENTRYPOINT, CMD, EXPOSE and LABELs,
read from the Dockerfile itself. Nothing else. tests/it/manifests.rs holds this to the Dockerfile.

    tests/node/image.py [--tag TAG]     build, assemble target/image/farm-apiserver_TAG.tar,
                                        import it into the lab node's containerd when it runs
    tests/node/image.py --print-config  what would be built, as JSON (no build)

Options for tests: --binary PATH (no build), --out DIR, --no-import.
"""
import argparse
import hashlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = "farm-apiserver"


def dockerfile():
    """The builder's cargo command and the final stage's image settings."""
    text = open(os.path.join(ROOT, "Dockerfile")).read()
    # Continuation lines joined: a RUN spans several.
    lines = re.sub(r"\\\n\s*", " ", text).splitlines()
    stages, cargo = [], None
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            stages.append({"from": rest, "labels": {}, "expose": []})
        elif word == "RUN" and "cargo build" in rest:
            cargo = re.search(r"(cargo build[^&]*)", rest).group(1).strip()
        elif word == "USER":
            stages[-1]["user"] = rest.strip()
        elif word in ("ENTRYPOINT", "CMD"):
            stages[-1][word.lower()] = json.loads(rest)
        elif word == "EXPOSE":
            stages[-1]["expose"] += rest.split()
        elif word == "LABEL":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                stages[-1]["labels"][key] = value
    final = stages[-1]
    return {
        "build": cargo,
        "base": final["from"],
        "user": final["user"],
        "entrypoint": final["entrypoint"],
        "cmd": final["cmd"],
        "expose": final["expose"],
        "labels": final["labels"],
    }


def libraries(binary):
    """Every file `ldd` says the binary loads, the dynamic loader included."""
    out = subprocess.run(["ldd", binary], check=True, capture_output=True, text=True).stdout
    paths = []
    for line in out.splitlines():
        match = re.search(r"(/\S+) \(0x", line)
        if match:
            paths.append(match.group(1))
    return sorted(set(paths))


def layer(binary, settings):
    """The one layer, reproducible: fixed times and owners, sorted."""
    uid, _, gid = settings["user"].partition(":")
    uid, gid = int(uid), int(gid or uid)
    entries = []

    def directory(path, mode=0o755, owner=(0, 0)):
        info = tarfile.TarInfo(path)
        info.type, info.mode, (info.uid, info.gid) = tarfile.DIRTYPE, mode, owner
        entries.append((info, None))

    def file(path, data, mode=0o644):
        info = tarfile.TarInfo(path)
        info.size, info.mode = len(data), mode
        entries.append((info, data))

    made = set()
    def parents(path):
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d and d not in made:
                made.add(d)
                directory(d)

    for path in ("etc", "home", "tmp"):
        made.add(path)
    directory("etc")
    directory("home")
    directory("home/nonroot", 0o700, (uid, gid))
    directory("tmp", 0o1777)
    file("etc/passwd", (
        "root:x:0:0:root:/root:/sbin/nologin\n"
        f"nonroot:x:{uid}:{gid}:nonroot:/home/nonroot:/sbin/nologin\n").encode())
    file("etc/group", f"root:x:0:\nnonroot:x:{gid}:\n".encode())
    for lib in libraries(binary):
        target = lib.lstrip("/")
        parents(target)
        file(target, open(lib, "rb").read(), 0o755)
    entrypoint = settings["entrypoint"][0].lstrip("/")
    parents(entrypoint)
    file(entrypoint, open(binary, "rb").read(), 0o755)

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in sorted(entries, key=lambda e: e[0].name):
            info.mtime = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def image_config(settings, diff_id):
    uid_gid = settings["user"]
    return {
        "architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine),
        "os": "linux",
        "config": {
            "User": uid_gid,
            "Entrypoint": settings["entrypoint"],
            "Cmd": settings["cmd"],
            "ExposedPorts": {f"{p}/tcp" if "/" not in p else p: {} for p in settings["expose"]},
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Labels": settings["labels"],
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [{"created_by": "tests/node/image.py: the Dockerfile's final stage"}],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tag", default="dev")
    p.add_argument("--binary", help="use this binary instead of building")
    p.add_argument("--out", default=os.path.join(ROOT, "target", "image"))
    p.add_argument("--no-import", action="store_true")
    p.add_argument("--print-config", action="store_true")
    a = p.parse_args()

    settings = dockerfile()
    if a.print_config:
        print(json.dumps(settings, indent=2))
        return
    binary = a.binary
    if binary is None:
        subprocess.run(shlex.split(settings["build"]), cwd=ROOT, check=True)
        binary = os.path.join(ROOT, "target", "dist", NAME)

    data = layer(binary, settings)
    diff_id = hashlib.sha256(data).hexdigest()
    config = json.dumps(image_config(settings, diff_id), sort_keys=True).encode()
    config_id = hashlib.sha256(config).hexdigest()
    ref = f"{NAME}:{a.tag}"
    # As kubelet and containerd name `farm-apiserver:<tag>` (no registry in the name).
    full_ref = f"docker.io/library/{ref}"
    manifest = json.dumps([{
        "Config": f"{config_id}.json",
        "RepoTags": [full_ref],
        "Layers": [f"{diff_id}/layer.tar"],
    }]).encode()

    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"{NAME}_{a.tag}.tar")
    with tarfile.open(path, "w") as tar:
        for name, body in ((f"{config_id}.json", config), (f"{diff_id}/layer.tar", data),
                           ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    print(f"{path}: {ref}, {len(data) / 2**20:.1f} MiB, layer sha256:{diff_id[:12]}")

    if a.no_import:
        return
    # The lab node's containerd (../shared/k8s-lab, `up.sh --node`).
    lab = os.environ.get("K8S_LAB_HOME", os.path.expanduser("~/.k8s-lab"))
    sock = os.path.join(lab, "run", "node", "containerd.sock")
    if os.path.exists(sock):
        subprocess.run(["ctr", "-a", sock, "-n", "k8s.io", "images", "import", path], check=True)
        print(f"imported into the lab node: image {ref}")
    else:
        print(f"no lab node at {sock}: not imported", file=sys.stderr)


if __name__ == "__main__":
    main()
