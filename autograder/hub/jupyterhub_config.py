# JupyterHub's configuration for the course (`make hub`, `python -m autograder.hub start`): everything
# comes from the hub's folder ($COURSE_HUB_DIR/hub.json, written by `python -m autograder.hub setup`).
import os
import pathlib
import sys

from autograder.hub.setup import PROXY, Settings
from autograder.hub.spawner import CourseSpawner

c = get_config()  # noqa: F821 (provided by traitlets)
settings = Settings.load()
state = settings.state

c.JupyterHub.bind_url = f"{settings.url}/"
# the hub's API and the proxy's, on ports `python -m autograder.hub start` found free
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{os.environ['COURSE_HUB_API_PORT']}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ['COURSE_HUB_PROXY_API_PORT']}"
# the proxy `make hub-env` installed from autograder/hub/package-lock.json (nothing fetched here)
c.ConfigurableHTTPProxy.command = [str(PROXY)]
c.ConfigurableHTTPProxy.pid_file = str(state / "proxy.pid")
c.JupyterHub.pid_file = str(state / "jupyterhub.pid")
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")

# Logins: PAM, the system's own passwords of the users the roster created; only the roster may log in.
c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allowed_users = set(settings.students + settings.instructors)
c.PAMAuthenticator.open_sessions = False  # no PAM session stack in containers; nothing here needs one

c.JupyterHub.spawner_class = CourseSpawner
c.Spawner.cmd = [str(pathlib.Path(sys.prefix) / "bin" / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 90
c.Spawner.http_timeout = 90
c.JupyterHub.cleanup_servers = True  # stopping the hub stops every server it started
