"""A class on one machine: system users from the roster, nbgrader's exchange, each role's configuration.

Run as root (it creates users): `python -m autograder.hub setup --roster roster.csv`. Layout of the
hub's folder (default /srv/transformers-course-hub):

    hub.json            the settings below (no secrets), read by the hub and by instructors' nbgrader
    state/       0700   the hub's database, cookie secret, proxy pid, log; passwords.csv (initial
                        passwords to hand out) and created.json (what teardown removes)
    exchange/    0755   nbgrader's exchange; <course id>/ belongs to the first instructor, laid out so
                        that a hand-in belongs to its sender (exchange.py: inbound/<student>/ and
                        feedback/<student>/, each readable by that student and the instructors only)
    config/student/     Jupyter configuration of students' servers: the course and exchange for the
                        Assignments tab; formgrader and create-assignment off (server and lab)
    config/instructor/  instructors' servers: everything of nbgrader on
    transformers-course-hub.service   a systemd unit that runs this hub as a service (README)
Each instructor gets ~/course (nbgrader's course: submissions collected into ~/course/submitted) and
~/grading (`make grade GRADE_DIR=~/grading`: gradebook, autograded notebooks, feedback, grades.csv),
with ~/.jupyter/nbgrader_config.py pointing formgrader at both.
"""
import contextlib
import dataclasses
import grp
import hashlib
import json
import os
import pathlib
import pwd
import secrets
import shutil
import subprocess
import sys

from autograder.config import COURSE_DIR, COURSE_ID, REPO_ROOT, SOLUTIONS_DIR
from autograder.hub import limits, view
from autograder.hub.exchange import EXCHANGE_PLUGINS, course_folders
from autograder.hub.roster import read_roster

DEFAULT_DIR = pathlib.Path("/srv/transformers-course-hub")
# JupyterHub's proxy, which `make hub-env` installs from autograder/hub/package-lock.json
PROXY = REPO_ROOT / ".venv" / "hub-proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
HUB_DIR_ENV = "COURSE_HUB_DIR"
CHECKOUT_ENV = "TRANSFORMERS_COURSE"
FIRST_LOGIN_UID = 1000  # below: system accounts, never adopted from a roster
# What a student's server must not see (view.py covers them): the answers and what reveals them.
STUDENT_HIDDEN = ["solutions", ".git", "autograder/tests", "autograder/demo_class", "autograder/judges",
                  "autograder/work", "test-artifacts"]
# nbgrader's parts that are for instructors only (nbgrader's JupyterHub documentation disables these
# for students: `jupyter labextension disable` and `jupyter server extension disable`).
INSTRUCTOR_ONLY_SERVER = ["nbgrader.server_extensions.formgrader"]
INSTRUCTOR_ONLY_LAB = ["@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
                       "@jupyter/nbgrader:course-list"]
# A classroom's lab asks nobody about Jupyter's news and fetches nothing from jupyter.org.
LAB_DEFAULTS = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}
# Login shells (`su -`, ssh) of the class's users find the course's Python through a file here, one per hub
# (teardown removes its own, never another hub's on the same machine).
PROFILE_FOLDER = pathlib.Path("/etc/profile.d")
LEGACY_PROFILE = PROFILE_FOLDER / "transformers-course.sh"
SERVICE_NAME = "transformers-course-hub"


@dataclasses.dataclass
class Settings:
    dir: str
    ip: str = "127.0.0.1"
    port: int = 8000
    course_id: str = COURSE_ID
    students: list = dataclasses.field(default_factory=list)
    instructors: list = dataclasses.field(default_factory=list)
    student_group: str = "course-students"
    instructor_group: str = "course-instructors"
    offline: bool = True      # HF_HUB_OFFLINE=1 in every server: a classroom needs no network
    views: dict = dataclasses.field(default_factory=dict)
    checkout: str = str(REPO_ROOT)   # the course's checkout (`make -C $TRANSFORMERS_COURSE grade ...`)
    memory_limit: str = "3G"         # per user's server and everything it starts (limits.py)
    cpu_limit: float = 1.0
    pids_limit: int = 1024
    cull_idle_seconds: int = 3600    # a server idle this long is stopped (jupyterhub-idle-culler); 0: never
    activity_interval_seconds: int = 300   # how often servers and the proxy report activity to the hub

    @property
    def limits(self):
        return limits.Limits.parse(self.memory_limit, self.cpu_limit, self.pids_limit)

    @property
    def root(self):
        return pathlib.Path(self.dir)

    @property
    def state(self):
        return self.root / "state"

    @property
    def exchange(self):
        return self.root / "exchange"

    @property
    def owner(self):
        """The instructor who owns the course's exchange folder (nbgrader wants one owner)."""
        return self.instructors[0]

    @property
    def url(self):
        return f"http://{self.ip}:{self.port}"

    def config_dir(self, role):
        return self.root / "config" / role

    def role(self, username):
        return "instructor" if username in self.instructors else "student"

    def save(self):
        path = self.root / "hub.json"
        path.write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")
        path.chmod(0o644)

    @classmethod
    def load(cls, folder=None):
        folder = pathlib.Path(folder or os.environ.get(HUB_DIR_ENV) or DEFAULT_DIR)
        try:
            known = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in json.loads((folder / "hub.json").read_text()).items() if k in known})
        except FileNotFoundError:
            raise SystemExit(f"{folder} holds no hub: run `python -m autograder.hub setup` (or `make hub`) "
                             "first") from None


# -------------------------------------------------------------------------------------------- views
def views(settings):
    """Each role's view of the files (view.py): the course's Python reachable; for students, the
    answers and the hub's state not there at all."""
    cover, keep = view.python_view([sys.base_prefix, sys.prefix])
    hidden = [str(REPO_ROOT / p) for p in STUDENT_HIDDEN if (REPO_ROOT / p).exists()] + [str(settings.state)]
    return {"student": view.View(cover, keep, hidden).to_json(),
            "instructor": view.View(cover, keep, [str(settings.state)]).to_json()}


def as_user(settings, username, argv, **kwargs):
    """Run `argv` as `username`, in their role's view, from their home, with their server's
    environment (the hub's spawner starts servers the same way)."""
    from jupyterhub.spawner import set_user_setuid
    entry = pwd.getpwnam(username)
    env = {**server_environment(settings, username), "HOME": entry.pw_dir, "USER": username,
           "LOGNAME": username, "SHELL": entry.pw_shell or "/bin/bash"}
    return subprocess.run(argv, cwd=entry.pw_dir, env=env, check=False, **kwargs,
                          preexec_fn=view.preexec(settings.views[settings.role(username)],
                                                  set_user_setuid(username)))


def server_environment(settings, username):
    """What every process of `username` on the hub gets, on top of JupyterHub's variables."""
    env = {"PATH": f"{pathlib.Path(sys.prefix) / 'bin'}:/usr/local/bin:/usr/bin:/bin",
           "LANG": os.environ.get("LANG", "C.UTF-8"),
           "JUPYTER_CONFIG_PATH": str(settings.config_dir(settings.role(username))),
           HUB_DIR_ENV: str(settings.root),  # for `python -m autograder.hub` in an instructor's terminal
           CHECKOUT_ENV: settings.checkout,   # make -C $TRANSFORMERS_COURSE grade ...
           "PYTHONDONTWRITEBYTECODE": "1"}  # the course's code is read-only for them
    if settings.offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


# ------------------------------------------------------------------------------------ system users
def _run(argv):
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def user_exists(name):
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def group_exists(name):
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


def ensure_users(settings, members, home_base, created):
    """Groups and users for `members`; a new user gets a random password, returned as
    {username: password} (an existing one keeps theirs)."""
    for group in (settings.student_group, settings.instructor_group):
        if not group_exists(group):
            _run(["groupadd", group])
            created["groups"].append(group)
    passwords = {}
    for member in members:
        group = settings.instructor_group if member.role == "instructor" else settings.student_group
        if user_exists(member.username):
            entry = pwd.getpwnam(member.username)
            if entry.pw_uid < FIRST_LOGIN_UID:
                raise SystemExit(f"{member.username} is a system account (uid {entry.pw_uid}): pick another "
                                 "username in the roster")
            _run(["usermod", "--append", "--groups", group, member.username])
            continue
        home = [] if home_base is None else ["--home-dir", str(pathlib.Path(home_base) / member.username)]
        comment = " ".join(p for p in (member.first_name, member.last_name) if p) or member.username
        _run(["useradd", "--create-home", *home, "--shell", "/bin/bash", "--groups", group,
              "--comment", comment, member.username])
        created["users"].append(member.username)
        pathlib.Path(pwd.getpwnam(member.username).pw_dir).chmod(0o700)  # whatever HOME_MODE says
        passwords[member.username] = secrets.token_urlsafe(9)
        subprocess.run(["chpasswd"], input=f"{member.username}:{passwords[member.username]}\n", text=True,
                       check=True, capture_output=True)
    return passwords


def own_group(username, settings, created):
    """A group that holds `username` alone (the student's feedback folder is readable by it): their private
    group where useradd made one, else one made here."""
    entry = pwd.getpwnam(username)
    primary = grp.getgrgid(entry.pw_gid)
    if primary.gr_name == username and set(primary.gr_mem) <= {username}:
        return primary.gr_name
    name = f"{username[:27]}-self"
    if not group_exists(name):
        _run(["groupadd", name])
        created["groups"].append(name)
    _run(["usermod", "--append", "--groups", name, username])
    return name


def remove(settings_dir):
    """Undo setup: stop what the hub's users still run, delete the users and groups setup created
    (never others), their cgroups, the login-shell profile, and the hub's folder."""
    folder = pathlib.Path(settings_dir)
    created_file = folder / "state" / "created.json"
    created = json.loads(created_file.read_text()) if created_file.exists() else {"users": [], "groups": []}
    uids = set()
    for name in created["users"]:
        with contextlib.suppress(KeyError):
            uids.add(pwd.getpwnam(name).pw_uid)
    kill_processes_of(uids)
    for name in created["users"]:
        if user_exists(name):
            subprocess.run(["userdel", "--remove", name], capture_output=True)
    for name in created["groups"]:
        if group_exists(name):
            subprocess.run(["groupdel", name], capture_output=True)
    for user in created["users"]:
        for parent in limits.parents().values():
            with contextlib.suppress(OSError):
                (parent / user).rmdir()
    profile = created.get("profile")
    if profile:  # its path; `true` from a setup before profiles were one per hub: the one shared file
        with contextlib.suppress(FileNotFoundError):
            (pathlib.Path(profile) if isinstance(profile, str) else LEGACY_PROFILE).unlink()
    shutil.rmtree(folder, ignore_errors=True)


def kill_processes_of(uids):
    """SIGKILL every process whose real uid is in `uids` (the class's users), by process id."""
    import signal
    for status in pathlib.Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            line = next(l for l in status.read_text().splitlines() if l.startswith("Uid:"))
            if int(line.split()[1]) in uids:
                os.kill(int(status.parent.name), signal.SIGKILL)


# ----------------------------------------------------------------------------------------- folders
def write_role_configs(settings):
    """Each role's Jupyter configuration folder (JUPYTER_CONFIG_PATH of its servers)."""
    for role in ("student", "instructor"):
        folder = settings.config_dir(role)
        (folder / "labconfig").mkdir(parents=True, exist_ok=True)
        off = role == "student"
        # terminals: bash, not a login shell, whose /etc/profile would drop the course's Python from PATH
        server = {"ServerApp": {"jpserver_extensions": {name: not off for name in INSTRUCTOR_ONLY_SERVER},
                                "terminado_settings": {"shell_command": ["/bin/bash"]}}}
        (folder / "jupyter_server_config.json").write_text(json.dumps(server, indent=2) + "\n")
        page = {"disabledExtensions": {name: True for name in INSTRUCTOR_ONLY_LAB} if off else {}}
        (folder / "labconfig" / "page_config.json").write_text(json.dumps(page, indent=2) + "\n")
        (folder / "labconfig" / "default_setting_overrides.json").write_text(json.dumps(LAB_DEFAULTS, indent=2) + "\n")
        if off:  # instructors read theirs from ~/.jupyter (instructor_nbgrader_config)
            (folder / "nbgrader_config.py").write_text(
                "# Students' nbgrader (the Assignments tab): the course and its exchange on this hub, whose\n"
                "# plugins hand in as the server's own user (autograder/hub/exchange.py).\n"
                "c = get_config()  # noqa: F821 (provided by traitlets)\n"
                f"c.CourseDirectory.course_id = {settings.course_id!r}\n"
                f"c.Exchange.root = {str(settings.exchange)!r}\n"
                + "".join(f"c.ExchangeFactory.{name} = {cls!r}\n" for name, cls in EXCHANGE_PLUGINS.items()))
        for path in [folder, *folder.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)


def instructor_nbgrader_config(home, hub_dir=None):
    """The nbgrader configuration of an instructor on the hub: sources in solutions/, the release in
    course/, submissions collected into ~/course/submitted, and formgrader on the gradebook that
    `make grade GRADE_DIR=~/grading` writes (its autograded notebooks and feedback too)."""
    from autograder.config import nbgrader_config
    settings = Settings.load(hub_dir)
    home = pathlib.Path(home)
    config = nbgrader_config(root=home / "course", source=SOLUTIONS_DIR, release=COURSE_DIR,
                             work=home / "grading")
    config.CourseDirectory.course_id = settings.course_id
    config.CourseDirectory.submitted_directory = str(home / "course" / "submitted")
    config.Exchange.root = str(settings.exchange)
    for name, cls in EXCHANGE_PLUGINS.items():
        setattr(config.ExchangeFactory, name, cls)
    return config


INSTRUCTOR_CONFIG = """\
# Written by `python -m autograder.hub setup`: this instructor's nbgrader course on the hub
# (autograder/hub/setup.py, instructor_nbgrader_config, says what goes where).
from autograder.hub.setup import instructor_nbgrader_config

c = get_config()  # noqa: F821 (provided by traitlets)
c.merge(instructor_nbgrader_config({home!r}, {hub!r}))
"""


def prepare_instructor(settings, username):
    entry = pwd.getpwnam(username)
    home = pathlib.Path(entry.pw_dir)
    for folder in (home / "course" / "submitted", home / "grading", home / ".jupyter"):
        folder.mkdir(parents=True, exist_ok=True)
    (home / ".jupyter" / "nbgrader_config.py").write_text(INSTRUCTOR_CONFIG.format(home=str(home),
                                                                                  hub=str(settings.root)))
    for path in [home / "course", home / "grading", home / ".jupyter", *(home / "course").rglob("*"),
                 *(home / ".jupyter").rglob("*")]:
        os.chown(path, entry.pw_uid, entry.pw_gid)


def setup(roster_path, folder=DEFAULT_DIR, ip="127.0.0.1", port=8000, assignments=(), home_base=None,
          group_prefix="course", offline=True, **options):
    """Everything `make hub` needs before the hub starts; returns the Settings. Safe to run again
    (a new roster adds users; existing users keep their passwords). Releases `assignments` only (none by
    default: an instructor releases each when its week comes, `python -m autograder.hub release NN`).
    `options`: Settings' limits and culler (memory_limit, cpu_limit, pids_limit, cull_idle_seconds, ...)."""
    if os.geteuid() != 0:
        raise SystemExit("the hub's setup creates system users and starts servers as them: run it as root "
                         "(sudo make hub)")
    for needed in (REPO_ROOT, pathlib.Path(sys.prefix)):
        if pathlib.Path(os.path.realpath(needed)).is_relative_to("/tmp"):
            raise SystemExit(f"{needed} is under /tmp, which every hub user sees as a private, empty /tmp: "
                             "put the course (and its .venv) anywhere else, e.g. /srv or /opt")
    members = read_roster(roster_path)
    root = pathlib.Path(folder).resolve()
    settings = Settings(dir=str(root), ip=ip, port=int(port),
                        students=[m.username for m in members if m.role == "student"],
                        instructors=[m.username for m in members if m.role == "instructor"],
                        student_group=f"{group_prefix}-students", instructor_group=f"{group_prefix}-instructors",
                        offline=offline, **{k: v for k, v in options.items() if v is not None})
    settings.limits  # noqa: B018  (a limit that does not parse fails here, before anything is made)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    settings.state.mkdir(mode=0o700, exist_ok=True)
    settings.state.chmod(0o700)
    settings.exchange.mkdir(exist_ok=True)
    settings.exchange.chmod(0o755)   # only the course's folder in it, made below; nobody else adds anything
    settings.views = views(settings)

    created_file = settings.state / "created.json"
    created = json.loads(created_file.read_text()) if created_file.exists() else {"users": [], "groups": []}
    try:
        passwords = ensure_users(settings, members, home_base, created)
    finally:
        created_file.write_text(json.dumps(created, indent=2) + "\n")
    if passwords:
        path = settings.state / "passwords.csv"
        fresh = not path.exists()
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a") as out:
            if fresh:
                out.write("username,initial_password\n")
            out.writelines(f"{name},{password}\n" for name, password in passwords.items())
    write_role_configs(settings)
    for name in settings.instructors:
        prepare_instructor(settings, name)
    prepare_exchange(settings, created)
    if created.get("profile") is True:  # set up before profiles were one per hub: its file is the shared one
        LEGACY_PROFILE.unlink(missing_ok=True)
    created["profile"] = write_login_profile(settings)
    created_file.write_text(json.dumps(created, indent=2) + "\n")
    write_service_unit(settings)
    settings.save()
    release(settings, assignments, roster_path)
    return settings


def prepare_exchange(settings, created):
    """The course's folder in the exchange, laid out so that a hand-in belongs to its sender (exchange.py):
    inbound/<student>/ (the student's, read by the instructors) and feedback/<student>/ (the owner's, read by
    that student alone). Made again on every setup, so a student added later gets theirs."""
    owner = pwd.getpwnam(settings.owner)
    instructors = grp.getgrnam(settings.instructor_group).gr_gid
    course, inbound, feedback = course_folders(settings.exchange, settings.course_id)
    for folder, mode in ((course, 0o755), (course / "outbound", 0o755), (inbound, 0o711), (feedback, 0o711)):
        folder.mkdir(exist_ok=True)
        os.chown(folder, owner.pw_uid, owner.pw_gid)
        folder.chmod(mode)
    for student in settings.students:
        entry = pwd.getpwnam(student)
        own = grp.getgrnam(own_group(student, settings, created)).gr_gid
        for folder, uid, gid in ((inbound / student, entry.pw_uid, instructors), (feedback / student, owner.pw_uid, own)):
            folder.mkdir(exist_ok=True)
            os.chown(folder, uid, gid)
            folder.chmod(0o2750)


LOGIN_PROFILE = """\
# Written by `python -m autograder.hub setup` (teardown removes it): the class's users find the course's
# Python in login shells (su -, ssh) too. Where it lies under a folder they may not enter, only the hub's
# terminals reach it (they see it through their server's view of the files).
if id -nG 2>/dev/null | tr ' ' '\\n' | grep -qx -e {students} -e {instructors}; then
    export {checkout_env}={checkout}
    export {hub_env}={hub}
    if [ -x {bin}/python ]; then
        PATH={bin}:$PATH
    else
        echo "note: the course's Python ({bin}) is reachable in the hub's terminals only (File > New > Terminal)" >&2
    fi
fi
"""


def login_profile(settings):
    """This hub's file in /etc/profile.d, named after its folder: two hubs on one machine keep one each."""
    key = hashlib.sha256(str(pathlib.Path(settings.root).resolve()).encode()).hexdigest()[:8]
    return PROFILE_FOLDER / f"transformers-course-{key}.sh"


def write_login_profile(settings):
    """This hub's login profile, where the machine has /etc/profile.d; returns its path (None if not written)."""
    if not PROFILE_FOLDER.is_dir():
        return None
    script = login_profile(settings)
    script.write_text(LOGIN_PROFILE.format(
        students=settings.student_group, instructors=settings.instructor_group, checkout_env=CHECKOUT_ENV,
        checkout=settings.checkout, hub_env=HUB_DIR_ENV, hub=settings.root, bin=pathlib.Path(sys.prefix) / "bin"))
    script.chmod(0o644)
    return str(script)


SERVICE_UNIT = """\
# The class's hub as a service that starts at boot and comes back when it stops: copy this file to
# /etc/systemd/system/, then `systemctl daemon-reload && systemctl enable --now {name}`.
# Written by `python -m autograder.hub setup`; its settings are in {hub}/hub.json.
[Unit]
Description=JupyterHub for the course "Transformers from the ground up" ({hub})
After=network.target

[Service]
User=root
WorkingDirectory={checkout}
Environment=PYTHONDONTWRITEBYTECODE=1
ExecStart={python} -m autograder.hub start --dir {hub}
Restart=on-failure
RestartSec=5
KillMode=mixed
TimeoutStopSec=30

[Install]
WantedBy=multi-user.target
"""


def write_service_unit(settings):
    path = settings.root / f"{SERVICE_NAME}.service"
    path.write_text(SERVICE_UNIT.format(name=SERVICE_NAME, hub=settings.root, checkout=settings.checkout,
                                        python=pathlib.Path(sys.prefix) / "bin" / "python"))
    path.chmod(0o644)
    return path


def release(settings, assignments, roster_path=None):
    """Release `assignments` (none: only the roster's students go into the gradebook) into the exchange as
    the course's owner, with nbgrader's own release_assignment."""
    if not assignments and not roster_path:
        return ""
    argv = [sys.executable, "-m", "autograder.hub", "release",
            *(["--roster", str(pathlib.Path(roster_path).resolve())] if roster_path else []), *assignments]
    if roster_path:  # the owner must be able to read it: hand over a copy
        owner = pwd.getpwnam(settings.owner)
        copy = pathlib.Path(owner.pw_dir) / "course" / "roster.csv"
        shutil.copyfile(roster_path, copy)
        os.chown(copy, owner.pw_uid, owner.pw_gid)
        argv[argv.index("--roster") + 1] = str(copy)
    result = as_user(settings, settings.owner, argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"releasing the assignments as {settings.owner} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout
