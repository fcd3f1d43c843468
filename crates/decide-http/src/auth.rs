//! The API key a server requires, as `decide serve` and `decide mcp --http` read it.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// An API key, kept only as its SHA-256: a request's key is compared over its digest, so that
/// neither the key's bytes nor its length leak through the time a comparison takes.
#[derive(Clone)]
pub struct ApiKey([u8; 32]);

impl ApiKey {
    /// The key `key` (checked for emptiness by whoever reads it from the user).
    pub fn new(key: &str) -> Self {
        Self(Sha256::digest(key.as_bytes()).into())
    }

    /// Whether an `Authorization` header value carries this key as `Bearer KEY`.
    pub fn accepts(&self, authorization: Option<&str>) -> bool {
        authorization
            .and_then(bearer)
            .is_some_and(|given| bool::from(Self::new(given).0.ct_eq(&self.0)))
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

/// The key of an `Authorization: Bearer KEY` value, the scheme in any case (RFC 9110).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, key) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_read_in_any_case() {
        let key = ApiKey::new("s3cret");
        for header in ["Bearer s3cret", "bearer s3cret ", "BEARER s3cret"] {
            assert!(key.accepts(Some(header)), "{header}");
        }
        for header in ["Basic czNjcmV0", "Bearer", "Bearer s3cre", "s3cret"] {
            assert!(!key.accepts(Some(header)), "{header}");
        }
        assert!(!key.accepts(None));
    }
}
