"""The hub's spawner: one server per user, as that system user, in their role's view of the files and in
their own cgroup (limits.py: memory, CPU and processes)."""
from jupyterhub.spawner import LocalProcessSpawner, set_user_setuid

from autograder.hub import limits, view
from autograder.hub.setup import Settings, server_environment


class CourseSpawner(LocalProcessSpawner):
    """LocalProcessSpawner whose servers start in a private mount namespace (view.py) and the user's cgroup,
    with the role's Jupyter configuration: students get the Assignments tab, instructors formgrader too."""

    @property
    def settings(self):
        return Settings.load()  # read at each start: a roster added by setup needs no restart

    def make_preexec_fn(self, name):
        settings = self.settings
        groups = limits.prepare(name, settings.limits)   # here, in the hub; the child only joins them
        enter = view.preexec(settings.views[settings.role(name)], set_user_setuid(name))

        def preexec():
            limits.join(groups)
            enter()
        return preexec

    def get_env(self):
        env = super().get_env()
        env.update(server_environment(self.settings, self.user.name))
        return env
