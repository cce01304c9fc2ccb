"""make env's installer (tools/install_pins.py) says to uv what pip's settings say, or leaves the install to pip."""
import importlib.util
import pathlib
import subprocess
import sys

import pytest

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "install_pins.py"
spec = importlib.util.spec_from_file_location("install_pins", TOOL)
install_pins = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install_pins)

# `pip config list` on the course's machine, with an [install] section and a PIP_* variable added
CONFIG_LIST = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/other.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/srv/wheels'
install.index-url='https://mirror.example/simple'
global.index-url='https://pypi.org/simple'
download.index-url='https://not-for-install.example/simple'
"""


def test_a_setting_takes_its_strongest_scope():
    settings = install_pins.effective_settings(CONFIG_LIST)
    assert settings["find-links"] == "/opt/wheels", "a PIP_* variable overrides pip.conf, as in pip"
    assert settings["cert"] == "/etc/ssl/certs/ca-certificates.crt", "a PIP_* variable overrides pip.conf"
    assert settings["index-url"] == "https://mirror.example/simple", \
        "[install] overrides [global] for pip install, and [download] is another command's"


def test_pips_settings_become_uvs():
    (arguments, environment), untranslated = install_pins.uv_arguments(install_pins.effective_settings(CONFIG_LIST))
    assert untranslated is None, f"every setting above has a translation, not {untranslated!r}"
    assert arguments == ["--index-strategy", "unsafe-best-match",
                         "--constraint", "/etc/xdg/pip/constraints.txt",
                         "--extra-index-url", "file:///opt/pypi/simple",
                         "--extra-index-url", "file:///opt/pypi-more/simple",
                         "--find-links", "/opt/wheels",
                         "--index-url", "https://mirror.example/simple"], arguments
    assert environment == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt", "UV_HTTP_TIMEOUT": "180"}, \
        environment


def test_a_setting_uv_would_not_be_told_sends_the_install_to_pip():
    settings = install_pins.effective_settings(CONFIG_LIST + "global.only-binary=':all:'\n")
    translated, untranslated = install_pins.uv_arguments(settings)
    assert translated is None and untranslated == "only-binary", \
        "a setting that changes what is installed must not be dropped on the way to uv"


def install_with(monkeypatch, tmp_path, answer, uv):
    """Run install_pins.main with Python in tmp_path (and a uv beside it when `uv`), every command it
    runs answered by `answer(command)` instead of run; returns the commands, in order."""
    if uv:
        (tmp_path / "uv").write_text("#!/bin/sh\n")
        (tmp_path / "uv").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    commands = []

    def run(command, **kwargs):
        commands.append(command)
        return answer(command)
    monkeypatch.setattr(install_pins.subprocess, "run", run)
    install_pins.main("requirements.txt")
    return commands


@pytest.mark.parametrize("uv_exit", [None, 1, 0])
def test_pip_installs_when_uv_is_missing_or_fails(monkeypatch, tmp_path, uv_exit):
    """None: no uv next to Python; 1: uv ran and failed; 0: uv installed (pip is not run)."""
    def answer(command):
        if command[1:4] == ["-m", "pip", "config"]:
            return subprocess.CompletedProcess(command, 0, stdout=CONFIG_LIST)
        return subprocess.CompletedProcess(command, uv_exit if command[0].endswith("uv") else 0)
    commands = install_with(monkeypatch, tmp_path, answer, uv=uv_exit is not None)
    used = [command[0] if command[0].endswith("uv") else " ".join(command[1:4]) for command in commands]
    expected = {None: ["-m pip install", "-m compileall -q"],
                1: ["-m pip config", str(tmp_path / "uv"), "-m pip install", "-m compileall -q"],
                0: ["-m pip config", str(tmp_path / "uv")]}[uv_exit]
    assert used == expected, f"with uv {uv_exit}: ran {used}"


def test_pip_installs_when_pip_cannot_say_its_settings(monkeypatch, tmp_path, capsys):
    def answer(command):
        failed = command[1:4] == ["-m", "pip", "config"]
        return subprocess.CompletedProcess(command, 1 if failed else 0, stdout="", stderr="broken pip.conf")
    commands = install_with(monkeypatch, tmp_path, answer, uv=True)
    assert not any(command[0].endswith("uv") for command in commands), "uv ran without pip's settings"
    assert any(command[1:4] == ["-m", "pip", "install"] for command in commands), "nothing installed the pins"
    assert "broken pip.conf" in capsys.readouterr().out, "the reason for falling back to pip is not said"
