"""Install a requirements file into this Python's environment, bytecode included (stdlib only).

`make env` runs it with .venv's Python. It installs with uv when uv is there and every setting pip
would use can be said to uv, because uv finds and unpacks packages in parallel: on this course's
2-core machine 27-36 s for the pins and their bytecode, against 57 s of pip and 25 s of compileall.
Otherwise, or when uv fails, it installs with pip and says why.

uv reads none of pip's configuration (pip.conf, PIP_* variables), so the settings are asked of pip
(`pip config list`) and passed on; a setting that could change what gets installed and has no
translation here sends the install to pip rather than be dropped. uv is told to pick, like pip, the
best version across all indexes (`--index-strategy unsafe-best-match`; uv's default takes the first
index that has the package).
"""
import ast
import os
import shutil
import subprocess
import sys

# pip settings that change nothing about what is installed
HARMLESS = {"disable-pip-version-check", "no-color", "quiet", "verbose", "progress-bar", "no-cache-dir",
            "cache-dir", "root-user-action", "no-input", "retries", "no-python-version-warning"}
# a setting's scopes, the strongest last: pip's [global] section, its [install] section, a PIP_* variable
SCOPES = ("global", "install", ":env:")


def effective_settings(config_list):
    """pip's settings for `pip install` from the lines of `pip config list` ("scope.name='value'")."""
    by_scope = {}
    for line in config_list.splitlines():
        key, _, value = line.partition("=")
        scope, _, name = key.rpartition(".")
        if scope in SCOPES and name:
            by_scope.setdefault(name, {})[scope] = ast.literal_eval(value)
    return {name: next(values[scope] for scope in reversed(SCOPES) if scope in values)
            for name, values in by_scope.items()}


def uv_arguments(settings):
    """(uv's arguments, its extra environment) for pip's `settings`, or None and the setting uv
    would not be told about."""
    arguments, environment = ["--index-strategy", "unsafe-best-match"], {}
    for name, value in sorted(settings.items()):
        words = value.split()
        if name in HARMLESS:
            continue
        if name == "index-url":
            arguments += ["--index-url", value]
        elif name in ("extra-index-url", "find-links", "constraint"):
            for word in words:
                arguments += [f"--{name}", word]
        elif name == "trusted-host":
            for word in words:
                arguments += ["--allow-insecure-host", word]
        elif name == "no-index":
            arguments += ["--no-index"] if value.lower() in ("1", "true", "yes", "on") else []
        elif name == "cert":
            environment["SSL_CERT_FILE"] = value
        elif name in ("timeout", "default-timeout"):
            environment["UV_HTTP_TIMEOUT"] = value
        elif name == "proxy":
            environment.update(HTTP_PROXY=value, HTTPS_PROXY=value)
        else:
            return None, name
    return (arguments, environment), None


def install_with_uv(requirements, uv):
    config = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    if config.returncode != 0:
        print(f"install_pins: `pip config list` failed ({config.stderr.strip()}); installing with pip")
        return False
    translated, untranslated = uv_arguments(effective_settings(config.stdout))
    if translated is None:
        print(f"install_pins: pip's setting {untranslated!r} has no uv equivalent here; installing with pip")
        return False
    arguments, environment = translated
    # copies, not hard links into uv's cache: the environment must not change when the cache does
    command = [uv, "pip", "install", "--quiet", "--python", sys.executable, "--compile-bytecode",
               "--link-mode", "copy", *arguments, "-r", requirements]
    if subprocess.run(command, env={**os.environ, **environment}).returncode == 0:
        return True
    print("install_pins: uv failed (above); installing with pip")
    return False


def install_with_pip(requirements):
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--no-compile", "-r", requirements], check=True)
    # The bytecode pip would write, on every core at once (pip compiles one file after another).
    # Grading kernels read the environment from a read-only copy, where Python could not write it.
    # As with pip, a file that does not compile (written for another Python) is skipped.
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", sys.prefix + "/lib"],
                   stdout=subprocess.DEVNULL)


def main(requirements):
    uv = shutil.which("uv", path=os.path.dirname(sys.executable))
    if uv is None:
        print("install_pins: uv is not installed here; installing with pip")
    if uv is None or not install_with_uv(requirements, uv):
        install_with_pip(requirements)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/install_pins.py REQUIREMENTS_FILE")
    main(sys.argv[1])
