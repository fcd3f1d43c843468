//! What the end-to-end tests of the `decide` binary share: running it from the repository root,
//! its output, the one-line error check, and scratch folders.
#![allow(dead_code)] // Each test binary uses its own part of this.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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
