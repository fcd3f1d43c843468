//! The checks an HTTP server on this machine makes before it reads a request, as `decide serve`
//! and `decide mcp --http` both make them: the `Host` header (DNS rebinding), the web `Origin`
//! (cross-site requests, CORS), and whether a body is declared as JSON.
//!
//! A web page can make a browser send requests to any address, loopback included. Two things
//! stop it reaching a local server: its own host name, which a rebinding attack resolves to this
//! machine, arrives in `Host` ([`check_host`]); and its origin arrives in `Origin`
//! ([`origin`]), which only pages the server names (or its own) may have.

use std::net::SocketAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// The host name of a `Host` header or an origin's authority, lower case, without the port.
pub fn host_name(authority: &str) -> Option<String> {
    let authority: http::uri::Authority = authority.parse().ok()?;
    Some(authority.host().to_ascii_lowercase())
}

/// Whether the request's `Host` names this server: a name of `allowed_hosts` (`*` accepts any),
/// a loopback name, or the `bound` IP address (unless it is unspecified, `0.0.0.0`). A request
/// without `Host` does not come from a browser (browsers always send it) and passes.
pub fn host_allowed(
    headers: &HeaderMap,
    allowed_hosts: &[String],
    bound: Option<SocketAddr>,
) -> bool {
    let Some(host) = headers.get(header::HOST) else {
        return true;
    };
    let Some(name) = host.to_str().ok().and_then(host_name) else {
        return false;
    };
    if allowed_hosts
        .iter()
        .any(|h| h == "*" || h.eq_ignore_ascii_case(&name))
    {
        return true;
    }
    // A rebinding page uses its own name, never these: they are safe whatever the bind.
    if matches!(name.as_str(), "localhost" | "127.0.0.1" | "[::1]") {
        return true;
    }
    bound.is_some_and(|addr| {
        let ip = match addr.ip() {
            std::net::IpAddr::V4(ip) => ip.to_string(),
            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        };
        !addr.ip().is_unspecified() && ip == name
    })
}

/// [`host_allowed`], or the one-line reason for the `403` that refuses the request.
pub fn check_host(
    headers: &HeaderMap,
    allowed_hosts: &[String],
    bound: Option<SocketAddr>,
) -> Result<(), String> {
    if host_allowed(headers, allowed_hosts, bound) {
        return Ok(());
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    Err(format!(
        "the host {host:?} is not this server's (see --allowed-hosts)"
    ))
}

/// What a request's `Origin` (sent by browsers on cross-site and POST requests) allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// No origin (not a browser), or the server's own origin.
    Same,
    /// An origin of `allowed_origins`: answered with CORS headers ([`cors_headers`]).
    Allowed(HeaderValue),
    /// Any other web page, `null` (a sandboxed frame, a file) included: why, in one line.
    Refused(String),
}

/// What the request's `Origin` allows, given the origins (`https://app.example`; `*` for any)
/// whose pages may call the server.
pub fn origin(headers: &HeaderMap, allowed_origins: &[String]) -> Origin {
    let Some(value) = headers.get(header::ORIGIN) else {
        return Origin::Same;
    };
    let text = value.to_str().unwrap_or_default();
    if allowed_origins
        .iter()
        .any(|o| o == "*" || o.trim_end_matches('/').eq_ignore_ascii_case(text))
    {
        return Origin::Allowed(value.clone());
    }
    let own = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let theirs = text.split_once("://").map(|(_, authority)| authority);
    match (own, theirs) {
        (Some(own), Some(theirs)) if own.eq_ignore_ascii_case(theirs) => Origin::Same,
        _ => Origin::Refused(format!(
            "requests from the web origin {text:?} are not allowed (see --allowed-origins)"
        )),
    }
}

/// Whether a body is declared as JSON (`application/json`, parameters allowed).
pub fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// The headers of an answer to an allowed origin: `Access-Control-Allow-Origin` and `Vary`.
pub fn cors_headers(origin: HeaderValue) -> [(HeaderName, HeaderValue); 2] {
    [
        (header::ACCESS_CONTROL_ALLOW_ORIGIN, origin),
        (header::VARY, HeaderValue::from_static("Origin")),
    ]
}

/// The headers of the `204` answering a CORS preflight from an allowed origin: the methods and
/// request headers it may use (comma-separated lists), cached for ten minutes.
pub fn preflight_headers(
    origin: HeaderValue,
    methods: &'static str,
    allow_headers: &'static str,
) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static(methods),
    );
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(allow_headers),
    );
    headers.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    headers.insert(header::VARY, HeaderValue::from_static("Origin"));
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn only_this_servers_names_pass_the_host_check() {
        let bound: SocketAddr = "192.168.1.5:8080".parse().unwrap();
        let ok = |host: &str, allowed: &[&str]| {
            let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
            host_allowed(&headers(&[("host", host)]), &allowed, Some(bound))
        };
        assert!(ok("localhost:8080", &[]));
        assert!(ok("127.0.0.1", &[]));
        assert!(ok("[::1]:8080", &[]));
        assert!(ok("192.168.1.5:8080", &[]));
        assert!(ok("Box.Example:8080", &["box.example"]));
        assert!(ok("anything", &["*"]));
        assert!(!ok("evil.example:8080", &[]));
        assert!(!ok("not a host", &[]));
        assert!(host_allowed(&HeaderMap::new(), &[], None));
        let unspecified: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert!(!host_allowed(
            &headers(&[("host", "0.0.0.0:8080")]),
            &[],
            Some(unspecified)
        ));
        assert_eq!(
            check_host(&headers(&[("host", "evil.example")]), &[], None).unwrap_err(),
            "the host \"evil.example\" is not this server's (see --allowed-hosts)"
        );
    }

    #[test]
    fn only_the_own_and_the_allowed_origins_pass() {
        let allowed = vec!["https://app.example/".to_string()];
        let of = |pairs: &[(&str, &str)]| origin(&headers(pairs), &allowed);
        assert_eq!(of(&[("host", "127.0.0.1:1")]), Origin::Same);
        assert_eq!(
            of(&[("host", "127.0.0.1:1"), ("origin", "http://127.0.0.1:1")]),
            Origin::Same
        );
        assert_eq!(
            of(&[("origin", "https://app.example")]),
            Origin::Allowed(HeaderValue::from_static("https://app.example"))
        );
        for evil in ["https://evil.example", "null", "http://127.0.0.1:2"] {
            let Origin::Refused(why) = of(&[("host", "127.0.0.1:1"), ("origin", evil)]) else {
                panic!("{evil} passed");
            };
            assert!(why.contains(evil), "{why}");
        }
        assert!(matches!(
            origin(&headers(&[("origin", "null")]), &["*".to_string()]),
            Origin::Allowed(_)
        ));
    }
}
