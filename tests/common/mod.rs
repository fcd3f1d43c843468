//! What the end-to-end tests of the `decide` binary share: running it from the repository root,
//! its output, the one-line error check, and scratch folders.
#![allow(dead_code)] // Each test binary uses its own part of this.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The repository root, where the tests run the binary (models/ and examples/ are there).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `decide` with `args` from the repository root, without a `DECIDE_MODEL` from outside.
pub fn decide(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_decide"))
        .args(args)
        .current_dir(root())
        .env_remove("DECIDE_MODEL")
        .output()
        .expect("run decide")
}

/// Runs `command` with `input` written to its standard input (a pipe, closed after the input), and
/// collects its output.
pub fn run_with_input(mut command: Command, input: &str) -> Output {
    use std::io::Write;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start decide");
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(input.as_bytes())
        .expect("write the input");
    child.wait_with_output().expect("wait for decide")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A bad input: exit code 2 and exactly one line on stderr, which must contain `needle`.
pub fn assert_one_line_error(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(needle), "{err:?} does not contain {needle:?}");
    assert!(!err.contains("panicked"), "{err}");
}

/// A scratch folder, emptied when made and removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("decide-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    /// Writes `contents` to `name` in the folder and returns its path.
    pub fn file(&self, name: &str, contents: impl AsRef<[u8]>) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, contents).unwrap();
        path.to_str().unwrap().to_string()
    }

    /// The path of `name` in the folder, not created.
    pub fn path(&self, name: &str) -> String {
        self.0.join(name).to_str().unwrap().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A Python that can `import` `modules` (packages `.ci/run` installs into `target/pydecide-venv`):
/// `$DECIDE_PYTHON`, then that venv, then `.venv`. `None` (the test says it was skipped) when none
/// can, unless `DECIDE_REQUIRE_MCP` is set; `install` says what to install.
pub fn python_with(modules: &str, install: &str) -> Option<PathBuf> {
    let candidates: Vec<PathBuf> = std::env::var_os("DECIDE_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([
            root().join("target/pydecide-venv/bin/python"),
            root().join(".venv/bin/python"),
        ])
        .collect();
    for python in candidates {
        let imports = Command::new(&python)
            .args(["-c", &format!("import {modules}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if imports {
            return Some(python);
        }
    }
    let message = format!("no Python with {modules} ({install})");
    assert!(
        std::env::var_os("DECIDE_REQUIRE_MCP").is_none(),
        "{message}"
    );
    eprintln!("skipped: {message}");
    None
}

/// Runs the Python script `script` (relative to the repository root, run from there) with `args`;
/// its standard output, after checking that it succeeded.
pub fn run_python(python: &Path, script: &str, args: &[&str]) -> String {
    let output = Command::new(python)
        .arg(root().join(script))
        .args(args)
        .current_dir(root())
        .env_remove("DECIDE_MODEL")
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{script}: {stdout}\n{stderr}");
    stdout
}
