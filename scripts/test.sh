#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite (core, adapters, plugin, e2e, server).
# Two passes: every test not marked `serial` on pytest-xdist workers ($ANYORDER_TEST_WORKERS,
# default 2, at most one per core; tests/conftest.py binds each worker's engines to its share
# of the cores), then the `serial` tests (tensor parallel, Ray: a core per rank) alone.
# Arguments go to both passes (e.g. --durations=60, or a path: tests/unit); with a -m of
# the caller's, one pass in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cores=$(nproc)
workers=${ANYORDER_TEST_WORKERS:-2}
(( workers > cores )) && workers=$cores
parallel=()
# --no-loadscope-reorder: keep the collection order (tests/conftest.py: longest modules first;
# xdist would order modules by their number of tests, which sent the one-test test_load last)
(( workers > 1 )) && parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
for arg in "$@"; do  # a marker expression of the caller's: one pass, in one process, as asked
  [[ $arg == -m* ]] && exec .venv/bin/python -m pytest -q -rs "$@"
done
status=0
# exit 5: the pass selected no test (e.g. a path without serial tests)
.venv/bin/python -m pytest -q -rs "${parallel[@]}" -m "not serial" "$@" || { rc=$?; (( rc == 5 )) || status=$rc; }
.venv/bin/python -m pytest -q -rs -m serial "$@" || { rc=$?; (( rc == 5 )) || status=$rc; }
exit $status
