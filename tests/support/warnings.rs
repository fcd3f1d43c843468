//! Captures the `tracing` warnings a unit test's code logs on its own thread. Shared by the
//! unit tests of decide-filter and decide-router (included with `#[path]`), which both check
//! that a failing decision model is logged, not hidden.

use std::io::Write;

thread_local! {
    /// Where the current thread's warnings go while [`warnings`] runs.
    static CAPTURED: std::cell::RefCell<Option<Vec<u8>>> = const { std::cell::RefCell::new(None) };
}

/// Writes into the current thread's capture, if one is open.
struct ThreadLogs;

impl Write for ThreadLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURED.with(|c| {
            if let Some(v) = c.borrow_mut().as_mut() {
                v.extend_from_slice(buf);
            }
        });
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `f` and returns the warnings it logged on this thread. One global subscriber for the
/// whole test binary: a scoped one (`with_default`) races with tests on other threads over
/// tracing's per-callsite interest cache and now and then records nothing.
pub(crate) fn warnings<T>(f: impl FnOnce() -> T) -> (T, String) {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_writer(|| ThreadLogs)
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .try_init();
    });
    CAPTURED.with(|c| *c.borrow_mut() = Some(Vec::new()));
    let out = f();
    let bytes = CAPTURED.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (out, String::from_utf8(bytes).unwrap())
}
