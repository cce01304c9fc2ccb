"""`python -m autograder.hub COMMAND`: the class on JupyterHub (see autograder/hub/__init__.py).

As root:        setup, start, up (setup then start: `make hub`), teardown
As instructor:  release, duedate, release-feedback (in a terminal of their server)
Feedback on each hand-in as it arrives (service.py): feedback-service (the hub starts it), feedback-mode and
feedback-queue (instructors)
"""
import argparse
import os
import pathlib
import socket
import sys

from autograder.hub import instructor, limits, service, setup

CONFIG_FILE = pathlib.Path(__file__).resolve().parent / "jupyterhub_config.py"


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(settings):
    """Replace this process by JupyterHub, for the class in `settings` (Ctrl-C stops it and every server)."""
    if not setup.PROXY.exists():
        raise SystemExit(f"JupyterHub's proxy is not installed ({setup.PROXY}): run `make hub-env`")
    passwords = settings.state / "passwords.csv"
    print(f"The class's hub: {settings.url}/ (students {', '.join(settings.students)}; instructors "
          f"{', '.join(settings.instructors)})\nInitial passwords to hand out: {passwords} (root only); "
          "each user can change theirs with `passwd` in a terminal of their server.", flush=True)
    env = {**os.environ, setup.HUB_DIR_ENV: str(settings.root), "COURSE_HUB_API_PORT": str(free_port()),
           "COURSE_HUB_PROXY_API_PORT": str(free_port()), "PYTHONDONTWRITEBYTECODE": "1"}
    os.chdir(settings.state)
    hub = pathlib.Path(sys.prefix) / "bin" / "jupyterhub"
    os.execve(hub, [str(hub), "--config", str(CONFIG_FILE)], env)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m autograder.hub", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name, help_text, hub_folder=True):
        sub = commands.add_parser(name, help=help_text)
        if hub_folder:
            sub.add_argument("--dir", default=os.environ.get(setup.HUB_DIR_ENV) or str(setup.DEFAULT_DIR),
                             help=f"the hub's folder (default: ${setup.HUB_DIR_ENV} or {setup.DEFAULT_DIR})")
        return sub

    for name, help_text in (("setup", "users from the roster, exchange, configuration, release"),
                            ("up", "setup, then start the hub (make hub)")):
        sub = command(name, help_text)
        sub.add_argument("--roster", required=True, help="the class list (CSV: autograder/hub/roster.py)")
        sub.add_argument("--ip", default="127.0.0.1", help="the address students reach (default 127.0.0.1)")
        sub.add_argument("--port", type=int, default=8000)
        sub.add_argument("--home-base", help="make new users' homes here (default: useradd's, /home)")
        sub.add_argument("--group-prefix", default="course", help="groups PREFIX-students, PREFIX-instructors")
        sub.add_argument("--online", action="store_true", help="let servers reach the Hugging Face Hub")
        sub.add_argument("--memory-limit", help="memory of each user's server and all it starts (default 3G)")
        sub.add_argument("--cpu-limit", type=float, help="cores' worth of CPU per user's server (default 1)")
        sub.add_argument("--cull-idle", type=int, dest="cull_idle_seconds",
                         help="stop a server idle this many seconds (default 3600; 0: never)")
        sub.add_argument("--activity-interval", type=int, dest="activity_interval_seconds",
                         help="seconds between the servers' and the proxy's activity reports (default 300)")
        sub.add_argument("assignments", nargs="*",
                         help="assignments to release now (default: none; release each later with `release`)")
    command("start", "start the hub that setup prepared")
    command("teardown", "stop the class's processes; delete the users, groups and folder setup created")
    # an instructor's commands read their nbgrader configuration, as nbgrader's own commands do
    sub = command("release", "(instructor) release assignments into the exchange", hub_folder=False)
    sub.add_argument("--roster", help="also put the roster's students into the gradebook")
    sub.add_argument("--all", action="store_true", help="every assignment of course/")
    sub.add_argument("--force", action="store_true", help="replace a released assignment (after a fix)")
    sub.add_argument("assignments", nargs="*", help="e.g. 04_self_attention")
    sub = command("duedate", "(instructor) set an assignment's due date in the class gradebook", hub_folder=False)
    sub.add_argument("assignment")
    sub.add_argument("when", help="ISO time, e.g. 2026-12-01T17:00+01:00 (no zone: UTC)")
    sub = command("release-feedback", "(instructor) release the feedback `make grade` wrote", hub_folder=False)
    sub.add_argument("assignment")
    service.add_commands(command)
    args = parser.parse_args(argv)

    if args.command in ("setup", "up"):
        settings = setup.setup(args.roster, args.dir, args.ip, args.port, args.assignments, args.home_base,
                               args.group_prefix, offline=not args.online, memory_limit=args.memory_limit,
                               cpu_limit=args.cpu_limit, cull_idle_seconds=args.cull_idle_seconds,
                               activity_interval_seconds=args.activity_interval_seconds)
        print(f"hub folder ready: {settings.root}\n  {limits.describe()} ({settings.memory_limit} memory, "
              f"{settings.cpu_limit:g} CPU); idle servers stopped after "
              f"{settings.cull_idle_seconds or 'never'} s\n  released: {', '.join(args.assignments) or 'nothing yet'} "
              "(an instructor releases the rest, one at a time: `python -m autograder.hub release NN_topic`)\n"
              f"  as a service: {settings.root / (setup.SERVICE_NAME + '.service')} (README)")
        if args.command == "up":
            start(settings)
    elif args.command == "start":
        start(setup.Settings.load(args.dir))
    elif args.command == "teardown":
        setup.remove(args.dir)
    elif args.command == "release":
        if not args.assignments and not args.all and not args.roster:
            parser.error("name the assignments to release (e.g. 04_self_attention), or --all")
        from autograder.config import assignment_ids
        print("\n".join(instructor.release(assignment_ids() if args.all else args.assignments, args.roster,
                                           force=args.force)))
    elif args.command == "duedate":
        print(f"{args.assignment} is due {instructor.set_duedate(args.assignment, args.when)} UTC")
    elif args.command in service.COMMANDS:
        return service.run(args)
    elif args.command == "release-feedback":
        released, missing = instructor.release_feedback(args.assignment)
        for student, (files, late) in released.items():
            print(f"{student}: {', '.join(files)} ({f'handed in {late:.0f} s late' if late else 'on time'})")
        for line in missing:
            print(line, file=sys.stderr)
        print(f"feedback on {args.assignment} released to {len(released)} of {len(released) + len(missing)} "
              "students who handed it in")
        if not released:
            print("nothing was released: " + ("see above" if missing else
                  f"no hand-in of {args.assignment} was collected and graded yet (`nbgrader collect "
                  f"{args.assignment}`, then `make grade`)"), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
