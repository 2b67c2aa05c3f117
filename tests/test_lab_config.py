"""The server configuration and `workbench lab`, without starting a server (fast).

The configuration file is executed the way traitlets executes it (a `get_config()`
returning a Config), so these tests read the values it really sets.
"""

from __future__ import annotations

import argparse
import os
import runpy
import stat
import sys

import pytest
from lab_helpers import SERVER_CONFIG
from traitlets.config import Config

from workbench.errors import LabConfigError
from workbench.server import credentials, floor, guard, lab, origins

GOOD_TOKEN = "Zq3v9XkP2mW8rT5yB7nL4cH6jD1fG0sA-_eRuIoQpKx"  # 43 characters, as token_urlsafe(32) makes


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("JUPYTER_TOKEN", "WORKBENCH_")):
            monkeypatch.delenv(name)
    monkeypatch.setattr(credentials, "_generated_token", None)
    monkeypatch.setattr(credentials, "_resolved", None)
    monkeypatch.setattr(guard, "_url_printed", False)


def load_config(monkeypatch, euid: int = 1000, **env: str) -> Config:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    # Process-wide hooks (a patched ServerApp, a log record factory) are for the server's
    # process; the real-server tests check them. Here they would leak into other tests.
    monkeypatch.setattr(guard, "pin_guard_extension", lambda: None)
    monkeypatch.setattr(guard, "install_log_redaction", lambda secrets=(): None)
    config = Config()
    runpy.run_path(str(SERVER_CONFIG), init_globals={"get_config": lambda: config})
    return config


# --- the configuration file -------------------------------------------------------------


def test_config_sets_the_secure_values(monkeypatch):
    c = load_config(monkeypatch, JUPYTER_TOKEN=GOOD_TOKEN, WORKBENCH_NOTEBOOK_DIR="/srv/work")
    # No open /proxy/<port>, and no language servers started in the notebook folder.
    assert c.ServerApp.jpserver_extensions == {"workbench.server.guard": True, "workbench.server.tensorboard": True,
                                               "jupyter_server_proxy": False, "jupyter_lsp": False}
    assert c.ServerApp.identity_provider_class == "workbench.server.identity.WorkbenchIdentityProvider"
    assert c.IdentityProvider.cookie_options == {"samesite": "Strict"}
    assert c.IdentityProvider.token == GOOD_TOKEN
    assert c.ServerApp.disable_check_xsrf is False
    assert c.ServerApp.allow_origin == "" and c.ServerApp.allow_origin_pat == ""
    assert c.ServerApp.allow_remote_access is False
    assert "localhost" in c.ServerApp.local_hostnames
    assert c.ServerApp.allow_unauthenticated_access is False
    assert c.ServerApp.open_browser is False
    assert c.ServerApp.allow_root is False
    assert c.ServerApp.root_dir == "/srv/work"
    assert c.PasswordIdentityProvider.allow_password_change is False
    assert c.MappingKernelManager.cull_idle_timeout == 3600
    assert c.MappingKernelManager.cull_busy is False
    assert c.LabApp.news_url is None
    assert c.LabApp.extension_manager == "readonly"


def test_config_removes_credentials_from_the_environment(monkeypatch):
    """Kernels and terminals copy the server's environment: the token must not be in it."""
    from jupyter_server.auth import passwd

    hashed = passwd("correct horse battery staple")
    c = load_config(monkeypatch, JUPYTER_TOKEN=GOOD_TOKEN, WORKBENCH_PASSWORD_HASH=hashed)
    assert "JUPYTER_TOKEN" not in os.environ and "WORKBENCH_PASSWORD_HASH" not in os.environ
    again = Config()  # Jupyter may load the file twice: the second load keeps the same token
    runpy.run_path(str(SERVER_CONFIG), init_globals={"get_config": lambda: again})
    assert again.IdentityProvider.token == c.IdentityProvider.token == GOOD_TOKEN


def test_config_generates_a_token_once(monkeypatch):
    first = load_config(monkeypatch).IdentityProvider.token
    second = load_config(monkeypatch).IdentityProvider.token
    assert len(first) >= credentials.MIN_TOKEN_LENGTH
    assert first == second, "loading the config twice in one process must keep one token"


def test_config_with_password_hash_only(monkeypatch):
    from jupyter_server.auth import passwd

    hashed = passwd("correct horse battery staple")
    c = load_config(monkeypatch, WORKBENCH_PASSWORD_HASH=hashed)
    assert c.IdentityProvider.token == ""
    assert c.PasswordIdentityProvider.hashed_password == hashed


def test_config_cull_time_and_hostnames_from_env(monkeypatch):
    c = load_config(monkeypatch, JUPYTER_TOKEN=GOOD_TOKEN, WORKBENCH_CULL_IDLE_S="600",
                    WORKBENCH_LOCAL_HOSTNAMES="gpu-box.lan, lab.internal")
    assert c.MappingKernelManager.cull_idle_timeout == 600
    assert c.TerminalManager.cull_inactive_timeout == 600
    assert {"gpu-box.lan", "lab.internal"} <= set(c.ServerApp.local_hostnames)


@pytest.mark.parametrize(
    ("env", "euid", "expected"),
    [
        ({"JUPYTER_TOKEN": ""}, 1000, "JUPYTER_TOKEN is empty"),
        ({"JUPYTER_TOKEN": "short"}, 1000, "at least 32"),
        ({"JUPYTER_TOKEN": "a" * 32}, 1000, "too predictable"),
        ({"JUPYTER_TOKEN": " " * 32}, 1000, "JUPYTER_TOKEN is empty"),
        ({"JUPYTER_TOKEN": GOOD_TOKEN, "JUPYTER_ALLOW_INSECURE_WRITES": "1"}, 1000, "JUPYTER_ALLOW_INSECURE_WRITES"),
        ({"JUPYTER_TOKEN": GOOD_TOKEN, "JUPYTER_GATEWAY_URL": "http://gw:8888"}, 1000, "remote gateway"),
        ({"WORKBENCH_PASSWORD_HASH": "plaintext"}, 1000, "plain-text password"),
        ({"WORKBENCH_CULL_IDLE_S": "an hour"}, 1000, "WORKBENCH_CULL_IDLE_S"),
        ({"JUPYTER_TOKEN": GOOD_TOKEN}, 0, "would run as root"),
    ],
)
def test_config_refuses_with_system_exit(monkeypatch, env, euid, expected):
    # SystemExit, not an exception: traitlets would log an exception and start anyway.
    with pytest.raises(SystemExit) as info:
        load_config(monkeypatch, euid=euid, **env)
    message = str(info.value)
    assert message.startswith("workbench: the Jupyter server refuses to start: ")
    assert expected in message
    assert "Fix:" in message


def test_config_root_with_explicit_allow(monkeypatch):
    c = load_config(monkeypatch, euid=0, JUPYTER_TOKEN=GOOD_TOKEN, WORKBENCH_ALLOW_ROOT="1")
    assert c.ServerApp.allow_root is True


# --- token resolution ------------------------------------------------------------------


def test_token_file_owner_only(tmp_path):
    path = tmp_path / "token"
    path.write_text(GOOD_TOKEN + "\n")
    path.chmod(0o600)
    choice = credentials.resolve_token({"JUPYTER_TOKEN_FILE": str(path)})
    assert (choice.token, choice.source) == (GOOD_TOKEN, "JUPYTER_TOKEN_FILE")


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o666])
def test_token_file_open_to_others_is_refused(tmp_path, mode):
    path = tmp_path / "token"
    path.write_text(GOOD_TOKEN)
    path.chmod(mode)
    with pytest.raises(LabConfigError, match="chmod 600"):
        credentials.resolve_token({"JUPYTER_TOKEN_FILE": str(path)})


def test_token_file_missing_or_short(tmp_path):
    with pytest.raises(LabConfigError, match="cannot be read"):
        credentials.resolve_token({"JUPYTER_TOKEN_FILE": str(tmp_path / "nope")})
    path = tmp_path / "token"
    path.write_text("abc\n")
    path.chmod(stat.S_IRUSR)
    with pytest.raises(LabConfigError, match="at least 32"):
        credentials.resolve_token({"JUPYTER_TOKEN_FILE": str(path)})


def test_token_file_of_another_user_says_whose_it_must_be(tmp_path, monkeypatch):
    path = tmp_path / "token"
    path.write_text(GOOD_TOKEN)
    path.chmod(0o600)

    def unreadable(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(type(path), "read_text", unreadable)
    with pytest.raises(LabConfigError, match="cannot be read by uid") as info:
        credentials.resolve_token({"JUPYTER_TOKEN_FILE": str(path)})
    assert "chown" in info.value.fix and "chmod 600" in info.value.fix


def test_env_token_wins_over_file_and_generation():
    choice = credentials.resolve_token({"JUPYTER_TOKEN": GOOD_TOKEN, "JUPYTER_TOKEN_FILE": "/nope"})
    assert choice.source == "JUPYTER_TOKEN"
    generated = credentials.resolve_token({})
    assert generated.source == "generated" and generated.token != GOOD_TOKEN


# --- token strength -------------------------------------------------------------------------


@pytest.mark.parametrize("token", ["a" * 32, "ab" * 16, "abcdefgh" * 5, "0" * 64, "\n" + "a" * 40])
def test_predictable_tokens_are_refused(token):
    with pytest.raises(LabConfigError, match="too predictable") as info:
        credentials.resolve_token({"JUPYTER_TOKEN": token})
    assert "secrets.token_urlsafe(32)" in info.value.fix


def test_random_tokens_pass_and_are_stripped():
    import secrets

    for _ in range(200):  # what the documented commands make always passes
        credentials.resolve_token({"JUPYTER_TOKEN": secrets.token_urlsafe(32)})
        credentials.resolve_token({"JUPYTER_TOKEN": secrets.token_hex(32)})
        # 128 random bits as hex (`openssl rand -hex 16`, JupyterHub's API tokens): ~14 of the
        # 16 digits show, which a length x log2(distinct) estimate would call 118 bits.
        credentials.resolve_token({"JUPYTER_TOKEN": secrets.token_hex(16)})
        credentials.resolve_token({"JUPYTER_TOKEN": secrets.token_hex(16).upper()})
    assert credentials.resolve_token({"JUPYTER_TOKEN": f"  {GOOD_TOKEN}\n"}).token == GOOD_TOKEN


# --- origins and headers ----------------------------------------------------------------------


@pytest.mark.parametrize(("origin", "host", "allowed", "ok"), [
    ("http://127.0.0.1:8888", "127.0.0.1:8888", "", True),
    ("http://LOCALHOST:8888", "localhost:8888", "", True),
    ("http://evil.example", "127.0.0.1:8888", "", False),
    ("null", "127.0.0.1:8888", "", False),
    ("http://127.0.0.1:8888.evil.example", "127.0.0.1:8888", "", False),
    ("http://127.0.0.1:8888/", "127.0.0.1:8888", "", False),
    ("file://", "127.0.0.1:8888", "", False),
    ("", "127.0.0.1:8888", "", False),
    ("https://tools.example.org", "127.0.0.1:8888", "https://tools.example.org", True),
    ("https://tools.example.org.evil", "127.0.0.1:8888", "https://tools.example.org", False),
])
def test_origin_allowed(origin, host, allowed, ok):
    assert origins.origin_allowed(origin, host, allowed) is ok


@pytest.mark.parametrize("value", ["*", "null", "https://*.example.org", "https://a.example/", "http://a.example:1/x",
                                   "HTTPS://A.example", "a.example", ".*"])
def test_allow_origin_must_be_one_exact_origin(value):
    with pytest.raises(LabConfigError):
        origins.check_allow_origin(value)


@pytest.mark.parametrize("headers", [
    {"Content-Security-Policy": "frame-ancestors *"},
    {"Content-Security-Policy": "default-src 'self'"},
    {"content-security-policy": "frame-ancestors 'self' https://evil.example"},
    {"Access-Control-Allow-Origin": "*"},
    {"Access-Control-Allow-Credentials": "true"},
])
def test_unsafe_headers_are_refused(headers):
    with pytest.raises(LabConfigError, match="Fix:"):
        floor.check_headers(headers)


def test_safe_headers_pass():
    floor.check_headers({"Content-Security-Policy": "frame-ancestors 'self'; report-uri /x", "X-Extra": "1"})


def test_runtime_dir_must_be_private(tmp_path):
    folder = tmp_path / "runtime"
    folder.mkdir(mode=0o700)
    floor.check_runtime_dir(str(folder))
    folder.chmod(0o755)
    with pytest.raises(LabConfigError, match="chmod 700"):
        floor.check_runtime_dir(str(folder))
    folder.chmod(0o700)
    with pytest.raises(LabConfigError, match="owner"):
        floor.check_runtime_dir(str(folder), euid=os.geteuid() + 1)


def test_redaction(monkeypatch):
    monkeypatch.setattr(guard, "_secrets", {"s3cr3t-token-value-1234567890"})
    line = ('404 GET /api/x?a=1&token=abc123&_xsrf=2|x (127.0.0.1) {"Authorization": "token xyz", '
            '"token": "plain"} Cookie: username-x=sig s3cr3t-token-value-1234567890')
    clean = guard.redact(line)
    for secret in ("abc123", "2|x", "xyz", "plain", "sig", "s3cr3t"):
        assert secret not in clean, clean
    assert "/api/x?a=1&token=[secret]" in clean


# --- the final check of the effective settings -------------------------------------------

SAFE = {
    "token": GOOD_TOKEN, "hashed_password": "", "auth_enabled": True, "disable_check_xsrf": False,
    "xsrf_cookies": True, "allow_origin": "", "allow_origin_pat": "", "allow_remote_access": False,
    "nbconvert_csp_sandbox": True, "euid": 1000,
}


def test_safe_settings_pass():
    floor.check_settings(SAFE)
    floor.check_settings({**SAFE, "token": "", "hashed_password": "argon2:$argon2id$..."})
    floor.check_settings({**SAFE, "allow_origin": "https://tools.example.org"})


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"token": ""}, "authentication is disabled"),
        ({"auth_enabled": False}, "authentication is disabled"),
        ({"token": "x" * 31}, "at least 32"),
        ({"disable_check_xsrf": True}, "XSRF protection is disabled"),
        ({"xsrf_cookies": False}, "XSRF protection is disabled"),
        ({"allow_origin": "*"}, "allow_origin='*'"),
        ({"allow_origin_pat": ".*"}, "allow_origin_pat"),
        ({"allow_remote_access": True}, "Host-header check is off"),
        ({"nbconvert_csp_sandbox": False}, "nbconvert_csp_sandbox"),
        ({"euid": 0}, "would run as root"),
        ({"token": "a" * 40}, "too predictable"),
        ({"token": GOOD_TOKEN + " "}, "whitespace"),
        ({"allow_unauthenticated_access": True}, "allow_unauthenticated_access"),
        ({"allow_password_change": True}, "allow_password_change"),
        ({"identity_provider_ok": False, "identity_provider": "x.Y"}, "the identity provider is x.Y"),
        ({"auth_handlers": ["x.Login", "x.Logout"]}, "login/logout handlers"),
        ({"allow_origin": "null"}, "not one exact origin"),
        ({"tornado_settings": {"log_function": print}}, "tornado_settings sets 'log_function'"),
        ({"headers": {"Access-Control-Allow-Origin": "*"}}, "Access-Control-Allow-Origin"),
        ({"local_hostnames": ["localhost", "evil.example"]}, "local_hostnames adds evil.example"),
        ({"insecure_writes": True}, "JUPYTER_ALLOW_INSECURE_WRITES"),
        ({"gateway_url": "http://gw"}, "remote gateway"),
        ({"websocket_url": "ws://evil.example"}, "websocket_url"),
    ],
)
def test_unsafe_settings_are_refused(change, expected):
    with pytest.raises(LabConfigError, match=expected.replace("*", r"\*")) as info:
        floor.check_settings({**SAFE, **change})
    assert info.value.fix


def test_root_allowed_explicitly(monkeypatch):
    monkeypatch.setenv("WORKBENCH_ALLOW_ROOT", "1")
    floor.check_settings({**SAFE, "euid": 0})


def test_security_floors():
    floor.check_versions({"jupyter_server": "2.21.1", "jupyterlab": "4.6.6", "tornado": "6.6.1"})
    with pytest.raises(LabConfigError, match="jupyter_server 2.20.0 is older than 2.21.0"):
        floor.check_versions({"jupyter_server": "2.20.0", "jupyterlab": "4.6.6"})
    with pytest.raises(LabConfigError, match="jupyterlab 4.6.3"):
        floor.check_versions({"jupyter_server": "2.21.1", "jupyterlab": "4.6.3"})
    floor.check_versions()  # the installed environment meets the floors


def test_pinned_environment_and_pyproject_meet_the_floors():
    from packaging.requirements import Requirement
    from packaging.version import Version

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        pytest.skip("tomllib needs Python 3.11")
    repo = SERVER_CONFIG.parents[3]
    deps = {Requirement(d).name.replace("-", "_").lower(): Requirement(d)
            for d in tomllib.loads((repo / "pyproject.toml").read_text())["project"]["dependencies"]}
    for constraints in ("constraints-cpu.txt", "constraints-gpu.txt"):
        pins = {}
        for line in (repo / "environment" / constraints).read_text().splitlines():
            if "==" in line and not line.startswith("#"):
                name, version = line.split("==")
                pins[name.strip().replace("-", "_").lower()] = version.strip()
        for package, minimum in floor.SECURITY_FLOORS.items():
            assert Version(pins[package]) >= Version(minimum), f"{constraints}: {package}"
    for package in ("jupyter_server", "jupyterlab"):
        assert deps[package].specifier.contains(floor.SECURITY_FLOORS[package])
        below = Version(floor.SECURITY_FLOORS[package]).release
        older = ".".join(map(str, (*below[:-1], below[-1] - 1))) if below[-1] else None
        if older:
            assert not deps[package].specifier.contains(older), f"pyproject allows {package} {older}"


# --- `workbench lab` ---------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["--ServerApp.jpserver_extensions=workbench.server.guard=False"], ["--config=/tmp/x.py"], ["--IdentityProvider.token="],
    ["--ServerApp.token=abc"], ["--ServerApp.tornado_settings={}"], ["--ServerApp.allow_origin=*"],
    ["--ServerApp.disable_check_xsrf=True"], ["--ServerApp.allow_remote_access=True"], ["--allow-root"],
    ["--ServerApp.identity_provider_class=x"], ["--ServerApp.authorizer_class=x"], ["--generate-config"],
    ["--ServerApp.log_level"], ["--ServerApp.log_level", "--ServerApp.token="], ["lab.ipynb"], ["-y"],
    ["--ServerApp.base_url=//evil.example/"], ["--ServerApp.port=0"], ["--ServerApp.browser=@args"],
    ["--ServerApp.root_dir=/x\n--ServerApp.token="], ["--no-browser=1"],
])
def test_extra_options_outside_the_allow_list_are_refused(args):
    with pytest.raises(LabConfigError, match="Fix:"):
        lab.check_server_options(args)


def test_allowed_extra_options_are_passed_in_one_form():
    args = ["--port", "8899", "--ServerApp.base_url=/user/me/", "--log-level=DEBUG", "--no-browser",
            "--ServerApp.iopub_data_rate_limit=1e10", "--notebook-dir", "/data", "--ContentsManager.allow_hidden=True"]
    assert lab.check_server_options(args) == [
        "--port=8899", "--ServerApp.base_url=/user/me/", "--log-level=DEBUG", "--no-browser",
        "--ServerApp.iopub_data_rate_limit=1e10", "--notebook-dir=/data", "--ContentsManager.allow_hidden=True"]


def test_check_options_entry_for_the_image(capsys):
    assert lab.main(["--check-options", "--", "--port", "8899", "--debug"]) == 0
    assert capsys.readouterr().out.splitlines() == ["--port=8899", "--debug"]
    assert lab.main(["--check-options", "--", "--ServerApp.token="]) == 2
    assert "refusing the server options" in capsys.readouterr().err


def test_build_command_as_user(tmp_path):
    command = lab.build_command(8899, "127.0.0.1", tmp_path, ["--ServerApp.log_level=DEBUG"],
                                environ={}, euid=1000, python="/py")
    # -P: the current folder (the default notebook folder) is not on the server's sys.path.
    assert command.argv[:4] == ["/py", "-P", "-m", "jupyterlab"]
    assert f"--config={SERVER_CONFIG}" in command.argv
    assert "--ServerApp.port=8899" in command.argv
    assert f"--ServerApp.root_dir={tmp_path}" in command.argv
    assert "--allow-root" not in command.argv
    assert "WORKBENCH_ALLOW_ROOT" not in command.env
    assert command.argv[-1] == "--ServerApp.log_level=DEBUG"
    assert command.warnings == []


def test_build_command_as_root_warns_and_allows(tmp_path):
    command = lab.build_command(8888, "127.0.0.1", tmp_path, environ={}, euid=0)
    assert "--allow-root" in command.argv
    assert command.env["WORKBENCH_ALLOW_ROOT"] == "1"
    assert any("as root" in warning for warning in command.warnings)


def test_build_command_warns_when_listening_widely(tmp_path):
    command = lab.build_command(8888, "0.0.0.0", tmp_path, environ={}, euid=1000)
    assert any("0.0.0.0" in warning for warning in command.warnings)


def test_build_command_errors(tmp_path):
    with pytest.raises(LabConfigError, match="not a folder"):
        lab.build_command(8888, "127.0.0.1", tmp_path / "missing", environ={}, euid=1000)
    with pytest.raises(LabConfigError, match="not a TCP port"):
        lab.build_command(70000, "127.0.0.1", tmp_path, environ={}, euid=1000)
    with pytest.raises(LabConfigError, match="WORKBENCH_SERVER_CONFIG"):
        lab.build_command(8888, "127.0.0.1", tmp_path,
                          environ={"WORKBENCH_SERVER_CONFIG": str(tmp_path / "none.py")}, euid=1000)


def test_config_found_from_env(tmp_path):
    other = tmp_path / "server_config.py"
    other.write_text("c = get_config()\n")
    assert lab.find_server_config({"WORKBENCH_SERVER_CONFIG": str(other)}) == other
    assert lab.find_server_config({}) == SERVER_CONFIG


def test_cli_maps_options_and_passes_jupyter_args(capsys, tmp_path):
    parser = argparse.ArgumentParser()
    lab.add_arguments(parser)
    args = parser.parse_args(["--port", "9001", "--notebook-dir", str(tmp_path), "--print-command",
                              "--", "--ServerApp.log_level=DEBUG"])
    assert lab.run_cli(args) == 0
    printed = capsys.readouterr().err
    assert "--ServerApp.port=9001" in printed
    assert printed.rstrip().endswith("--ServerApp.log_level=DEBUG")


@pytest.mark.parametrize("version", [(3, 10, 0), sys.version_info])
def test_server_module_runs_without_the_current_folder_on_sys_path(tmp_path, monkeypatch, version):
    """`python -m X` from a folder holding a planted X.py runs the real X (-P, or the 3.10 launcher)."""
    import subprocess

    (tmp_path / "calendar.py").write_text(f"open({str(tmp_path / 'RAN')!r}, 'w')\n")
    monkeypatch.setattr(sys, "version_info", version)
    argv = lab.safe_module_argv(sys.executable, "calendar")
    done = subprocess.run([*argv, "2024"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "2024" in done.stdout, done.stderr
    assert not (tmp_path / "RAN").exists()
