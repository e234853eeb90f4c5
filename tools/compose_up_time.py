"""tools/compose_up_time.py: seconds from `compose up -d` to the engine's first 200 on
/healthz (issue 44), with podman.

    python3 tools/compose_up_time.py --local --cold --repeat 3

Runs, in its own compose project (`engine-uptime`, so its containers, volume and network
are its own), publishing the engine on 127.0.0.1:PORT only:
  - cold (--cold): no engine image and no build cache (`--no-cache`), a fresh volume: the
    build, initdb, the migrations and the start;
  - warm (--repeat times): the images already built, a fresh volume (initdb, migrations);
  - restart: the images built and the last warm run's volume kept (no initdb, nothing to
    migrate).
After each cold or warm start it posts one event with the API token and expects 202. Every
run ends with `compose down` (-v but for the volume restart reuses); at exit nothing it
started is left but the engine image it built. --local adds compose.local.yaml: images
built here (tools/container-base.sh, tools/postgres-image.sh) for a machine without a
registry. Needs podman and `podman compose` or podman-compose (pip install
podman-compose; podman < 4.7 has no `podman compose`)."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "engine-uptime"
ENGINE_IMAGE = "localhost/engine:latest"  # compose.yaml's `engine:latest`, as podman names it
ENV = {
    **os.environ,
    "CONTAINERS_CONF": os.environ.get(
        "CONTAINERS_CONF", str(ROOT / "tools/podman/containers.conf")),
    "CONTAINERS_STORAGE_CONF": os.environ.get(
        "CONTAINERS_STORAGE_CONF", str(ROOT / "tools/podman/storage.conf")),
    # compose builds without --format; the docker format keeps the image's HEALTHCHECK.
    "BUILDAH_FORMAT": "docker",
}


def fail(message: str) -> None:
    print(f"compose_up_time: {message}", file=sys.stderr)
    sys.exit(2)


def compose_command() -> list[str]:
    """`podman compose` where podman has it and a provider answers, else podman-compose
    (on PATH or beside this Python)."""
    if shutil.which("podman") is None:
        fail("podman is not installed (apt-get install podman)")
    probe = subprocess.run(["podman", "compose", "version"], env=ENV, capture_output=True)
    if probe.returncode == 0:
        return ["podman", "compose"]
    beside = Path(sys.executable).parent / "podman-compose"
    found = shutil.which("podman-compose") or (str(beside) if beside.exists() else None)
    if found is None:
        fail("neither `podman compose` nor podman-compose is available:"
             " pip install podman-compose (podman < 4.7 has no `podman compose`)")
    return [found]


class Stack:
    def __init__(self, compose: list[str], files: list[str], port: int, token: str,
                 log: Path) -> None:
        self.base = [*compose, "-p", PROJECT, *(a for f in files for a in ("-f", f))]
        self.port = port
        self.token = token
        self.log = log
        self.env = {**ENV, "ENGINE_PUBLISH": f"127.0.0.1:{port}", "ENGINE_API_TOKEN": token}

    def compose(self, *args: str, build_args: str | None = None, check: bool = True) -> None:
        command = [*self.base, *([f"--podman-build-args={build_args}"] if build_args else [])]
        with self.log.open("a") as out:
            out.write(f"\n$ {' '.join(command + list(args))}\n")
            out.flush()
            done = subprocess.run([*command, *args], env=self.env, cwd=ROOT, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=3600)
        if check and done.returncode != 0:
            fail(f"`compose {' '.join(args)}` exited {done.returncode}; see {self.log}")

    def request(self, method: str, path: str, body: object = None) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            headers = {"Authorization": f"Bearer {self.token}"}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

    def healthy(self) -> bool:
        try:
            return self.request("GET", "/healthz") == 200
        except OSError:  # refused, reset or timed out while it starts
            return False

    def engine_restarts(self) -> int:
        names = podman("ps", "-a", "--format", "{{.Names}}",
                       "--filter", f"label=io.podman.compose.project={PROJECT}",
                       "--filter", "label=com.docker.compose.service=engine").split()
        if not names:
            return -1
        return int(podman("inspect", "--format", "{{.RestartCount}}", names[0]).strip())

    def up(self, label: str, *, timeout: float, build_args: str | None = None,
           post: bool = True) -> dict[str, object]:
        started = time.monotonic()
        self.compose("up", "-d", build_args=build_args)
        returned = time.monotonic() - started
        while not self.healthy():
            if time.monotonic() - started > timeout:
                fail(f"{label}: no 200 from /healthz within {timeout:.0f} s; see {self.log}")
            time.sleep(0.2)
        healthz = time.monotonic() - started
        run: dict[str, object] = {"run": label, "up_returned_s": round(returned, 1),
                                  "healthz_s": round(healthz, 1),
                                  "healthz_after_up_s": round(healthz - returned, 1),
                                  "engine_restarts": self.engine_restarts()}
        if post:
            status = self.request("POST", "/v1/events",
                                  {"type": "compose.up", "payload": {"run": label}})
            run["event_status"] = status
            if status != 202:
                fail(f"{label}: POST /v1/events answered {status}, not 202")
        print(json.dumps(run), flush=True)
        return run

    def down(self, *, volumes: bool) -> None:
        started = time.monotonic()
        self.compose("down", *(["-v"] if volumes else []))
        print(json.dumps({"down_s": round(time.monotonic() - started, 1),
                          "volume_removed": volumes}), flush=True)


def podman(*args: str) -> str:
    return subprocess.run(["podman", *args], env=ENV, capture_output=True, text=True,
                          check=True, timeout=300).stdout


def image_size(name: str) -> str:
    try:
        size = int(podman("image", "inspect", "--format", "{{.Size}}", name).strip())
    except subprocess.CalledProcessError:
        return "(none)"
    return f"{size / 1e6:.0f} MB"


def leftovers() -> list[str]:
    label = f"label=io.podman.compose.project={PROJECT}"
    found = podman("ps", "-a", "--format", "container {{.Names}}", "--filter", label)
    found += podman("volume", "ls", "--format", "volume {{.Name}}", "--filter", label)
    found += "".join(f"network {n}\n" for n in podman("network", "ls", "--format",
                                                        "{{.Name}}").split()
                     if n.startswith(f"{PROJECT}_"))
    return found.splitlines()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local", action="store_true",
                        help="add compose.local.yaml: images built here, no registry")
    parser.add_argument("--cold", action="store_true",
                        help="first remove the engine image and build it without cache")
    parser.add_argument("--repeat", type=int, default=1, help="warm runs (default 1)")
    parser.add_argument("--port", type=int, default=18080,
                        help="the engine's port on 127.0.0.1 (default 18080)")
    args = parser.parse_args()
    compose = compose_command()
    files = ["compose.yaml"]
    if args.local:
        files.append("compose.local.yaml")
        started = time.monotonic()
        pg_image = subprocess.run(["bash", str(ROOT / "tools/postgres-image.sh")], env=ENV,
                                  capture_output=True, text=True, check=True
                                  ).stdout.split()[-1]
        ENV["POSTGRES_IMAGE"] = pg_image
        print(f"postgres image {pg_image} ready in {time.monotonic() - started:.1f} s")
    log = Path(tempfile.mkstemp(prefix="compose-up-time-", suffix=".log")[1])
    stack = Stack(compose, files, args.port, secrets.token_urlsafe(16), log)
    print(f"compose: {' '.join(stack.base)} (log {log})", flush=True)
    if leftovers():
        fail(f"project {PROJECT} already has {leftovers()}: not mine to remove")
    try:
        if args.cold:
            subprocess.run(["podman", "rmi", "--ignore", ENGINE_IMAGE], env=ENV, check=True,
                           capture_output=True)
            stack.up("cold", timeout=3600, build_args="--no-cache")
            stack.down(volumes=True)
        for n in range(args.repeat):
            stack.up(f"warm{n + 1}", timeout=600)
            stack.down(volumes=n < args.repeat - 1)
        stack.up("restart", timeout=600, post=False)
        stack.down(volumes=True)
    finally:
        stack.compose("down", "-v", check=False)
    left = leftovers()
    if left:
        fail(f"left after `down -v`: {left}")
    for name in (ENGINE_IMAGE, ENV.get("POSTGRES_IMAGE", ""),
                 "localhost/engine-base:bookworm"):
        if name:
            print(f"image {name}: {image_size(name)}")


if __name__ == "__main__":
    main()
