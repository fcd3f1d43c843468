//! The native part of the `decide` Python package, `decide._native`: the local engine behind
//! the tool filter, the router, embeddings and reranking, called with the interpreter detached so
//! that one loaded model serves many Python threads at once.
//!
//! The Python layer (`python/decide/`) turns LangChain and MCP objects into the JSON shapes these
//! functions read and wraps their answers in typed results; `decide select`, `decide route` and
//! `decide serve` read the same shapes through the same parsers, so inputs are refused in the same
//! words.

mod convert;
mod decider;

use pyo3::prelude::*;

pyo3::create_exception!(
    decide,
    DecideError,
    pyo3::exceptions::PyValueError,
    "A decision could not be made: bad input, a model that cannot be loaded, or a model that failed. The message is the one line `decide` prints."
);

/// The native module; `decide` re-exports what users need.
#[pymodule(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<decider::Decider>()?;
    m.add("DecideError", m.py().get_type::<DecideError>())?;
    m.add("DEFAULT_MODEL", decide_engine::DEFAULT_MODEL)?;
    m.add("BM25_MODEL", decide_engine::BM25_MODEL_NAME)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
