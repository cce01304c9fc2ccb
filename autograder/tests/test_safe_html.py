"""A graded notebook runs none of the student's script in the browsers that render it (autograder/safe_html.py).

The attack: a hand-in whose outputs and cells carry script in every form nbconvert renders (HTML and
markdown outputs, JavaScript, SVG, an iframe's srcdoc, an image's width written into an unquoted
attribute, a markdown cell of the student's, a course cell edited, a raw HTML cell, widget state). Its
target is the instructor's formgrader page, served by the instructor's own Jupyter server: script there
acts with the instructor's session. Each page is loaded in Chromium with the network blocked, and what
ran is read back from the page. The same pages rendered from the notebook as it was (the control) do
run the attack: that is what shows the check can fail.
"""
import copy
import os

import nbformat
import pytest
from nbconvert.exporters import HTMLExporter
from nbformat.v4 import new_code_cell, new_markdown_cell, new_output, new_raw_cell

from autograder import classroom
from autograder.config import nbgrader_config
from autograder.feedback import FeedbackHTMLExporter
from autograder.safe_html import course_cell_sources, make_safe
from autograder.submissions import student_notebook

pytestmark = pytest.mark.xdist_group("test_safe_html")  # one Chromium for the module

ASSIGNMENT = "04_self_attention"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
RAN = "window.__ran = (window.__ran || []).concat"  # what each payload does: it names itself


def ran(label):
    return f"{RAN}(['{label}'])"


def hostile_outputs():
    """What a student's code can display, each carrying script."""
    return [
        new_output("display_data", data={"text/plain": "html", "text/html": (
            f'<b>bold</b><script>{ran("html script")}</script><img src=x onerror="{ran("html onerror")}">'
            f'<a href="javascript:{ran("html link")}">link</a>'
            f'<iframe srcdoc="<script>parent.__ran = [\'iframe\']</script>"></iframe>')}),
        new_output("display_data", data={"text/plain": "js", "application/javascript": ran("javascript")}),
        new_output("display_data", data={"text/plain": "svg", "image/svg+xml": (
            f'<svg xmlns="http://www.w3.org/2000/svg" onload="{ran("svg onload")}"><script>{ran("svg script")}'
            '</script></svg>')}),
        new_output("display_data", data={"text/plain": "md", "text/markdown": f'<img src=x onerror="{ran("md output")}">'}),
        new_output("display_data", data={"text/plain": "png", "image/png": "AAAA"},
                   metadata={"image/png": {"width": f"1 onerror={ran('png width')}"}}),
    ]


def hostile(nb):
    """`nb` with the attack: an edited course cell, cells of the student's own, and hostile outputs."""
    nb = nbformat.from_dict(nb)
    first_markdown = next(c for c in nb.cells if c.cell_type == "markdown")
    first_markdown.source += f'\n<img src=x onerror="{ran("edited course cell")}">'
    nb.cells.append(new_markdown_cell(f'<img src=x onerror="{ran("own markdown")}">\n\n'
                                      f'[a link](javascript:{ran("markdown link")})'))
    raw = new_raw_cell(f'<img src=x onerror="{ran("raw cell")}">')
    raw.metadata["raw_mimetype"] = "text/html"
    nb.cells.append(raw)
    nb.cells.append(new_code_cell("print('hello')", outputs=hostile_outputs()))
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {
        "state": {}, "version_major": 2, "version_minor": 0,
        "note": f"</script><script>{ran('widget state')}</script>"}}
    return nb


def formgrade_page(nb, config):
    """The page formgrader's submission view writes for `nb` (its exporter, as formgrader builds it)."""
    from nbgrader.server_extensions.formgrader import handlers
    config = copy.deepcopy(config)
    config.HTMLExporter.template_name = "formgrade"             # FormgradeExtension.build_extra_config
    config.HTMLExporter.extra_template_basedirs = [handlers.template_path]
    resources = {"assignment_id": ASSIGNMENT, "notebook_id": ASSIGNMENT, "submission_id": "s", "index": 0,
                 "total": 1, "base_url": "", "student": "mallory", "last_name": "", "first_name": "",
                 "notebook_path": "p"}
    return HTMLExporter(config=config).from_notebook_node(nb, resources=resources)[0]


def feedback_page(nb, config):
    return FeedbackHTMLExporter(config=config).from_notebook_node(nb)[0]


@pytest.fixture(scope="module")
def page():
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM} (`make test` installs it; else set CHROMIUM)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                       else route.abort())
            yield page
        finally:
            browser.close()


def what_runs(page, html, path):
    """What the page ran (the payloads' labels), and what in it could still run on a click or a hover."""
    path.write_text(html)
    page.goto(path.as_uri())
    page.wait_for_timeout(500)
    return page.evaluate("""() => ({
        ran: window.__ran || [],
        handlers: [...document.querySelectorAll('*')].flatMap(e => [...e.attributes].map(a => a.name))
                      .filter(name => name.startsWith('on')),
        javascript_links: [...document.querySelectorAll('[href], [src]')]
                      .map(e => e.getAttribute('href') || e.getAttribute('src'))
                      .filter(url => url.trim().toLowerCase().startsWith('javascript:')),
        frames: document.querySelectorAll('iframe, object, embed').length,
        scripts: document.scripts.length,
        details: document.querySelectorAll('details').length,
        shown_as_text: [...document.querySelectorAll('pre, code')].some(e => e.textContent.includes('own markdown')),
    })""")


@pytest.mark.parametrize("render", [formgrade_page, feedback_page])
def test_the_pages_run_a_hostile_notebook_as_it_is(render, page, tmp_path):
    """The control: without make_safe, the attack runs in the page (so the check below can see it)."""
    nb = hostile(student_notebook(ASSIGNMENT))
    found = what_runs(page, render(nb, nbgrader_config(root=tmp_path, work=tmp_path)), tmp_path / "page.html")
    assert found["ran"], f"{render.__name__}: the attack did not run even unprotected, so this test cannot see it: {found}"


@pytest.mark.parametrize("render", [formgrade_page, feedback_page])
def test_nothing_of_a_hostile_notebook_runs_once_made_safe(render, page, tmp_path):
    """make_safe: nothing runs, nothing waits for a click; the course's own cells render as written (the
    hints' <details>), and the student's own markdown is shown as text."""
    config = nbgrader_config(root=tmp_path, work=tmp_path)
    benign = what_runs(page, render(student_notebook(ASSIGNMENT), config), tmp_path / "benign.html")
    nb = make_safe(hostile(student_notebook(ASSIGNMENT)), course_cell_sources(ASSIGNMENT))
    found = what_runs(page, render(nb, config), tmp_path / "page.html")
    assert found["ran"] == [], f"{render.__name__}: the student's script ran in the page: {found['ran']}"
    assert found["handlers"] == benign["handlers"] and found["javascript_links"] == benign["javascript_links"], (
        f"{render.__name__}: the student's script waits in the page for a click or a hover: {found}, "
        f"while the course's own page has {benign}")
    assert found["frames"] == 0, f"{render.__name__}: a frame of the student's is in the page"
    assert found["scripts"] == benign["scripts"], (
        f"{render.__name__}: {found['scripts'] - benign['scripts']} script elements more than the course's own page")
    assert found["details"] == benign["details"] > 0, "the course's hints no longer render as collapsible blocks"
    assert found["shown_as_text"], "the student's own markdown cell should be shown, as text"


def test_a_hostile_hand_in_graded_in_a_class_leaves_nothing_to_run(page, tmp_path):
    """Through class grading: the hand-in prints the attack from its own code while it is graded. It keeps
    its points and gets its feedback page (malformed widget state in its metadata used to stop that), and
    neither that page nor formgrader's page of its autograded notebook runs any of it."""
    nb = hostile(student_notebook(ASSIGNMENT))
    nb.cells[-1] = new_code_cell("from IPython.display import display\n" + "\n".join(
        f"display({dict(output.data)!r}, raw=True, metadata={dict(output.get('metadata', {}))!r})"
        for output in hostile_outputs()))
    folder = tmp_path / "hand-ins" / "submitted" / "mallory" / ASSIGNMENT
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / f"{ASSIGNMENT}.ipynb")
    root = tmp_path / "course"
    classroom.grade_class(tmp_path / "hand-ins", root, cell_timeout=30, quiet=True)
    entry = classroom.Ledger(root / classroom.LEDGER).entries[("mallory", ASSIGNMENT)]
    assert entry["score"] == entry["max_score"] and not entry["errors"], f"the reference answers lost points: {entry}"
    graded = nbformat.read(root / "autograded" / "mallory" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    feedback = root / "feedback" / "mallory" / ASSIGNMENT / f"{ASSIGNMENT}.html"
    assert feedback.exists(), "the hand-in got no feedback page"
    config = classroom.class_config(root)
    for render, html in ((feedback_page, feedback.read_text()), (formgrade_page, formgrade_page(graded, config))):
        benign = what_runs(page, render(student_notebook(ASSIGNMENT), config), tmp_path / "benign.html")
        found = what_runs(page, html, tmp_path / "page.html")
        assert found["ran"] == [] and found["frames"] == 0 and found["handlers"] == benign["handlers"] \
            and found["javascript_links"] == benign["javascript_links"], (
                f"the {render.__name__} of a graded hand-in holds the student's script: {found}")


@pytest.mark.parametrize("html, cleaned", [
    ('<p onclick="x()">text</p><script>x()</script>', "<p>text</p>x()"),
    ("<a href='javascript:1'>a</a>", "<a>a</a>"),            # bleach's own protocol check lets this one by
    ("<A HREF=' JaVaScRiPt:x()'>a</A>", "<a>a</a>"),
    ("<a href='\x01javascript:x()'>a</a>", "<a>a</a>"),
    ("<a href='https://example.org/?q=1' title='t' style='position:fixed'>a</a>",
     '<a href="https://example.org/?q=1" title="t">a</a>'),
    ("<table><tr><td colspan='2 onmouseover=x()' rowspan=2 class=c>t</td></tr></table>",
     '<table><tbody><tr><td rowspan="2" class="c">t</td></tr></tbody></table>'),
    ("<iframe srcdoc='<script>x()</script>'></iframe><img src=x onerror=x()><svg onload=x()></svg>", ""),
])
def test_html_outputs_keep_only_the_allowlist(html, cleaned):
    """Text, tables, lists and links to http(s), mailto and anchors; no handler, style, frame or image."""
    from autograder.safe_html import clean_html
    assert clean_html(html) == cleaned, f"{html!r} was cleaned to {clean_html(html)!r}, not {cleaned!r}"
