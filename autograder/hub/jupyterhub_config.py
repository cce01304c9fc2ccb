# JupyterHub's configuration for the course (`make hub`, `python -m autograder.hub start`): everything
# comes from the hub's folder ($COURSE_HUB_DIR/hub.json, written by `python -m autograder.hub setup`).
import os
import pathlib
import sys

from autograder.hub.service import hub_service
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

# Instructors run the class from the hub's admin page (/hub/admin): they see every user and their server's
# activity, and start or stop servers. They never enter a student's server (no access:servers): a student's
# files stay the student's.
c.JupyterHub.load_roles = [
    {"name": "course-instructor", "description": "Instructors: see the class, start and stop its servers",
     "scopes": ["admin-ui", "list:users", "read:users", "read:users:activity", "read:servers", "servers",
                "read:groups", "list:groups"],
     "users": list(settings.instructors)},
    {"name": "idle-culler", "description": "Stops servers nobody has used for a while",
     "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
     "services": ["idle-culler"]},
]
# Idle servers are stopped (jupyterhub-idle-culler, a service of the hub's): a class on one machine cannot
# keep everyone's kernels in memory all week. The servers and the proxy report activity at the same pace.
c.JupyterHub.last_activity_interval = settings.activity_interval_seconds
c.Spawner.environment = {"JUPYTERHUB_ACTIVITY_INTERVAL": str(settings.activity_interval_seconds)}
if settings.cull_idle_seconds:
    c.JupyterHub.services = [{"name": "idle-culler", "command": [
        sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={settings.cull_idle_seconds}",
        f"--cull-every={max(5, min(300, settings.cull_idle_seconds // 4))}"]}]
# The feedback service (autograder/hub/service.py): grades each hand-in as it arrives, for the assignments whose
# feedback an instructor turned on (`python -m autograder.hub feedback-mode`); the hub starts it again if it stops.
c.JupyterHub.services.append(hub_service(settings))
