# Transformers from the ground up. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# the installer make env uses for the pins (tools/install_pins.py), not a dependency of the course
UV_VERSION := 0.13.9
export PYTHONDONTWRITEBYTECODE := 1
JOBS ?= 2
# make test's pytest-xdist workers: three on two cores, measured faster than two (a third worker fills the waits:
# kernels starting, time-outs the suite provokes, the browser) and than four (with three, no core is idle)
TEST_JOBS ?= 3
# make grade SCHEDULER=tcp://host:8786: grade on an existing Dask cluster instead of JOBS local processes
SCHEDULER ?=
NB ?=
SUBMISSIONS ?= autograder/demo_class
# make grade GRADE_DIR=~/grading: the class's course folder (default autograder/work/class)
GRADE_DIR ?=
# make hub: the class list, the hub's folder and its port (README: "The class on JupyterHub")
ROSTER ?= autograder/hub/roster.example.csv
HUB_DIR ?= /srv/transformers-course-hub
HUB_PORT ?= 8000
HUB_ARGS ?=
# make hub RELEASE="04_self_attention": what setup releases now (default nothing: `python -m autograder.hub
# release NN_topic` in an instructor's terminal releases each assignment when its week comes)
RELEASE ?=
# make lab LAB_ARGS="--no-browser --port=8890": passed on to jupyter lab
LAB_ARGS ?=
HUB_PROXY := $(VENV)/hub-proxy/node_modules/.bin/configurable-http-proxy

.PHONY: help env hub-env lab hub hub-teardown test release check grade grade-benchmark clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 12

env: $(STAMP)  ## create .venv with the exact pins from environment.yml

# The browser test (autograder/tests/test_browser.py) drives Debian's Chromium, because Playwright's
# own browser download needs the internet. Installed only when missing; CI runs as root.
CHROMIUM ?= /usr/bin/chromium
$(CHROMIUM):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium \
	  || { echo "the browser test needs Chromium at $@: install it, or set CHROMIUM=/path/to/chromium"; exit 1; }

$(STAMP): environment.yml pyproject.toml tools/pins.py tools/install_pins.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PYTHON) tools/pins.py > $(VENV)/requirements.txt
	@# uv installs the pins and their bytecode on every core (27-36 s against pip's 82 s on two cores), with the
	@# settings pip has on this machine; tools/install_pins.py falls back to pip when uv cannot do it
	$(BIN)/pip install -qq --disable-pip-version-check uv==$(UV_VERSION) || echo "uv not installed: pip will install the pins"
	$(BIN)/python tools/install_pins.py $(VENV)/requirements.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (transformers course)" > /dev/null
	@# matplotlib's font cache, built now: otherwise a learner's first plot prints a notice on stderr
	$(BIN)/python -c "import matplotlib.font_manager" 2>/dev/null
	@touch $@

# JupyterHub's proxy, from npm at the versions autograder/hub/package-lock.json pins (npm ci), into .venv:
# the hub fetches nothing when it starts.
hub-env: env $(HUB_PROXY)  ## install JupyterHub's proxy (configurable-http-proxy, pinned) for make hub
$(HUB_PROXY): autograder/hub/package.json autograder/hub/package-lock.json
	@command -v npm > /dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm; } \
	  || { echo "JupyterHub's proxy needs Node.js 20 or later and npm: install them"; exit 1; }
	mkdir -p $(VENV)/hub-proxy
	cp autograder/hub/package.json autograder/hub/package-lock.json $(VENV)/hub-proxy/
	cd $(VENV)/hub-proxy && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# Started from autograder/ so that nbgrader's Validate button and formgrader read the course's
# nbgrader_config.py (nbgrader looks in the server's working folder). As root (a container, a cloud
# notebook) JupyterLab refuses to start without --allow-root: it is passed there, with a note.
lab: env  ## open JupyterLab on the student notebooks in course/
	@if [ "$$(id -u)" = 0 ]; then echo "note: running as root (a container?), so JupyterLab gets --allow-root"; fi
	cd autograder && ../$(BIN)/jupyter lab --notebook-dir=../course $$([ "$$(id -u)" = 0 ] && echo --allow-root) $(LAB_ARGS)

# As root: creates the roster's users, then runs the hub in the foreground (Ctrl-C stops it).
hub: hub-env  ## a JupyterHub for a class on this machine: make hub ROSTER=class.csv [RELEASE=... HUB_DIR=... HUB_PORT=...]
	$(BIN)/python -m autograder.hub up --roster "$(ROSTER)" --dir "$(HUB_DIR)" --port $(HUB_PORT) $(HUB_ARGS) $(RELEASE)

# As root, once the hub is stopped: ends the class's processes, deletes the users, groups, limits and folder
# that setup made (never a user it did not create).
hub-teardown:  ## remove the class's hub: make hub-teardown HUB_DIR=...
	$(BIN)/python -m autograder.hub teardown --dir "$(HUB_DIR)"

# Tests and grading never touch the network; `make lab` leaves HF_HUB_OFFLINE to the learner.
test check release grade grade-benchmark: export HF_HUB_OFFLINE := 1

test: env hub-env $(CHROMIUM)  ## run the whole test suite (offline)
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadgroup --durations=25

release: env  ## regenerate course/ from solutions/ with nbgrader generate_assignment
	$(BIN)/python -m autograder release

check: env  ## grade one notebook with hidden tests: make check NB=course/04_self_attention/04_self_attention.ipynb
	@test -n "$(NB)" || { echo "usage: make check NB=path/to/notebook.ipynb"; exit 2; }
	$(BIN)/python -m autograder check "$(NB)"

grade: env  ## grade a class (default: the demo class): make grade SUBMISSIONS=folder-or-lms.zip JOBS=2 | SCHEDULER=tcp://host:8786 [GRADE_DIR=...]
	$(BIN)/python -m autograder grade "$(SUBMISSIONS)" $(if $(SCHEDULER),--scheduler $(SCHEDULER),--jobs $(JOBS)) $(if $(GRADE_DIR),--course-dir "$(GRADE_DIR)")

grade-benchmark: env  ## grade the demo class serially, on a 2-process LocalCluster and on dask scheduler + 2 workers; compare, project
	$(BIN)/python -m autograder.benchmark

clean:  ## remove nbgrader's working folders (gradebook, submitted, autograded, feedback)
	rm -rf autograder/work
