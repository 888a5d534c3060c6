#!/usr/bin/python3 -I
# Stands in for NVIDIA's nvidia-container-runtime-hook @VERSION@ (package nvidia-container-toolkit); lab only.
"""The OCI prestart hook `docker run --gpus` adds (moby daemon/nvidia_linux.go setNvidiaGPUs:
Path = the hook found in PATH, Args = [nvidia-container-runtime-hook, prestart], Env = dockerd's).

What it does, as NVIDIA/nvidia-container-toolkit cmd/nvidia-container-runtime-hook does:
- main.go: `prestart` reads the OCI state (JSON: pid, bundle) on stdin, then execs
  nvidia-container-cli [--load-kmods] configure [--ldconfig=...] --device=<NVIDIA_VISIBLE_DEVICES>
  --<capability>... --require=<each NVIDIA_REQUIRE_*>... --pid=<pid> <rootfs>;
  `poststart`/`poststop` do nothing; a failure is logged and exits 1 (doPrestart's exit()).
- container_config.go: the bundle's config.json gives process.env and root.path; no
  NVIDIA_VISIBLE_DEVICES (or empty, or "void") is not a GPU container: nothing to do; a legacy
  image (CUDA_VERSION without NVIDIA_REQUIRE_CUDA) gets every device.
- internal/config/image/cuda_image.go GetRequirements: every NVIDIA_REQUIRE_* value except
  NVIDIA_REQUIRE_JETPACK, plus cuda>=<major.minor of CUDA_VERSION> for a legacy image; none
  when NVIDIA_DISABLE_REQUIRE parses as true (Go strconv.ParseBool) or config.toml says
  disable-require = true.
- getDriverCapabilities: NVIDIA_DRIVER_CAPABILITIES unset -> utility,compute (all for a
  legacy image); "all" -> all; an unsupported one -> "unsupported capabilities found in ...".

The interpreter runs isolated (-I): dockerd hands the hook its own environment, which may
carry PYTHON* variables meant for something else.
Test-only environment overrides (never set on a node): DTLAB_STANDIN_HOOK_CONFIG (config.toml),
DTLAB_STANDIN_CLI (the cli it execs).
"""

import json
import os
import sys
import tomllib

CONFIG = os.environ.get("DTLAB_STANDIN_HOOK_CONFIG", "/etc/nvidia-container-runtime/config.toml")
CLI = os.environ.get("DTLAB_STANDIN_CLI", "/usr/bin/nvidia-container-cli")
# image.DefaultDriverCapabilities and the supported set (internal/config/image/capabilities.go).
DEFAULT_CAPABILITIES = ("utility", "compute")
SUPPORTED_CAPABILITIES = ("compute", "compat32", "graphics", "utility", "video", "display", "ngx")
TRUE = {"1", "t", "T", "TRUE", "true", "True"}  # Go strconv.ParseBool's true values


def panic(*parts) -> None:
    """log.Panicln: the message on stderr, then exit 1 (main.go exit())."""
    print(*parts, file=sys.stderr)
    sys.exit(1)


def load_config() -> dict:
    try:
        with open(CONFIG, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        panic("error getting hook config:", exc)
        raise  # unreachable: panic exits


def environment(spec: dict) -> dict[str, str]:
    env = {}
    for item in (spec.get("process") or {}).get("env") or []:
        name, _, value = item.partition("=")
        env[name] = value
    return env


def devices(env: dict[str, str], legacy: bool) -> str | None:
    if "NVIDIA_VISIBLE_DEVICES" not in env:
        return "all" if legacy else None
    listed = [d.strip() for d in env["NVIDIA_VISIBLE_DEVICES"].split(",") if d.strip()]
    if not listed or "void" in listed:
        return None
    return ",".join(listed)


def capabilities(env: dict[str, str], legacy: bool) -> list[str]:
    if "NVIDIA_DRIVER_CAPABILITIES" not in env:
        return list(SUPPORTED_CAPABILITIES if legacy else DEFAULT_CAPABILITIES)
    wanted = [c for c in env["NVIDIA_DRIVER_CAPABILITIES"].split(",") if c]
    if not wanted:
        return list(DEFAULT_CAPABILITIES)
    if "all" in wanted:
        return list(SUPPORTED_CAPABILITIES)
    unsupported = [c for c in wanted if c not in SUPPORTED_CAPABILITIES]
    if unsupported:
        panic(
            f"unsupported capabilities found in '{','.join(wanted)}' (allowed '{','.join(SUPPORTED_CAPABILITIES)}')"
        )
    return wanted


def requirements(env: dict[str, str], config: dict, legacy: bool) -> list[str]:
    if config.get("disable-require") is True or env.get("NVIDIA_DISABLE_REQUIRE") in TRUE:
        return []
    reqs = [
        v
        for k, v in env.items()
        if k.startswith("NVIDIA_REQUIRE_") and not k.startswith("NVIDIA_REQUIRE_JETPACK")
    ]
    if legacy:
        parts = env["CUDA_VERSION"].lstrip("v").split(".")
        if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
            panic(
                "failed to get requirements failed to get version: invalid CUDA version: invalid version string"
            )
        reqs.append(f"cuda>={int(parts[0])}.{int(parts[1])}")
    return reqs


def prestart() -> None:
    config = load_config()
    try:
        state = json.load(sys.stdin)
    except ValueError as exc:
        panic("could not decode container state:", exc)
    bundle = state.get("bundle") or state.get("bundlePath") or ""
    try:
        with open(os.path.join(bundle, "config.json")) as f:
            spec = json.load(f)
    except (OSError, ValueError) as exc:
        panic("could not open OCI spec:", exc)
    env = environment(spec)
    legacy = bool(env.get("CUDA_VERSION")) and not env.get("NVIDIA_REQUIRE_CUDA")
    visible = devices(env, legacy)
    if visible is None:
        return  # not a GPU container
    cli_config = config.get("nvidia-container-cli") or {}
    rootfs = os.path.join(bundle, (spec.get("root") or {}).get("path", "rootfs"))
    args = [CLI]
    if cli_config.get("load-kmods"):
        args.append("--load-kmods")
    args.append("configure")
    if cli_config.get("ldconfig"):
        args.append(f"--ldconfig={cli_config['ldconfig']}")
    args.append(f"--device={visible}")
    args += [f"--{c}" for c in capabilities(env, legacy)]
    args += [f"--require={r}" for r in requirements(env, config, legacy)]
    args += [f"--pid={int(state.get('pid') or 0)}", os.path.abspath(rootfs)]
    os.execv(CLI, args)


def main(argv: list[str]) -> int:
    if argv[:1] in (["--version"], ["-version"]):
        print("NVIDIA Container Runtime Hook version @VERSION@")
        print("commit: @COMMIT@")
        return 0
    if argv[:1] == ["prestart"]:
        prestart()
        return 0
    if argv[:1] in (["poststart"], ["poststop"]):
        return 0
    print("Usage of nvidia-container-runtime-hook:", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
