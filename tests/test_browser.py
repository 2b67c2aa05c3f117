"""JupyterLab in a real browser: the workbench widgets render, and without the token you get the login form.

Headless Chromium from Debian (/usr/bin/chromium, installed by scripts/test.sh) driven
by Playwright's Python API; Playwright never downloads a browser here. Screenshots go
to artifacts/browser/ for a person to look at.

Without Chromium or Playwright the tests skip, except under CI=true, where they fail:
CI must not pass by quietly not looking.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from lab_helpers import REPO, start_lab

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARTIFACTS = REPO / "artifacts" / "browser"
TIMEOUT_MS = 90_000  # 2 shared cores: JupyterLab's first load and a kernel start can be slow

# The notebook a user would write: the pickers and the GPU panel, as in notebooks/.
CELLS = [
    nbformat.v4.new_markdown_cell("# Widget check\nThe workbench widgets, rendered by JupyterLab."),
    nbformat.v4.new_code_cell("import workbench\n\nworkbench.pickers()"),
    nbformat.v4.new_code_cell("panel = workbench.GPUPanel(interval=1.0)\npanel"),
    nbformat.v4.new_code_cell("print('all cells ran')"),
]


def _unavailable(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the browser tests must run; scripts/test.sh installs chromium)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def chromium():
    if not CHROMIUM.exists():
        _unavailable(f"{CHROMIUM} is missing: `apt-get install chromium`")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright (Python) is not installed")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    workspace = tmp / "workspace"
    workspace.mkdir()
    notebook = nbformat.v4.new_notebook(cells=CELLS)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, workspace / "widget_check.ipynb")
    # Throw-away JupyterLab settings (start_lab points JUPYTERLAB_SETTINGS_DIR here): no
    # news-consent toast over the widgets in the screenshots.
    notification = tmp / "lab-settings" / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True)
    (notification / "notification.jupyterlab-settings").write_text(
        '{"fetchNews": "false", "checkForUpdates": false}'
    )
    _tensorboard_run(workspace / "outputs" / "lr-2e-05")
    server = start_lab(tmp, workspace)
    yield server
    server.stop()


def _tensorboard_run(folder: Path) -> None:
    """A run's scalars as the engine writes them (events.jsonl and tensorboard/)."""
    from workbench.engine.events import EventLog

    with EventLog(folder, tensorboard=True) as log:
        log.write("start", total_steps=3, config={})
        for step in (1, 2, 3):
            log.write("train", step=step, loss=1.0 / step, lr=2e-5)
        log.write("eval", step=3, eval_loss=0.4, eval_accuracy=0.875)
        log.write("end", status="completed", step=3, metrics={})


def _screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path


def test_widgets_render_in_jupyterlab(chromium, lab):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page = chromium.new_page(viewport={"width": 1400, "height": 1100})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{lab.url}/lab/tree/widget_check.ipynb?token={lab.token}", timeout=TIMEOUT_MS)
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=TIMEOUT_MS)
        # JupyterLab asks which kernel to start; a person answers with the preferred one.
        select_kernel = page.locator(".jp-Dialog", has_text="Select Kernel")
        try:
            select_kernel.wait_for(timeout=20_000)
            select_kernel.locator("button.jp-mod-accept").click()
        except PlaywrightTimeout:
            pass  # the kernel started without asking
        page.wait_for_selector(
            ".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=TIMEOUT_MS
        )
        # Run > Run All Cells, as a person would.
        page.locator(".lm-MenuBar-item", has_text="Run").first.click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()

        page.wait_for_selector("text=all cells ran", timeout=TIMEOUT_MS)
        outputs = page.locator(".jp-OutputArea-output")
        # The pickers: real widget views (dropdowns, text boxes), with their section titles.
        page.wait_for_selector(".jp-OutputArea-output .widget-dropdown", timeout=TIMEOUT_MS)
        assert outputs.locator(".jupyter-widgets").count() >= 10
        assert outputs.locator(".widget-dropdown").count() >= 2
        for title in ("Model", "Dataset"):
            assert outputs.locator(".widget-html b", has_text=title).count() >= 1, title
        # The GPU panel: its buttons, and its header once the sampler has drawn a snapshot
        # (no GPU here: "No GPU monitoring (sampling): <why>", then CPU and RAM bars).
        page.locator(".widget-button", has_text="Free cached memory").wait_for(timeout=TIMEOUT_MS)
        page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-OutputArea-output .widget-html')]"
            ".some(e => /(GPU panel|No GPU monitoring) \\((sampling|stopped)/.test(e.textContent))",
            timeout=TIMEOUT_MS,
        )
        assert outputs.locator(".widget-button", has_text="Reset peak").count() == 1
        assert outputs.locator(".widget-hprogress").count() >= 2, "CPU and RAM bars"
        text = outputs.all_inner_texts()
        joined = "\n".join(text)
        # Not the text fallback of a widget without its front end, nor a widget error.
        for bad in ("Pickers(", "VBox(", "Dropdown(", "Error displaying widget", "Traceback"):
            assert bad not in joined, f"{bad!r} in the outputs:\n{joined[:2000]}"
        assert page.locator(".jp-RenderedText[data-mime-type='application/vnd.jupyter.stderr']",
                            has_text="Error").count() == 0
        assert not errors, f"JavaScript errors: {errors}"
        # JupyterLab scrolls inside the notebook, so the panel gets its own picture.
        panel = outputs.filter(has=page.locator(".widget-button", has_text="Free cached memory"))
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        panel.first.screenshot(path=str(ARTIFACTS / "gpu_panel.png"))
    finally:
        _screenshot(page, "lab_widgets.png")
        page.close()


def test_without_token_the_login_form_shows(chromium, lab):
    context = chromium.new_context()  # no cookies from the other test
    page = context.new_page()
    try:
        page.goto(f"{lab.url}/lab", timeout=TIMEOUT_MS)
        assert "/login" in page.url
        password = page.locator("input[type='password']")
        password.wait_for(timeout=TIMEOUT_MS)
        assert page.locator(".jp-Notebook").count() == 0
        _screenshot(page, "login_form.png")
        # The token typed into the form lets you in.
        password.fill(lab.token)
        page.locator("button[type='submit'], input[type='submit']").first.click()
        page.wait_for_url("**/lab**", timeout=TIMEOUT_MS)
        page.wait_for_selector("#jp-main-dock-panel", timeout=TIMEOUT_MS)
    finally:
        page.close()
        context.close()


def test_tensorboard_opens_through_the_lab_and_shows_a_runs_scalars(chromium, lab):
    """/tensorboard/ on the lab's own port, with the lab's token: TensorBoard (started on first
    use by server/tensorboard.py) lists the run in outputs/ and draws its scalars."""
    import requests

    info = requests.get(f"{lab.url}/server-proxy/servers-info", params={"token": lab.token}, timeout=30).json()
    assert [p["launcher_entry"]["title"] for p in info["server_processes"]] == ["TensorBoard"]  # the tile
    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{lab.url}/tensorboard/?token={lab.token}#timeseries", timeout=TIMEOUT_MS)
        page.wait_for_selector("text=lr-2e-05", timeout=TIMEOUT_MS)  # the run, found under outputs/
        for tag in ("train/loss", "eval/accuracy"):
            page.wait_for_selector(f"text={tag}", timeout=TIMEOUT_MS)
        # A scalar card draws its line (TensorBoard 2.x: a canvas or SVG chart in each card).
        page.wait_for_selector("card-view canvas, card-view svg path, .line-chart canvas", timeout=TIMEOUT_MS)
        page.wait_for_selector("text=0.875", timeout=TIMEOUT_MS)  # eval/accuracy's value, read from the files
    finally:
        _screenshot(page, "tensorboard.png")
        page.close()
