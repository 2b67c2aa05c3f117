"""Misconfigurations an attacker (or a hurried user) can try: none of them starts a server.

Three ways in, each a real process:

* ``cli``: `workbench lab -- OPTIONS`; the allow-list refuses before Jupyter is started;
* ``jupyter``: JupyterLab started directly with the workbench configuration, as a script or
  a terminal inside the image can: the configuration and the guard extension alone must
  refuse, whatever the command line, the config files and the environment say;
* ``lab``: `workbench lab` with a hostile environment or config folder.

Every case must exit non-zero, say that it refuses and why, and give a fix. The guard-
disabling cases come with an unsafe setting, so a refusal proves the guard still ran.
The server starts run side by side (each costs a few seconds of imports).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from lab_helpers import REPO, WORKBENCH, free_port, isolated_env, jupyter_argv, lab_argv, new_token

from workbench.server import lab

FORKSERVER = Path(__file__).with_name("lab_forkserver.py")

WEAK_TOKENS = {"32_times_a": "a" * 32, "32_spaces": " " * 32, "abab": "ab" * 20, "8_letters_repeated": "abcdefgh" * 5}
REFUSED_OPTION = "is not among the JupyterLab options"


@dataclass
class Case:
    how: str  # "cli" | "jupyter" | "lab"
    args: list[str]
    expect: str  # text the refusal must contain
    env: dict[str, str | None] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # "<config>/name" or "<path>/name" -> content
    mode: int | None = None  # chmod of the runtime folder


DISABLE_GUARD = "--ServerApp.jpserver_extensions=workbench.server.guard=False"
PY_REFUSED = "which is not the workbench configuration"
CSP_ANY = "{'headers': {'Content-Security-Policy': \"frame-ancestors *\"}}"
CASES: dict[str, Case] = {
    # --- `workbench lab -- ...`: the allow-list -------------------------------------------------
    "cli_disable_guard_and_token": Case("cli", [DISABLE_GUARD, "--IdentityProvider.token="], REFUSED_OPTION),
    "cli_other_config_file": Case("cli", ["--config=/tmp/evil_config.py"], REFUSED_OPTION),
    "cli_empty_token": Case("cli", ["--IdentityProvider.token="], REFUSED_OPTION),
    "cli_empty_token_old_spelling": Case("cli", ["--ServerApp.token="], REFUSED_OPTION),
    "cli_password_hash": Case("cli", ["--PasswordIdentityProvider.hashed_password=sha1:00:00"], REFUSED_OPTION),
    "cli_identity_provider": Case(
        "cli", ["--ServerApp.identity_provider_class=jupyter_server.auth.identity.PasswordIdentityProvider"],
        REFUSED_OPTION),
    "cli_authorizer": Case("cli", ["--ServerApp.authorizer_class=jupyter_server.auth.authorizer.AllowAllAuthorizer"],
                           REFUSED_OPTION),
    "cli_allow_origin_star": Case("cli", ["--ServerApp.allow_origin=*"], REFUSED_OPTION),
    "cli_allow_origin_pat": Case("cli", ["--ServerApp.allow_origin_pat=.*"], REFUSED_OPTION),
    "cli_xsrf_off": Case("cli", ["--ServerApp.disable_check_xsrf=True"], REFUSED_OPTION),
    "cli_tornado_settings": Case("cli", ["--ServerApp.tornado_settings={'xsrf_cookies': False}"], REFUSED_OPTION),
    "cli_host_check_off": Case("cli", ["--ServerApp.allow_remote_access=True"], REFUSED_OPTION),
    "cli_local_hostnames": Case("cli", ["--ServerApp.local_hostnames=evil.example"], REFUSED_OPTION),
    "cli_unauthenticated_access": Case("cli", ["--ServerApp.allow_unauthenticated_access=True"], REFUSED_OPTION),
    "cli_allow_root_flag": Case("cli", ["--allow-root"], REFUSED_OPTION),
    "cli_abbreviated_option": Case("cli", ["--ServerApp.tok=x"], REFUSED_OPTION),
    "cli_gateway": Case("cli", ["--gateway-url=http://gateway.example"], REFUSED_OPTION),
    "cli_extension_manager": Case("cli", ["--LabApp.extension_manager=pypi"], REFUSED_OPTION),
    "cli_positional_argument": Case("cli", ["notebook.ipynb"], "is not an option"),
    "cli_value_is_an_option": Case("cli", ["--ServerApp.log_level", "--IdentityProvider.token="], "needs a value"),
    "cli_default_url_offsite": Case("cli", ["--ServerApp.default_url=//evil.example"], "is not a path on this server"),
    "cli_value_from_file": Case("cli", ["--ServerApp.browser", "@/tmp/more_args"], "starts with @"),
    "cli_bad_port": Case("cli", ["--ServerApp.port=99999"], "is not between"),
    # --- JupyterLab started directly with the configuration: the guard ---------------------------
    "jupyter_disable_guard_and_token": Case("jupyter", [DISABLE_GUARD, "--IdentityProvider.token="],
                                            "authentication is disabled"),
    "jupyter_disable_guard_xsrf_off": Case("jupyter", [DISABLE_GUARD, "--ServerApp.disable_check_xsrf=True"],
                                           "XSRF protection is disabled"),
    "jupyter_empty_token_old_spelling": Case("jupyter", ["--ServerApp.token="], "authentication is disabled"),
    "jupyter_weak_token": Case("jupyter", ["--IdentityProvider.token=" + "a" * 40], "too predictable"),
    "jupyter_xsrf_in_tornado_settings": Case("jupyter", ["--ServerApp.tornado_settings={'disable_check_xsrf': True}"],
                                             "XSRF protection is disabled"),
    "jupyter_allow_origin_star": Case("jupyter", ["--ServerApp.allow_origin=*"], "allow_origin='*'"),
    "jupyter_allow_origin_null": Case("jupyter", ["--ServerApp.allow_origin=null"], "is not one exact origin"),
    "jupyter_allow_origin_wildcard_host": Case("jupyter", ["--ServerApp.allow_origin=https://*.example.org"],
                                               "is not one exact origin"),
    "jupyter_allow_origin_with_path": Case("jupyter", ["--ServerApp.allow_origin=https://tools.example.org/"],
                                           "is not one exact origin"),
    "jupyter_allow_origin_pat": Case("jupyter", ["--ServerApp.allow_origin_pat=https://.*"], "allow_origin_pat"),
    "jupyter_host_check_off": Case("jupyter", ["--ServerApp.allow_remote_access=True"], "Host-header check is off"),
    "jupyter_local_hostnames": Case("jupyter", ["--ServerApp.local_hostnames=evil.example"],
                                    "local_hostnames adds evil.example"),
    "jupyter_nbconvert_sandbox_off": Case("jupyter", ["--ServerApp.nbconvert_csp_sandbox=False"],
                                          "nbconvert_csp_sandbox"),
    "jupyter_unauthenticated_access": Case("jupyter", ["--ServerApp.allow_unauthenticated_access=True"],
                                           "allow_unauthenticated_access"),
    "jupyter_password_change": Case("jupyter", ["--PasswordIdentityProvider.allow_password_change=True"],
                                    "allow_password_change"),
    "jupyter_password_change_old_spelling": Case("jupyter", ["--ServerApp.allow_password_change=True"],
                                                 "allow_password_change"),
    "jupyter_identity_provider": Case(
        "jupyter", ["--ServerApp.identity_provider_class=jupyter_server.auth.identity.PasswordIdentityProvider"],
        "the identity provider is jupyter_server.auth.identity.PasswordIdentityProvider"),
    "jupyter_legacy_login_handler": Case(
        "jupyter", ["--ServerApp.login_handler_class=jupyter_server.auth.login.LegacyLoginHandler"],
        "login/logout handlers"),
    "jupyter_login_handler": Case(
        "jupyter", ["--IdentityProvider.login_handler_class=jupyter_server.auth.login.LegacyLoginHandler"],
        "login/logout handlers"),
    "jupyter_csp_frame_ancestors_any": Case("jupyter", [f"--ServerApp.tornado_settings={CSP_ANY}"],
                                            "Content-Security-Policy"),
    "jupyter_csp_without_frame_ancestors": Case(
        "jupyter", ["--ServerApp.tornado_settings={'headers': {'Content-Security-Policy': \"default-src 'self'\"}}"],
        "Content-Security-Policy"),
    "jupyter_cors_header": Case(
        "jupyter", ["--ServerApp.tornado_settings={'headers': {'Access-Control-Allow-Origin': '*'}}"],
        "Access-Control-Allow-Origin"),
    "jupyter_websocket_url_elsewhere": Case("jupyter", ["--ServerApp.websocket_url=ws://evil.example:8888"],
                                            "websocket_url"),
    "jupyter_gateway": Case("jupyter", ["--gateway-url=http://gateway.example:8888"], "remote gateway"),
    # Without config files (JUPYTER_NO_CONFIG) the --config file is still the one loaded.
    "jupyter_no_config_env": Case("jupyter", ["--ServerApp.disable_check_xsrf=True"], "XSRF protection is disabled",
                                  env={"JUPYTER_NO_CONFIG": "1"}),
    # --- config files Jupyter finds on its own ---------------------------------------------------
    # `workbench lab` gives the server a config folder of its own (test_lab_probes.py shows these
    # files are not even read there); a server started directly still finds them, and the guard
    # must refuse. JSON files only set traits: each disables the guard and sets something unsafe
    # the workbench configuration leaves alone. Python files are code: refused as such.
    "user_config_py_disables_guard": Case("jupyter", [], PY_REFUSED, files={
        "<config>/jupyter_config.py": "c.ServerApp.jpserver_extensions = {'workbench.server.guard': False}\n"
                                      f"c.ServerApp.tornado_settings = {CSP_ANY}\n"}),
    "user_config_json_disables_guard": Case("jupyter", [], "nbconvert_csp_sandbox", files={
        "<config>/jupyter_config.json": json.dumps({"ServerApp": {
            "jpserver_extensions": {"workbench.server.guard": False}, "nbconvert_csp_sandbox": False}})}),
    "server_config_d_disables_guard": Case("jupyter", [], "Access-Control-Allow-Origin", files={
        "<config>/jupyter_server_config.d/zz-off.json": json.dumps({"ServerApp": {
            "jpserver_extensions": {"workbench.server.guard": False}}}),
        "<config>/jupyter_config.json": json.dumps({"ServerApp": {
            "tornado_settings": {"headers": {"Access-Control-Allow-Origin": "*"}}}})}),
    "config_path_login_handler": Case("jupyter", [], "login/logout handlers", files={
        "<path>/jupyter_config.json": json.dumps({"IdentityProvider": {
            "login_handler_class": "jupyter_server.auth.login.LegacyLoginHandler"}})}),
    "config_path_py_patches_the_guard": Case("jupyter", ["--ServerApp.disable_check_xsrf=True"], PY_REFUSED, files={
        "<path>/jupyter_lab_config.py": "from workbench.server import floor\n"
                                        "floor.check_settings = lambda settings: None\n"}),
    "user_config_tornado_xsrf_cookies_off": Case("jupyter", [], "XSRF protection is disabled", files={
        "<config>/jupyter_config.json": json.dumps({"ServerApp": {"tornado_settings": {"xsrf_cookies": False}}})}),
    "jupyter_kernel_spec_manager": Case(
        "jupyter", ["--ServerApp.kernel_spec_manager_class=jupyter_client.kernelspec.KernelSpecManager"],
        "the kernel spec manager is jupyter_client.kernelspec.KernelSpecManager"),
    "fixed_cookie_secret": Case("jupyter", ["--ServerApp.cookie_secret=c2VjcmV0c2VjcmV0"], "cookie_secret"),
    # Code that ran before the guard (here a sitecustomize.py on PYTHONPATH) and patched its
    # checks: the guard finds its functions are not the installed ones.
    "patched_guard_code": Case("jupyter", ["--ServerApp.disable_check_xsrf=True"], "not the installed workbench code",
                               env={"PYTHONPATH": "<patching sitecustomize>"}),
    # `python -m jupyterlab` without -P: the current folder is first on the server's import path.
    "started_without_safe_path": Case("jupyter", [], "import path holds the current folder"),
    "relative_pythonpath_entry": Case("jupyter", [], "import path holds the current folder",
                                      env={"PYTHONPATH": "<relative>"}),
    # --- the environment -----------------------------------------------------------------------
    **{f"env_token_{name}": Case("lab", [], "JUPYTER_TOKEN", env={"JUPYTER_TOKEN": token})
       for name, token in WEAK_TOKENS.items()},
    "env_token_short": Case("lab", [], "at least 32 are required", env={"JUPYTER_TOKEN": "s3cret"}),
    "env_token_empty": Case("lab", [], "JUPYTER_TOKEN is empty", env={"JUPYTER_TOKEN": ""}),
    "env_insecure_writes": Case("lab", [], "JUPYTER_ALLOW_INSECURE_WRITES", env={"JUPYTER_ALLOW_INSECURE_WRITES": "1"}),
    "env_unauthenticated_access": Case("lab", [], "allow_unauthenticated_access",
                                       env={"JUPYTER_SERVER_ALLOW_UNAUTHENTICATED_ACCESS": "true"}),
    "env_gateway_url": Case("lab", [], "remote gateway", env={"JUPYTER_GATEWAY_URL": "http://gateway.example:8888"}),
    "env_plain_text_password": Case("lab", [], "plain-text password", env={"WORKBENCH_PASSWORD_HASH": "hunter2"}),
    "token_file_readable_by_others": Case("lab", [], "chmod 600", env={"JUPYTER_TOKEN": None,
                                                                       "JUPYTER_TOKEN_FILE": "<token file 644>"}),
    "token_file_weak": Case("lab", [], "too predictable", env={"JUPYTER_TOKEN": None,
                                                               "JUPYTER_TOKEN_FILE": "<token file weak>"}),
    "runtime_dir_open_to_others": Case("lab", [], "chmod 700", mode=0o755),
    "root_without_explicit_allow": Case("jupyter", ["<as root>"], "would run as root"),
}


# Started the ordinary way (a process of its own) rather than forked from the helper, to
# show both paths refuse alike.
ORDINARY_STARTS = {"env_token_32_times_a", "user_config_json_disables_guard", "jupyter_disable_guard_and_token",
                   "patched_guard_code", "started_without_safe_path", "relative_pythonpath_entry"}  # (sys.path)


def _command(name: str, case: Case, tmp: Path) -> tuple[list[str], dict[str, str]]:
    """The full command line and environment of a case (as a user would type it)."""
    env = isolated_env(tmp, JUPYTER_TOKEN=new_token())
    for key, value in case.env.items():
        if value == "<patching sitecustomize>":
            (tmp / "site").mkdir()
            (tmp / "site" / "sitecustomize.py").write_text(
                "from workbench.server import floor\nfloor.check_settings = lambda settings: None\n")
            value = os.pathsep.join([str(tmp / "site"), str(REPO)])
        elif value == "<relative>":
            value = os.pathsep.join(["", "some/relative/dir", str(REPO)])
        if value in ("<token file 644>", "<token file weak>"):
            path = tmp / "token"
            path.write_text((new_token() if "644" in value else "a" * 40) + "\n")
            path.chmod(0o644 if "644" in value else 0o600)
            value = str(path)
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    for target, content in case.files.items():
        folder = env["JUPYTER_CONFIG_DIR"] if target.startswith("<config>") else str(tmp / "config-path")
        path = Path(folder, target.split("/", 1)[1])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        if target.startswith("<path>"):
            env["JUPYTER_CONFIG_PATH"] = folder
    if case.mode is not None:
        Path(env["JUPYTER_RUNTIME_DIR"]).chmod(case.mode)
    port = free_port()
    if name == "root_without_explicit_allow":
        return jupyter_argv(port), env  # --allow-root, but no WORKBENCH_ALLOW_ROOT=1
    if name == "started_without_safe_path":
        return [arg for arg in jupyter_argv(port) if arg != "-P"], {**env, "WORKBENCH_ALLOW_ROOT": "1"}
    if case.how == "jupyter":
        return jupyter_argv(port, *case.args), {**env, "WORKBENCH_ALLOW_ROOT": "1"}
    return lab_argv(port, tmp, *case.args), env


def _run(argv: list[str], env: dict[str, str], log: Path) -> tuple[int, str]:
    """A start that must fail, as its own process; one that gets as far as listening is stopped."""
    started = time.monotonic()
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        while process.poll() is None and time.monotonic() - started < 90:
            time.sleep(0.2)
            if b"is running at" in log.read_bytes():
                break
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return -1, "the server started instead of refusing:\n" + log.read_text(errors="replace")
    return process.returncode, log.read_text(errors="replace")


def _forked(jobs: dict[str, tuple[list[str], dict[str, str], Path]]) -> dict[str, tuple[int, str]]:
    """Server starts through tests/lab_forkserver.py (Jupyter imported once, one fork per start)."""
    names = sorted(jobs)
    payload = []
    for name in names:
        argv, env, log = jobs[name]
        if argv[0] == WORKBENCH:  # what `workbench lab` would exec, built by its own code
            command = lab.build_command(int(argv[argv.index("--port") + 1]), "127.0.0.1",
                                        argv[argv.index("--notebook-dir") + 1], [], environ=env)
            argv, env = command.argv, command.env
            lab.private_config_dir(env["JUPYTER_CONFIG_DIR"])
        assert argv[1:4] == ["-P", "-m", "jupyterlab"], argv
        payload.append({"argv": argv[4:], "env": env, "log": str(log)})
    # Not run from the checkout: the forkserver's own sys.path holds the checkout (PYTHONPATH), and
    # its children inherit that list; were the checkout also their current folder, the guard
    # would rightly see the current folder on the import path (floor.check_import_path).
    done = subprocess.run([sys.executable, str(FORKSERVER)], input=json.dumps(payload), capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)},
                          cwd=Path(jobs[names[0]][2]).parent)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    outcome = {}
    for name, result in zip(names, results, strict=True):
        text = jobs[name][2].read_text(errors="replace")
        if result["started"]:
            text = "the server started instead of refusing:\n" + text
        outcome[name] = (result["code"], text)
    return outcome


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[int, str]]:
    names = sorted(CASES)
    if os.geteuid() != 0:
        names.remove("root_without_explicit_allow")
    jobs = {}
    for name in names:
        tmp = tmp_path_factory.mktemp(name)
        jobs[name] = (*_command(name, CASES[name], tmp), tmp / "output.log")
    ordinary = [n for n in names if CASES[n].how == "cli" or n in ORDINARY_STARTS]
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(_run, *jobs[name]) for name in ordinary}
        forked = _forked({n: jobs[n] for n in names if n not in futures})
        return {**forked, **{name: future.result() for name, future in futures.items()}}


def test_matrix_is_large_enough():
    assert len(CASES) >= 40
    assert len([c for c in CASES.values() if c.how != "cli"]) >= 30


@pytest.mark.parametrize("name", sorted(CASES))
def test_misconfiguration_does_not_start(name, outcomes):
    if name not in outcomes:
        pytest.skip("needs root: checks that root is refused without WORKBENCH_ALLOW_ROOT=1")
    code, output = outcomes[name]
    case = CASES[name]
    assert code not in (0, -1), output[-3000:]
    assert "Fix:" in output, output[-3000:]
    assert case.expect in output, output[-3000:]
    if case.how == "cli":
        assert "workbench lab: error:" in output and "jupyterlab" not in output.split("error:")[0], output
    else:
        assert "the Jupyter server refuses to start" in output, output[-3000:]
        assert "is running at" not in output, "the server must stop before it listens"
