"""bertviz's attention views, drawn without internet.

bertviz 1.4.1 loads require.js, d3 and jQuery from cdnjs, so offline (an exam room, a locked-down
lab, CI) its views stay blank. `head_view` and `model_view` here take bertviz's own HTML and
JavaScript and inline the copies of those libraries that the course ships in courselib/static/
(fetched and checked by tools/vendor_js.py), so the browser fetches nothing. The output is a
single HTML cell output that works in JupyterLab, Notebook 7 and nbconvert's HTML export.
"""
import json
import pathlib
from importlib.metadata import version

import bertviz
from IPython.display import HTML, display

STATIC_DIR = pathlib.Path(__file__).resolve().parent / "static"
REQUIRE_JS = STATIC_DIR / "requirejs-2.3.6" / "require.js"
REQUIRE_JS_TAG = '<script src="https://cdnjs.cloudflare.com/ajax/libs/require.js/2.3.6/require.min.js"></script>'
# The modules bertviz's JavaScript asks require.js for: the address it names, and the shipped copy.
MODULES = {
    "d3": ("'https://cdnjs.cloudflare.com/ajax/libs/d3/5.7.0/d3.min'", STATIC_DIR / "d3-5.7.0" / "d3.min.js"),
    "jquery": ("'https://cdnjs.cloudflare.com/ajax/libs/jquery/2.0.0/jquery.min'",
               STATIC_DIR / "jquery-2.2.4" / "jquery.min.js"),
}
# Page-wide registry of blob: URLs, one per module, so that require.js loads each library once.
REGISTRY = "window.courselibBertviz"


def _script(source):
    if "</script" in source.lower():  # would end the <script> element early
        raise ValueError("a script to inline contains '</script'")
    return f"<script>\n{source}\n</script>\n"


def _modules_script():
    """Turn each shipped library into a blob: URL that require.js can load like a file."""
    # JSON strings with "</" escaped as "<\/" (the same string) can never close the <script> element.
    sources = json.dumps({name: path.read_text() for name, (_, path) in MODULES.items()}).replace("</", "<\\/")
    return _script(f"""(function () {{
  var urls = {REGISTRY} = {REGISTRY} || {{}};
  var sources = {sources};
  Object.keys(sources).forEach(function (name) {{
    if (!urls[name]) {{
      urls[name] = URL.createObjectURL(new Blob([sources[name]], {{type: "text/javascript"}}));
    }}
  }});
}})();""")


def offline_html(html):
    """bertviz's HTML (html_action="return") with every CDN address replaced by an inlined copy."""
    addresses = [REQUIRE_JS_TAG] + [cdn for cdn, _ in MODULES.values()]
    missing = [address for address in addresses if address not in html]
    if missing:
        raise RuntimeError(f"bertviz {version('bertviz')} no longer names {missing}: "
                           "courselib.visualize was written for bertviz 1.4.1; update MODULES and "
                           "tools/vendor_js.py to what this version loads.")
    # require.js skips its own setup if the page already has it, so inlining it every time is safe.
    html = html.replace(REQUIRE_JS_TAG, _script(REQUIRE_JS.read_text()) + _modules_script())
    for name, (cdn, _) in MODULES.items():
        html = html.replace(cdn, f"{REGISTRY}.{name}")
    return html


def _view(draw, args, kwargs):
    html_action = kwargs.pop("html_action", "view")
    if html_action not in ("view", "return"):
        raise ValueError("html_action must be 'view' or 'return'")
    page = HTML(offline_html(draw(*args, html_action="return", **kwargs).data))
    if html_action == "return":
        return page
    display(page)


def head_view(*args, **kwargs):
    """bertviz.head_view (same arguments), with its JavaScript libraries inlined: works offline."""
    return _view(bertviz.head_view, args, kwargs)


def model_view(*args, **kwargs):
    """bertviz.model_view (same arguments), with its JavaScript libraries inlined: works offline."""
    return _view(bertviz.model_view, args, kwargs)
