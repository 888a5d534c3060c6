#!/usr/bin/python3
# Stands in for NVIDIA's nvidia-ctk @VERSION@ (package nvidia-container-toolkit-base); lab only.
"""nvidia-ctk: `--version` and `runtime configure` as NVIDIA Container Toolkit 1.13 does them.

`nvidia-ctk runtime configure --runtime=docker` loads /etc/docker/daemon.json (or --config),
adds runtimes.nvidia = {"args": [], "path": "nvidia-container-runtime"} keeping every other
key, optionally sets "default-runtime", and writes the file back as Go's
json.MarshalIndent(..., "", "    ") does (keys sorted, 4-space indent, no trailing newline).
Like the real tool it rewrites the file on every run, changed or not.
"""

import json
import os
import sys

VERSION = "@VERSION@"
COMMIT = "@COMMIT@"

USAGE = """NAME:
   NVIDIA Container Toolkit CLI - Tools to configure the NVIDIA Container Toolkit

USAGE:
   nvidia-ctk [global options] command [command options] [arguments...]

VERSION:
   {version}
commit: {commit}

COMMANDS:
   runtime  A collection of runtime-related utilities for the NVIDIA Container Toolkit
   help, h  Shows a list of commands or help for one command

GLOBAL OPTIONS:
   --debug, -d    Enable debug-level logging (default: false)
   --help, -h     show help
   --version, -v  print the version
"""

CONFIGURE_FLAGS = {
    # flag -> (destination, takes a value)
    "dry-run": ("dry_run", False),
    "runtime": ("runtime", True),
    "config": ("config", True),
    "nvidia-runtime-name": ("name", True),
    "runtime-path": ("path", True),
    "nvidia-runtime-path": ("path", True),
    "set-as-default": ("set_default", False),
    "nvidia-set-as-default": ("set_default", False),
}


def info(msg):
    sys.stderr.write(f"INFO[0000] {msg}\n")


def error(msg):
    sys.stderr.write(f"ERRO[0000] {msg}\n")
    return 1


def incorrect_usage(flag):
    sys.stderr.write(f"Incorrect Usage: flag provided but not defined: -{flag}\n\n")
    return 1


def parse_flags(args, table):
    opts = {}
    while args:
        arg = args.pop(0)
        if not arg.startswith("-") or arg in ("-", "--"):
            return None, f"unexpected argument {arg!r}"
        name, eq, value = arg.lstrip("-").partition("=")
        if name not in table:
            return None, name
        dest, takes_value = table[name]
        if takes_value:
            if not eq:
                if not args:
                    return None, f"flag needs an argument: -{name}"
                value = args.pop(0)
            opts[dest] = value
        else:
            opts[dest] = value.lower() not in ("false", "0") if eq else True
    return opts, None


def runtime_configure(args):
    opts, bad = parse_flags(args, CONFIGURE_FLAGS)
    if opts is None:
        if bad.startswith(("unexpected", "flag needs")):
            sys.stderr.write(f"Incorrect Usage: {bad}\n\n")
            return 1
        return incorrect_usage(bad)
    runtime = opts.get("runtime", "docker")
    if runtime != "docker":
        if runtime in ("containerd", "crio"):
            return error(f"lab stand-in supports only --runtime=docker, not {runtime!r}")
        return error(f"unrecognized runtime '{runtime}'")
    path = opts.get("config", "/etc/docker/daemon.json")
    name = opts.get("name", "nvidia")
    info(f"Loading docker config from {path}")
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        info("Config file does not exist, creating new one")
        text = ""
    except OSError as exc:
        return error(f"unable to load config: {exc}")
    try:
        config = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        return error(f"unable to load config: unable to read config: {exc}")
    if not isinstance(config, dict):
        return error("unable to load config: unable to read config: not a JSON object")
    runtimes = config.get("runtimes")
    if not isinstance(runtimes, dict):
        runtimes = {}
    runtimes[name] = {"args": [], "path": opts.get("path", "nvidia-container-runtime")}
    config["runtimes"] = runtimes
    if opts.get("set_default"):
        config["default-runtime"] = name
    elif config.get("default-runtime") == name:
        del config["default-runtime"]
    output = json.dumps(config, indent=4, sort_keys=True)
    if opts.get("dry_run"):
        sys.stdout.write(output + "\n")
        return 0
    try:
        with open(path, "w") as f:
            f.write(output)
        os.chmod(path, 0o644)
    except OSError as exc:
        return error(f"unable to flush config: {exc}")
    info(f"Wrote updated config to {path}")
    info("It is recommended that docker daemon be restarted.")
    return 0


def main(argv):
    args = list(argv)
    if not args or args[0] in ("-h", "--help", "help", "h"):
        sys.stdout.write(USAGE.format(version=VERSION, commit=COMMIT))
        return 0
    if args[0] in ("-v", "--version"):
        sys.stdout.write(f"NVIDIA Container Toolkit CLI version {VERSION}\ncommit: {COMMIT}\n")
        return 0
    while args and args[0] in ("-d", "--debug"):
        args.pop(0)
    if len(args) >= 2 and args[0] == "runtime" and args[1] == "configure":
        return runtime_configure(args[2:])
    if args and args[0].startswith("-"):
        return incorrect_usage(args[0].lstrip("-"))
    sys.stderr.write(
        f"nvidia-ctk (lab stand-in): command not supported: {' '.join(argv)}\n"
        "supported: --version, runtime configure --runtime=docker\n"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
