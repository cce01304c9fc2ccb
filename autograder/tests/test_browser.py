"""The course as learners meet it: JupyterLab in a real browser, with no network.

Starts JupyterLab on a temporary copy of course/ (the course's nbgrader configuration,
HF_HUB_OFFLINE=1) and drives Debian's Chromium with Playwright, the way a learner clicks:
- 04_self_attention, filled in with the reference answers: Run All, no error outputs, heatmaps drawn;
- nbgrader's Validate button: success for the filled notebook, failure for the untouched release;
- 08_bert_fill_mask, filled in: Run All, and bertviz's head and model views draw their SVG with
  every request outside the lab server blocked.
Screenshots of each step, the server's log and timings.json go to test-artifacts/browser/.
"""
import contextlib
import html.parser
import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import nbformat
import pytest

from autograder.config import REPO_ROOT, SOLUTIONS_DIR
from autograder.submissions import student_notebook

ARTIFACTS = REPO_ROOT / "test-artifacts" / "browser"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Without the background-networking flags Chromium keeps trying to reach Google, which a closed
# network refuses; --no-sandbox because CI runs as root.
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SERVER_START_TIMEOUT_S = 60
# a time-out, not a speed test: 08 pre-trains its small BERT for 3000 steps (about 100 s of CPU alone), and
# the suite's other workers share the two cores
RUN_ALL_TIMEOUT_MS = 360_000
VALIDATE_TIMEOUT_MS = 120_000
UI_TIMEOUT_MS = 30_000
BERTVIZ_TOKENS = ["cat", "sat", "tired"]  # from the sentence notebook 08 shows to bertviz

# The nbgrader configuration JupyterLab's server reads from its working folder: the course's own,
# with the release and nbgrader's working folders in the temporary copy.
NBGRADER_CONFIG = f"""\
import pathlib

from autograder.config import nbgrader_config

here = pathlib.Path(__file__).resolve().parent
c = get_config()  # noqa: F821 (provided by traitlets)
c.merge(nbgrader_config(root=here, source=pathlib.Path({str(SOLUTIONS_DIR)!r}),
                        release=here / "course", work=here / "work"))
"""
# No "official Jupyter news?" toast over the notebook, and no request to jupyter.org.
LAB_SETTINGS = {"@jupyterlab/apputils-extension/notification.jupyterlab-settings":
                {"fetchNews": "false", "checkForUpdates": False}}


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def descendants(pid):
    """Process ids that `pid` started, their children included (read from Linux's /proc; else none)."""
    children = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # "pid (name) state ppid ..."
            children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class LabServer:
    """`jupyter lab` on a temporary copy of the course, stopped by its own process id."""

    def __init__(self, root):
        self.created = time.perf_counter()  # the browser test's clock starts here, before the course is copied
        self.root = root
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = ARTIFACTS / "jupyter-server.log"
        self.process = None
        self.launched = None

    def start(self):
        (self.root / "nbgrader_config.py").write_text(NBGRADER_CONFIG)
        for name, settings in LAB_SETTINGS.items():
            path = self.root / "lab-settings" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(settings))
        # A learner's own Jupyter configuration and kernels stay out of the test.
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "JUPYTER_CONFIG_DIR": str(self.root / "jupyter-config"),
               "JUPYTER_DATA_DIR": str(self.root / "jupyter-data"),
               "JUPYTER_RUNTIME_DIR": str(self.root / "jupyter-runtime"), "IPYTHONDIR": str(self.root / "ipython")}
        # this environment's jupyter; --allow-root because CI runs as root
        command = [str(pathlib.Path(sys.executable).parent / "jupyter"), "lab", "--no-browser", "--allow-root",
                   "--ip=127.0.0.1", f"--port={self.port}", "--ServerApp.port_retries=0",
                   f"--ServerApp.token={self.token}", f"--ServerApp.root_dir={self.root / 'course'}",
                   f"--LabApp.user_settings_dir={self.root / 'lab-settings'}",
                   f"--LabApp.workspaces_dir={self.root / 'lab-workspaces'}"]
        self.log = open(self.log_path, "w")
        # the server's working folder holds nbgrader_config.py, which the Validate button reads
        self.launched = time.perf_counter()  # `make lab` would start here
        self.process = subprocess.Popen(command, cwd=self.root, env=env, stdout=self.log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def wait_until_ready(self):
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"jupyter lab exited with code {self.process.returncode} before answering; "
                            f"its log:\n{self.log_path.read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.base_url}/api/status?token={self.token}", timeout=2) as reply:
                    if reply.status == 200:
                        return
            time.sleep(0.2)
        pytest.fail(f"jupyter lab did not answer on {self.base_url} within {SERVER_START_TIMEOUT_S} s; "
                    f"its log:\n{self.log_path.read_text()[-3000:]}")

    def stop(self):
        """SIGTERM lets the server shut its kernels down; whatever it started and left is killed by pid."""
        if self.process is None:
            return
        started = descendants(self.process.pid)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)  # its own process group (start_new_session)
                self.process.wait(timeout=10)
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.log.close()


@pytest.fixture
def lab(tmp_path):
    """A running JupyterLab on a copy of course/, with notebooks 04 and 08 filled in like a learner's."""
    if ARTIFACTS.exists():
        shutil.rmtree(ARTIFACTS)
    ARTIFACTS.mkdir(parents=True)
    server = LabServer(tmp_path)
    shutil.copytree(REPO_ROOT / "course", tmp_path / "course")
    folder = tmp_path / "course" / "04_self_attention"
    shutil.copy(folder / "04_self_attention.ipynb", folder / "04_self_attention_untouched.ipynb")
    for assignment_id in ("04_self_attention", "08_bert_fill_mask"):
        filled = tmp_path / "course" / assignment_id / f"{assignment_id}.ipynb"
        nbformat.write(student_notebook(assignment_id), filled)
    try:
        server.start()
        yield server
    finally:
        server.stop()


class Browser:
    """One Chromium page on the lab, with the steps a learner takes, screenshots and timings."""

    def __init__(self, page, lab):
        self.page = page
        self.lab = lab
        self.shots = 0
        self.timings = {}
        self.blocked = []       # requests for anything but the lab server: aborted, and listed here
        self.page_errors = []   # uncaught JavaScript errors on the page

    @property
    def notebook(self):
        return self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")

    def show(self, locator):
        """Scroll `locator` into view, and let the browser paint the cells it skipped while they were
        off screen (JupyterLab draws notebooks with CSS content-visibility)."""
        locator.scroll_into_view_if_needed()
        self.page.evaluate("() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")
        self.page.wait_for_timeout(200)

    def screenshot(self, name, whole=None):
        """The page as a learner sees it; with `whole`, a window tall enough to show all of that element."""
        self.shots += 1
        path = ARTIFACTS / f"{self.shots:02d}-{name}.png"
        window = self.page.viewport_size
        if whole is not None:
            height = whole.bounding_box()["height"]
            tall = max(window["height"], int(height) + 200)
            self.page.set_viewport_size({"width": window["width"], "height": tall})
            self.show(whole)
        try:
            self.page.screenshot(path=path)
        finally:
            self.page.set_viewport_size(window)
        return path

    @contextlib.contextmanager
    def step(self, name, timing=None):
        """Time a step; if it fails, save a screenshot and say which step failed."""
        start = time.perf_counter()
        try:
            yield
        except Exception as error:
            with contextlib.suppress(Exception):
                self.screenshot(f"FAILED-{name}")
            raise AssertionError(f"browser step '{name}' failed: {error}") from error
        if timing:
            self.timings[timing] = round(time.perf_counter() - start, 2)

    def open_notebook(self, folder, name):
        files = self.page.locator("#filebrowser")
        files.locator(".jp-BreadCrumbs-home").click()
        files.locator(".jp-DirListing-itemText", has_text=re.compile(f"^{re.escape(folder)}$")).dblclick()
        files.locator(".jp-DirListing-itemText", has_text=re.compile(f"^{re.escape(name)}$")).dblclick()
        self.page.locator(".lm-TabBar-tab.lm-mod-current", has_text=name).wait_for()
        # Run All before the kernel is up would ask which kernel to start: wait for the status bar's
        # "<kernel> | Idle" (it says "No Kernel | Initializing" until then)
        self.page.wait_for_function("""() => [...document.querySelectorAll('#jp-main-statusbar .jp-StatusBar-Item')]
            .some(item => /^(?!No Kernel).+\\|\\s*Idle$/.test(item.textContent.trim()))""",
                                    timeout=60_000, polling=100)

    def close_notebook(self):
        self.page.locator(".lm-MenuBar-item", has_text="File").click()
        self.page.locator(".lm-Menu-item:visible", has_text=re.compile(r"^Close Tab")).click()

    def run_all(self):
        self.page.locator(".lm-MenuBar-item", has_text="Run").click()
        self.page.locator(".lm-Menu-item:visible", has_text=re.compile(r"^Run All Cells")).click()
        # done when every code cell shows an execution count, [n]:, and the kernel is idle
        self.page.wait_for_function("""() => {
            const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
            const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
            const status = panel.querySelector('.jp-Notebook-ExecutionIndicator');
            return prompts.length > 0 && prompts.every(p => /^\\[\\d+\\]:$/.test(p.textContent.trim()))
                && status && status.dataset.status === 'idle';
        }""", timeout=RUN_ALL_TIMEOUT_MS, polling=250)

    def save(self, path):
        """Click the toolbar's Save button and return the notebook as saved on disk."""
        before = path.stat().st_mtime_ns
        self.notebook.locator("[data-jp-item-name='save'] jp-button").click()
        deadline = time.monotonic() + 20
        while path.stat().st_mtime_ns == before and time.monotonic() < deadline:
            self.page.wait_for_timeout(100)  # not time.sleep: Playwright's events wait while Python sleeps
        assert path.stat().st_mtime_ns != before, f"the Save button did not save {path.name} within 20 s"
        # the server writes the file in place: read it once the tab no longer shows unsaved changes
        self.page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current:not(.jp-mod-dirty)").wait_for()
        return nbformat.read(path, as_version=4)

    def stderr_outputs(self):
        """Text of every error or stderr output the notebook shows (JupyterLab renders both alike)."""
        return self.notebook.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
                                     ).all_inner_texts()

    def validate(self):
        """Click nbgrader's Validate button; return the results dialog (a locator) once it shows."""
        self.notebook.locator("jp-button.validate-button").click()  # nbgrader's toolbar button
        dialog = self.page.locator(".jp-Dialog", has_text="Validation Results")
        dialog.wait_for(timeout=VALIDATE_TIMEOUT_MS)
        return dialog

    def dismiss(self, dialog):
        dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
        dialog.wait_for(state="detached")


def error_outputs(nb):
    return [f"{output.ename}: {output.evalue}" for cell in nb.cells for output in cell.get("outputs", [])
            if output.output_type == "error"]


@pytest.fixture
def browser(lab):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM}. `make test` installs Debian's chromium; elsewhere set "
                    "CHROMIUM=/path/to/chromium (Playwright's own browser download needs the internet).")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            lab.root / "chromium-profile", executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1440, "height": 900})
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(UI_TIMEOUT_MS)
            driver = Browser(page, lab)

            def block(route):
                driver.blocked.append(route.request.url)
                route.abort()
            # the pattern is matched inside the browser driver: the lab's own requests never wait for Python
            context.route(re.compile(f"^(?!{re.escape(lab.base_url)}/)"), block)
            page.on("pageerror", lambda error: driver.page_errors.append(str(error)))
            yield driver
        finally:
            context.close()


def expect_clean_run(browser, course, assignment):
    """The notebook, saved from the browser, has no error outputs, and the page shows no stderr."""
    saved = browser.save(course / assignment / f"{assignment}.ipynb")
    assert not error_outputs(saved), f"{assignment} with the reference answers raised: {error_outputs(saved)}"
    shown = browser.stderr_outputs()
    assert not shown, f"{assignment} shows error or stderr outputs in JupyterLab: {shown}"


def test_course_in_jupyterlab(lab, browser):
    page, course = browser.page, lab.root / "course"
    try:
        with browser.step("lab server starts"):
            lab.wait_until_ready()
        browser.timings["server_ready_s"] = round(time.perf_counter() - lab.launched, 2)
        with browser.step("lab page usable"):
            page.goto(f"{lab.base_url}/lab?token={lab.token}")
            page.locator("#filebrowser .jp-DirListing-item", has_text="04_self_attention").wait_for()
        # from launching `jupyter lab` to a page where a learner can open a notebook
        browser.timings["lab_usable_s"] = round(time.perf_counter() - lab.launched, 2)
        browser.screenshot("lab-ready")

        # 04: a learner's finished notebook runs cleanly and draws its heatmaps
        with browser.step("open 04 (filled)", timing="open_04_s"):
            browser.open_notebook("04_self_attention", "04_self_attention.ipynb")
        browser.screenshot("04-opened")
        with browser.step("run all cells of 04", timing="run_04_s"):
            browser.run_all()
        with browser.step("04 outputs"):
            expect_clean_run(browser, course, "04_self_attention")
            # as many as the notebook has: each cell that calls plot_attention( shows one figure
            drawing = sum("plot_attention(" in cell.source for cell in nbformat.read(
                course / "04_self_attention" / "04_self_attention.ipynb", as_version=4).cells
                if cell.cell_type == "code")
            heatmap_cells = browser.notebook.locator(".jp-CodeCell", has_text="plot_attention(")
            assert drawing >= 2 and heatmap_cells.count() == drawing, (
                f"expected the {drawing} cells of 04 that draw attention heatmaps, found {heatmap_cells.count()}")
            for i in range(heatmap_cells.count()):
                image = heatmap_cells.nth(i).locator(".jp-OutputArea-output img")
                assert image.count() == 1, f"heatmap cell {i + 1} of 04 shows {image.count()} images, expected 1"
                browser.show(image)
                width, height = image.evaluate("img => [img.naturalWidth, img.naturalHeight]")
                assert width > 200 and height > 200, (
                    f"heatmap {i + 1} of 04 did not load: its image is {width}x{height}")
                browser.screenshot(f"04-heatmap-{i + 1}")

        # nbgrader's Validate button: passes the finished notebook, fails the untouched one
        with browser.step("validate 04 (filled)", timing="validate_filled_s"):
            dialog = browser.validate()
            browser.screenshot("04-validate-filled")
            assert dialog.locator(".validation-success").count() == 1, (
                f"Validate should report success for 04 filled in with the reference answers; it said:\n"
                f"{dialog.inner_text()[:2000]}")
            browser.dismiss(dialog)
            browser.close_notebook()
        with browser.step("validate 04 (untouched)", timing="validate_untouched_s"):
            browser.open_notebook("04_self_attention", "04_self_attention_untouched.ipynb")
            dialog = browser.validate()
            browser.screenshot("04-validate-untouched")
            text = dialog.inner_text()
            assert dialog.locator(".validation-failed").count() == 1 and "NotImplementedError" in text, (
                f"Validate should report the untouched release's tests as failing with NotImplementedError; "
                f"it said:\n{text[:2000]}")
            browser.dismiss(dialog)
            browser.close_notebook()

        # 08: bertviz's views render from the libraries the course ships, with the network blocked
        with browser.step("open 08 (filled)", timing="open_08_s"):
            browser.open_notebook("08_bert_fill_mask", "08_bert_fill_mask.ipynb")
        with browser.step("run all cells of 08", timing="run_08_s"):
            browser.run_all()
        with browser.step("08 outputs"):
            expect_clean_run(browser, course, "08_bert_fill_mask")
            loss_curve = browser.notebook.locator(".jp-CodeCell", has_text="LiveLossPlot(").locator(
                ".jp-OutputArea-output img")
            assert loss_curve.count() >= 1, "08's pre-training cell shows no loss curve"
            browser.show(loss_curve.last)
            browser.screenshot("08-loss-curve")
        with browser.step("bertviz views render offline"):
            views = browser.notebook.locator("div[id^='bertviz-']")
            assert views.count() == 2, f"expected bertviz's head view and model view in 08, found {views.count()}"
            for i, name in enumerate(["head-view", "model-view"]):
                view = views.nth(i)
                browser.show(view)
                drawn = view.evaluate("""root => {
                    const svgs = [...root.querySelectorAll('svg')];
                    const box = svgs.length ? svgs[0].getBoundingClientRect() : {width: 0, height: 0};
                    return {svgs: svgs.length,
                            shapes: root.querySelectorAll('svg rect, svg line, svg path').length,
                            texts: [...root.querySelectorAll('svg text')].map(t => t.textContent),
                            width: box.width, height: box.height};
                }""")
                pictured = (drawn["svgs"] >= 1 and drawn["shapes"] > 10
                            and drawn["width"] > 100 and drawn["height"] > 50)
                assert pictured, (
                    f"bertviz's {name} drew no picture: {drawn['svgs']} svg elements, {drawn['shapes']} shapes, "
                    f"{drawn['width']}x{drawn['height']} px. Blocked requests: {browser.blocked}; "
                    f"JavaScript errors: {browser.page_errors}")
                if name == "head-view":
                    missing = [t for t in BERTVIZ_TOKENS if t not in drawn["texts"]]
                    assert not missing, f"bertviz's head view lacks the tokens {missing}: {drawn['texts']}"
                browser.screenshot(f"08-bertviz-{name}", whole=view)
            assert not browser.blocked, f"the page asked for resources outside the lab server: {browser.blocked}"
            assert not browser.page_errors, f"JavaScript errors on the page: {browser.page_errors}"
    finally:
        browser.timings["total_s"] = round(time.perf_counter() - lab.created, 2)  # server stop not included
        (ARTIFACTS / "timings.json").write_text(json.dumps(browser.timings, indent=2) + "\n")
        print("browser timings (s):", json.dumps(browser.timings), file=sys.stderr)


def test_vendored_libraries_match_their_pins():
    result = subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "vendor_js.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, f"courselib/static/ differs from its pins:\n{result.stderr}"


class Addresses(html.parser.HTMLParser):
    """The src and href attributes of an HTML fragment's tags (script contents are not tags)."""

    def __init__(self):
        super().__init__()
        self.found = []

    def handle_starttag(self, tag, attrs):
        self.found += [f"<{tag} {name}={value}>" for name, value in attrs if name in ("src", "href")]


def test_bertviz_views_load_nothing_from_outside_the_page():
    import torch

    from courselib import visualize
    attention = [torch.full((1, 2, 3, 3), 1 / 3) for _ in range(2)]
    for view in (visualize.head_view, visualize.model_view):
        page = view(attention, ["a", "b", "c"], html_action="return").data
        parser = Addresses()
        parser.feed(page)
        assert not parser.found, f"courselib.visualize.{view.__name__} makes the page fetch {parser.found}"
        paths = re.findall(r"paths:\s*{[^}]*}", page)
        assert paths and not any("//" in p for p in paths), (
            f"courselib.visualize.{view.__name__} points require.js at addresses: {paths}")
