#!/usr/bin/env bash
# The Python package's tests, for CI after `models/fetch` and `cargo test --workspace`, from the
# repository root: builds the wheel in the dev profile into target/ (so it reuses the dependencies
# `cargo test --workspace` compiled, candle included, instead of a release build's ten minutes),
# installs it into target/python-venv with the pinned test requirements, and runs pytest.
set -euo pipefail

crate=crates/decide-python
venv=target/python-venv
wheels=target/python-wheels

if [ ! -f "$crate/Cargo.toml" ]; then
  echo "ci.sh: run from the repository root" >&2
  exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$crate/requirements-test.txt"

# Same target folder and profile as `cargo test`: only pyo3 and this crate are compiled here.
export CARGO_TARGET_DIR="$PWD/target"
rm -rf "$wheels"
"$venv/bin/maturin" build --profile dev --manifest-path "$crate/Cargo.toml" \
  --interpreter "$venv/bin/python" --out "$wheels"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheels"/decide-*.whl

# The tests compare answers and error messages with the `decide` binary `cargo test` built.
export DECIDE_CLI="${DECIDE_CLI:-$PWD/target/debug/decide}"
# From the tests' folder, so that `import decide` is the installed wheel, never the source tree.
# Any failure stops the script, pytest's exit code 5 (no tests collected) included.
cd "$crate/tests"
"../../../$venv/bin/python" -m pytest -q -p no:cacheprovider .
